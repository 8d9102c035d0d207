#!/usr/bin/env python3
"""Per-call overhead of the Python package, from the Python call to the kernel launch, against the
equivalent eager PyTorch op, on a tiny tensor (the kernel's own time is negligible).

For each pair the median over --repeats runs of the mean time of --calls back-to-back calls
(on CUDA: calls queued, one synchronize at the end; tiny kernels run faster than launches queue).

    python3 bench/python_overhead.py [--device cpu|cuda] [--json out.json]
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import gradops  # noqa: E402
import gradops.torch as gt  # noqa: E402


def timed(fn, calls, repeats, sync):
    for _ in range(calls // 10 + 10):
        fn()
    sync()
    res = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        res.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(res)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--numel", type=int, default=8)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.set_num_threads(1)
    x = torch.randn(args.numel, device=dev)
    dy = torch.randn(args.numel, device=dev)
    out = torch.empty_like(x)
    w = torch.ones(args.numel, device=dev)
    b = torch.zeros(args.numel, device=dev)
    xr = x.clone().requires_grad_()
    ln_ref = torch.nn.LayerNorm(args.numel).to(dev)
    ln_ours = gt.LayerNorm(args.numel).to(dev)
    pairs = [
        ("Gelu (output allocated)", lambda: gradops.Gelu(x), lambda: F.gelu(x)),
        ("Gelu (out=)", lambda: gradops.Gelu(x, out=out), lambda: torch._C._nn.gelu(x, out=out)),
        ("GeluGrad", lambda: gradops.GeluGrad(dy, x),
         lambda: torch.ops.aten.gelu_backward(dy, x)),
        ("Softmax_13", lambda: gradops.Softmax_13(x), lambda: torch.softmax(x, -1)),
        ("LayerNormalization (3 outputs)", lambda: gradops.LayerNormalization(x, w, b),
         lambda: torch.native_layer_norm(x, (args.numel,), w, b, 1e-5)),
        ("gradops.torch.gelu, autograd", lambda: gt.gelu(xr), lambda: F.gelu(xr)),
        ("LayerNorm module, autograd", lambda: ln_ours(xr), lambda: ln_ref(xr)),
    ]
    if dev.type == "cpu":
        xn = x.numpy()
        pairs.insert(1, ("Gelu, numpy array", lambda: gradops.Gelu(xn), lambda: F.gelu(x)))
    rows = []
    print(f"per-call time on a {args.numel}-element f32 tensor, {dev}, torch {torch.__version__}, "
          f"library {gradops.library_path}")
    print(f"{'call':34s} {'gradops us':>11s} {'torch us':>9s} {'ratio':>6s}")
    for name, ours, ref in pairs:
        # Alternate to share any drift between the two.
        a, r = [], []
        for _ in range(2):
            a.append(timed(ours, args.calls, args.repeats, sync))
            r.append(timed(ref, args.calls, args.repeats, sync))
        ga, tr = min(a), min(r)
        rows.append({"call": name, "gradops_us": ga, "torch_us": tr, "ratio": ga / tr})
        print(f"{name:34s} {ga:11.2f} {tr:9.2f} {ga / tr:6.2f}")
    # The floor: one prepared gradops_run (no Python work but the ctypes call) on the same tensor.
    call, _ = gradops.prepare("Gelu", [x], out=out)
    floor = min(timed(call, args.calls, args.repeats, sync) for _ in range(2))
    print(f"{'gradops_run alone (prepared call)':34s} {floor:11.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(dev), "torch": torch.__version__, "numel": args.numel, "rows": rows,
                       "gradops_run_alone_us": floor}, f, indent=1)


if __name__ == "__main__":
    main()
