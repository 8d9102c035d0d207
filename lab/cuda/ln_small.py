#!/usr/bin/env python3
"""LayerNorm gradients on small problems (launch-bound), any shape: bench/gpu_bench.py's case,
check and timing (the library's output checked against PyTorch, then timed against it and against a
copy of the same bytes), for shapes outside the benchmark's suite.

Usage: lab/cuda/ln_small.py --lib build/libgradops.so --shapes 229x541,1024x255 [--dtypes f32,bf16]
       [--repeats 20] [--json out.json]
GRADOPS_CUDA_LN_COLUMN_BLOCKS=0 in the environment measures the partial rows and column-sum launch
instead of the column blocks.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../bench"))
import gpu_bench as gb  # noqa: E402

OPS = ["LayerNormalizationGrad", "SimplifiedLayerNormalizationGrad", "InvertibleLayerNormalizationGrad"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--shapes", required=True)
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    lib = gb.load_gradops(args.lib)
    torch.manual_seed(0)
    timer = gb.Timer(args.repeats)
    copy_gbs = gb.copy_bandwidth(timer)
    same = gb.SameSizeCopy(timer, copy_gbs)
    rows = []
    for shape in args.shapes.split(","):
        dims = tuple(int(v) for v in shape.split("x"))
        for op in OPS:
            for dt in args.dtypes.split(","):
                row = gb.run_case(gb.layer_norm_case(op, dims, 0.0), gb.DTYPES[dt], lib, timer, copy_gbs, same)
                rows.append(row)
                if "gradops_ms" in row:
                    print(f"{op:34s} {dt:5s} {shape:>10s} {row.get('impl', ''):22s} {row['gradops_ms'] * 1e3:7.1f} us  "
                          f"{1 / row['share_of_same_size_copy']:.2f}x same-size copy  {row['ratio']:.2f}x torch", flush=True)
                else:
                    print(f"{op} {dt} {shape}: {row['status']} {row.get('detail', '')}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if any(r["status"] == "FAILED" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
