#!/usr/bin/env python3
"""The bits a library writes on bench/gpu_bench.py's cases, to compare two builds of it.

    python3 lab/cuda/bits.py --lib A/libgradops.so --out a.json [--families softmax_axis] [--dtypes f32,bf16]
    python3 lab/cuda/bits.py --compare a.json b.json

A kernel change that keeps the order of every reduction must write the same bits: each case's
inputs come from a seed fixed by the case, every output is hashed (SHA-256 of its bytes), and
--compare lists the cases whose hashes differ (exit status 1 if any). One library a process: the
Python package loads one.
"""
import argparse
import hashlib
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "bench"))


def run(args):
    import torch
    import gpu_bench as gb
    lib = gb.load_gradops(args.lib)
    hashes = {}
    for i, case in enumerate(gb.cases()):
        if case["family"] not in args.families.split(","):
            continue
        for name in args.dtypes.split(","):
            torch.manual_seed(1000 + i)
            c = case["build"](gb.DTYPES[name])
            gb.prepare(lib, case["op"], c["ins"], c["outs"], c["attrs"])()
            torch.cuda.synchronize()
            h = hashlib.sha256()
            for t in c["outs"]:
                if t is not None:
                    h.update(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
            key = f"{case.get('name', case['op'])} {name} {'x'.join(map(str, c['shape']))}"
            hashes[key] = h.hexdigest()
            print(key, hashes[key][:16], flush=True)
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(hashes, f, indent=1)


def compare(a_path, b_path):
    a, b = (json.load(open(p)) for p in (a_path, b_path))
    differ = [k for k in a if k in b and a[k] != b[k]]
    for k in differ:
        print("differ:", k)
    print(f"{len([k for k in a if k in b])} cases in both, {len(differ)} differ")
    return 1 if differ else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib")
    ap.add_argument("--out", default="bits.json")
    ap.add_argument("--families", default="softmax_axis")
    ap.add_argument("--dtypes", default="f32,bf16,f16")
    ap.add_argument("--compare", nargs=2, metavar="JSON")
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
