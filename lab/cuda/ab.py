#!/usr/bin/env python3
"""Side-by-side table of bench/gpu_bench.py runs of several builds alternated in one session.

    python3 lab/cuda/ab.py DIR/1-old DIR/1-new DIR/2-old DIR/2-new ...

Each argument is a gpu_bench --out directory named ROUND-VARIANT; per case and variant, prints the
time (mean over rounds) and the share of copy of every round, then the variant's time over the
first variant's (below 1: faster).
"""
import collections
import json
import os
import sys


def main(dirs):
    runs = collections.defaultdict(lambda: collections.defaultdict(list))  # case -> variant -> rows
    variants = []
    for d in dirs:
        variant = os.path.basename(os.path.normpath(d)).split("-", 1)[1]
        if variant not in variants:
            variants.append(variant)
        with open(os.path.join(d, "gpu_bench.json")) as f:
            for r in json.load(f)["rows"]:
                if "gradops_ms" in r:
                    key = (r["op"], r["dtype"], "x".join(map(str, r["shape"])))
                    runs[key][variant].append(r)
    base = variants[0]
    print(f"{'op':<24} {'dtype':<9} {'shape':<13} " + " ".join(f"{v + ' us':>12} {'copy':>11}" for v in variants)
          + "  " + " ".join(f"{v}/{base}" for v in variants[1:]))
    for key, per in runs.items():
        us = {v: sum(r["gradops_ms"] for r in per[v]) / len(per[v]) * 1e3 for v in variants if per[v]}
        cells = []
        for v in variants:
            shares = ",".join(f"{r['share_of_copy']:.2f}" for r in per[v])
            cells.append(f"{us.get(v, float('nan')):>12.1f} {shares:>11}")
        ratios = " ".join(f"{us[v] / us[base]:>8.3f}" for v in variants[1:] if v in us and base in us)
        print(f"{key[0]:<24} {key[1]:<9} {key[2]:<13} " + " ".join(cells) + "  " + ratios)


if __name__ == "__main__":
    main(sys.argv[1:])
