#!/usr/bin/env python3
"""Per-call overhead of the Python package, from the Python call to the kernel launch, against the
equivalent eager PyTorch op, on a tiny tensor (the kernel's own time is negligible), for every op
family: the raw functions (gradops.Gelu(x), ...) and gradops.torch's layers through autograd.

Each row is the median over --repeats runs of the mean time of --calls back-to-back calls (on CUDA:
calls queued, one synchronize at the end; tiny kernels run faster than launches queue), gradops and
PyTorch alternated twice, the lower of the two kept. Where the compiled call path
(gradops._torch_call) is loaded, gradops is timed both ways: through it (the "gradops" column, and
the ratio) and with every call sent to the Python path (the "python" column). --clock cpu counts this thread's CPU time
(the default on the CPU: on a shared machine wall time also counts the time the thread waits for a
core); --clock wall counts elapsed time (the default on CUDA, where the device's queue matters).

    python3 bench/python_overhead.py [--device cpu|cuda] [--clock cpu|wall] [--json out.json]
        [--only SUBSTRING] [--gradops-path DIR]
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--device", default="cpu")
ap.add_argument("--numel", type=int, default=8)
ap.add_argument("--calls", type=int, default=10000)
ap.add_argument("--repeats", type=int, default=7)
ap.add_argument("--clock", choices=("cpu", "wall"))
ap.add_argument("--only", help="run only the rows whose name contains this")
ap.add_argument("--gradops-path",
                help="where to import gradops from (default: the installed package, else this source tree's "
                     "python/, which has no compiled call path)")
ap.add_argument("--json")
args = ap.parse_args()

if args.gradops_path:
    sys.path.insert(0, args.gradops_path)
try:
    import gradops  # noqa: E402
except ImportError:
    if args.gradops_path:
        raise
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import gradops  # noqa: E402
import gradops.torch as gt  # noqa: E402
from gradops import _call  # noqa: E402


def timed(fn, calls, repeats, sync, clock):
    for _ in range(calls // 10 + 10):
        fn()
    sync()
    res = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(calls):
            fn()
        sync()
        res.append((clock() - t0) / calls * 1e6)
    return statistics.median(res)


def pairs(dev, n):
    """(name, gradops call, PyTorch call): the same work on an n-element f32 tensor."""
    x = torch.randn(n, device=dev)
    dy = torch.randn(n, device=dev)
    out = torch.empty_like(x)
    w = torch.rand(n, device=dev) + 0.5
    b = torch.randn(n, device=dev)
    y_sm = torch.softmax(x, -1)
    y_lsm = torch.log_softmax(x, -1)
    _, mean, rstd = torch.native_layer_norm(x, (n,), w, b, 1e-5)
    try:
        _, g_mean, g_inv = gradops.LayerNormalization(x, w, b)
    except NotImplementedError:  # no LayerNorm kernel on this device: its rows report the error
        g_mean = g_inv = None
    rows = [
        # ---- activations
        ("Gelu", lambda: gradops.Gelu(x), lambda: F.gelu(x)),
        ("Gelu (out=)", lambda: gradops.Gelu(x, out=out), lambda: torch._C._nn.gelu(x, out=out)),
        ("GeluGrad", lambda: gradops.GeluGrad(dy, x), lambda: torch.ops.aten.gelu_backward(dy, x)),
        ("FastGelu (tanh)", lambda: gradops.FastGelu(x), lambda: F.gelu(x, approximate="tanh")),
        ("BiasGelu", lambda: gradops.BiasGelu(x, b), lambda: F.gelu(x + b)),
        ("QuickGelu", lambda: gradops.QuickGelu(x), lambda: x * torch.sigmoid(1.702 * x)),
        # ---- softmax
        ("Softmax_13", lambda: gradops.Softmax_13(x), lambda: torch.softmax(x, -1)),
        ("LogSoftmax_13", lambda: gradops.LogSoftmax_13(x), lambda: torch.log_softmax(x, -1)),
        ("SoftmaxGrad_13", lambda: gradops.SoftmaxGrad_13(dy, y_sm),
         lambda: torch._softmax_backward_data(dy, y_sm, -1, x.dtype)),
        ("LogSoftmaxGrad_13", lambda: gradops.LogSoftmaxGrad_13(dy, y_lsm),
         lambda: torch._log_softmax_backward_data(dy, y_lsm, -1, x.dtype)),
        # ---- LayerNorm
        ("LayerNormalization (3 outputs)", lambda: gradops.LayerNormalization(x, w, b),
         lambda: torch.native_layer_norm(x, (n,), w, b, 1e-5)),
        ("LayerNormalizationGrad", lambda: gradops.LayerNormalizationGrad(dy, x, w, g_mean, g_inv),
         lambda: torch.ops.aten.native_layer_norm_backward(dy, x, (n,), mean, rstd, w, b, [True, True, True])),
        ("SimplifiedLayerNormalization", lambda: gradops.SimplifiedLayerNormalization(x, w),
         (lambda: torch.rms_norm(x, (n,), w, 1e-5)) if hasattr(torch, "rms_norm") else
         (lambda: x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-5) * w)),
    ]
    # ---- BatchNorm (training): N = 2 rows of n/2 channels
    c = max(n // 2, 1)
    xb = torch.randn(2, c, device=dev)
    dyb = torch.randn(2, c, device=dev)
    wb, bb = torch.rand(c, device=dev) + 0.5, torch.randn(c, device=dev)
    rm, rv = torch.zeros(c, device=dev), torch.ones(c, device=dev)
    _, sm, si = torch.native_batch_norm(xb, wb, bb, rm.clone(), rv.clone(), True, 0.1, 1e-5)
    have_bn = True
    try:
        _, _, _, gm, gi = gradops.BatchNormInternal(xb, wb, bb, rm.clone(), rv.clone())
        rows += [
            ("BatchNormInternal (training)", lambda: gradops.BatchNormInternal(xb, wb, bb, rm, rv),
             lambda: torch.native_batch_norm(xb, wb, bb, rm, rv, True, 0.1, 1e-5)),
            ("BatchNormalizationGrad", lambda: gradops.BatchNormalizationGrad(dyb, xb, wb, gm, gi, epsilon=1e-5),
             lambda: torch.ops.aten.native_batch_norm_backward(dyb, xb, wb, rm, rv, sm, si, True, 1e-5,
                                                               [True, True, True])),
        ]
    except NotImplementedError as e:  # no BatchNorm kernel on this device in this build
        print(f"BatchNorm rows skipped: {e}")
        have_bn = False
    # ---- gradops.torch, autograd (inputs requiring grad: torch.autograd.Function.apply)
    xr = x.clone().requires_grad_()
    br = b.clone().requires_grad_()
    ln_ref, ln_ours = torch.nn.LayerNorm(n).to(dev), gt.LayerNorm(n).to(dev)
    rms_ours = gt.RMSNorm(n, eps=1e-5).to(dev)
    rms_ref = torch.nn.RMSNorm(n, eps=1e-5).to(dev) if hasattr(torch.nn, "RMSNorm") else None
    bn_ref, bn_ours = torch.nn.BatchNorm1d(c).to(dev), gt.BatchNorm1d(c).to(dev)
    xbr = xb.clone().requires_grad_()
    g = torch.randn(n, device=dev)
    rows += [
        ("gt.gelu, autograd", lambda: gt.gelu(xr), lambda: F.gelu(xr)),
        ("gt.bias_gelu, autograd", lambda: gt.bias_gelu(xr, br), lambda: F.gelu(xr + br)),
        ("gt.softmax, autograd", lambda: gt.softmax(xr, -1), lambda: torch.softmax(xr, -1)),
        ("gt.LayerNorm module, autograd", lambda: ln_ours(xr), lambda: ln_ref(xr)),
        ("gt.RMSNorm module, autograd", lambda: rms_ours(xr),
         (lambda: rms_ref(xr)) if rms_ref is not None else
         (lambda: xr * torch.rsqrt(xr.square().mean(-1, keepdim=True) + 1e-5) * rms_ours.weight)),
    ]
    if have_bn:
        rows.append(("gt.BatchNorm1d module, autograd", lambda: bn_ours(xbr), lambda: bn_ref(xbr)))
    rows += [
        ("gt.softmax, forward+backward", lambda: gt.softmax(xr, -1).backward(g),
         lambda: torch.softmax(xr, -1).backward(g)),
        ("gt.LayerNorm, forward+backward", lambda: ln_ours(xr).backward(g), lambda: ln_ref(xr).backward(g)),
    ]

    def no_grad(f):
        def call():
            with torch.no_grad():
                return f()
        return call
    rows += [("gt.LayerNorm module, no_grad", no_grad(lambda: ln_ours(x)), no_grad(lambda: ln_ref(x))),
             ("gt.gelu, no_grad", no_grad(lambda: gt.gelu(x)), no_grad(lambda: F.gelu(x)))]
    if dev.type == "cpu":
        xn = x.numpy()
        rows.insert(1, ("Gelu, numpy array", lambda: gradops.Gelu(xn), lambda: F.gelu(x)))
    return rows, x, out


def main():
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    clock_name = args.clock or ("wall" if dev.type == "cuda" else "cpu")
    clock = time.perf_counter if clock_name == "wall" else time.thread_time
    torch.set_num_threads(1)
    rows_in, x, out = pairs(dev, args.numel)
    rows = []
    compiled, why = gradops.torch_call()
    print(f"per-call time (us, {clock_name} clock) on a {args.numel}-element f32 tensor, {dev}, "
          f"torch {torch.__version__}, library {gradops.library_path}; compiled call path: "
          f"{'yes' if compiled else 'no'} ({why})")
    print(f"{'call':34s} {'gradops':>8s} {'python':>8s} {'torch':>8s} {'ratio':>6s}")

    fast = _call.run
    for name, ours, ref in rows_in:
        if args.only and args.only not in name:
            continue
        a, p, r = [], [], []
        try:
            for _ in range(2):  # alternated, to share any drift between them
                a.append(timed(ours, args.calls, args.repeats, sync, clock))
                if compiled:
                    _call.run = _call._run_python
                    try:
                        p.append(timed(ours, args.calls, args.repeats, sync, clock))
                    finally:
                        _call.run = fast
                r.append(timed(ref, args.calls, args.repeats, sync, clock))
        except Exception as e:  # noqa: BLE001 - reported, and the other rows still run
            print(f"{name:34s} error: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            continue
        ga, tr = min(a), min(r)
        py = min(p) if p else ga
        rows.append({"call": name, "gradops_us": ga, "python_path_us": py, "torch_us": tr, "ratio": ga / tr})
        print(f"{name:34s} {ga:8.2f} {py:8.2f} {tr:8.2f} {ga / tr:6.2f}", flush=True)
    # The floor: one prepared gradops_run (no Python work but the ctypes call) on the same tensor.
    call, _ = gradops.prepare("Gelu", [x], out=out)
    floor = min(timed(call, args.calls, args.repeats, sync, clock) for _ in range(2))
    print(f"{'gradops_run alone (prepared Gelu)':34s} {floor:8.2f}")
    if rows:
        ratios = sorted(rows, key=lambda r: r["ratio"])
        within = sum(r["ratio"] <= 1.5 for r in rows)
        median = statistics.median(r["ratio"] for r in rows)
        print(f"SUMMARY overhead {dev.type}: {within}/{len(rows)} calls within 1.5x of PyTorch; ratio median "
              f"{median:.2f}, best {ratios[0]['ratio']:.2f} ({ratios[0]['call']}), worst {ratios[-1]['ratio']:.2f} "
              f"({ratios[-1]['call']}); gradops_run alone {floor:.2f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(dev), "clock": clock_name, "torch": torch.__version__, "numel": args.numel,
                       "compiled_call_path": compiled, "rows": rows, "gradops_run_alone_us": floor}, f, indent=1)


if __name__ == "__main__":
    main()
