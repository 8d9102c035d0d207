#!/usr/bin/python3
"""gradops against PyTorch's own CPU backward ops, side by side on the same tensors and thread count.

Usage: bench/torch_cpu_compare.py --lib build/release/libgradops.so [--threads 2] [--dtype f32,bf16]
       [--scale 1.0] [--repeats 15] [--json out/torch_cpu.json]

For each op: the same inputs go to both; the outputs are compared (a disagreement beyond the
dtype's tolerance is reported and the op counts as failed); then both are timed alternately, the
median of --repeats runs each. The ratio is torch time / gradops time (> 1: gradops is faster), with
the geometric mean over ops. Works with any PyTorch >= 1.13.
"""
import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_scaling_table import case_label  # noqa: E402


def load_gradops(path):
    """The Python package (python/gradops) running the library at `path`."""
    os.environ["GRADOPS_LIBRARY"] = os.path.abspath(path)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../python"))
    import gradops
    return gradops.library


def prepare(lib, op, ins, outs, attrs, **kw):
    """A zero-argument call of `op` writing into `outs` (schema order; None: not computed)."""
    names = [o.name for o, t in zip(lib.ops[op].outputs, outs) if t is not None]
    return lib.prepare(op, ins, attrs, outputs=names, out=outs, **kw)[0]


def implementation_name(lib, op, ins, outs, attrs):
    names = [o.name for o, t in zip(lib.ops[op].outputs, outs) if t is not None]
    try:
        return lib.implementation_name(op, ins, attrs, outputs=names, out=outs)
    except (ValueError, NotImplementedError, RuntimeError) as e:  # shown where the name would be
        return "error: " + str(e)


aten = torch.ops.aten
TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}


def uniform(shape, dtype, lo=-1.0, hi=1.0):
    return (torch.rand(shape, dtype=torch.float32) * (hi - lo) + lo).to(dtype)


def first_working(*peers):
    """The first of several spellings of a PyTorch call that this PyTorch accepts: versions differ in
    the dtypes they take for saved statistics of 16-bit tensors (1.13 wants them in the tensor's
    dtype, later versions in f32)."""
    error = None
    for peer in peers:
        try:
            peer()
            return peer
        except (RuntimeError, NotImplementedError) as e:
            error = e
    raise error


def against(got, pick=lambda out: out):
    """A case's check: gradops' output `got` and the peer's (its first output if it returns several;
    `pick` puts it in got's layout), compared before timing."""
    return lambda out: (got, pick(out[0] if isinstance(out, tuple) else out))


def elementwise(op, peer, second="x", attrs=None, n=1 << 24):
    def make(dtype, scale):
        m = int(n * scale)
        dy = uniform((m,), dtype)
        x = uniform((m,), dtype, -4, 4)
        if second == "sigmoid":
            x = torch.sigmoid(x.float()).to(dtype)
        elif second == "tanh":
            x = torch.tanh(x.float()).to(dtype)
        dx = torch.empty_like(dy)
        return dict(ins=[dy, x], outs=[dx], attrs=attrs or {}, peer=lambda: peer(dy, x), check=against(dx),
                    shape=[m])
    return op, make


def bias_gelu(op, approximate, shape=(4096, 4096)):
    def make(dtype, scale):
        rows, cols = max(1, int(shape[0] * scale)), shape[1]
        dy, x, b = uniform((rows, cols), dtype), uniform((rows, cols), dtype, -4, 4), uniform((cols,), dtype)
        dx = torch.empty_like(dy)
        return dict(ins=[dy, x, b], outs=[dx], attrs={},
                    peer=lambda: aten.gelu_backward(dy, x + b, approximate=approximate), check=against(dx),
                    shape=[rows, cols])
    return op, make


def quick_gelu_composite(dy, x, alpha=1.702):
    v = x * alpha
    s = torch.sigmoid(v)
    return dy * s * (1 + v * (1 - s))


def softmax(op, log, shape=(8192, 1024), axis=-1):
    def make(dtype, scale):
        shp = (max(1, int(shape[0] * scale)),) + tuple(shape[1:])
        z = uniform(shp, torch.float32, -4, 4)
        y = (torch.log_softmax(z, axis) if log else torch.softmax(z, axis)).to(dtype)
        dy = uniform(shp, dtype)
        dx = torch.empty_like(dy)
        fn = aten._log_softmax_backward_data if log else aten._softmax_backward_data
        return dict(ins=[dy, y], outs=[dx], attrs={"axis": axis}, peer=lambda: fn(dy, y, axis, dtype),
                    check=against(dx), shape=list(shp), axis=axis)
    return op, make


def layer_norm(op, shape=(8192, 1024)):
    def make(dtype, scale):
        rows, cols = max(1, int(shape[0] * scale)), shape[1]
        x = uniform((rows, cols), dtype, -2, 3)
        w, b = uniform((cols,), dtype), uniform((cols,), dtype)
        dy = uniform((rows, cols), dtype)
        xf = x.float()
        mean = xf.mean(-1, keepdim=True)
        rstd = torch.rsqrt(xf.var(-1, unbiased=False, keepdim=True) + 1e-5)
        outs = [torch.empty_like(x), torch.empty_like(w), torch.empty_like(w)]
        if op == "SimplifiedLayerNormalizationGrad":
            rms = torch.rsqrt((xf * xf).mean(-1, keepdim=True) + 1e-5)
            ins, outs = [dy, x, w, rms], outs[:2]
        elif op == "InvertibleLayerNormalizationGrad":
            y = (((xf - mean) * rstd) * w.float() + b.float()).to(dtype)
            ins = [dy, y, w, b, rstd]
        else:
            ins = [dy, x, w, mean, rstd]
        # PyTorch's nearest op for all three: native_layer_norm_backward with every output.
        peer = first_working(
            lambda: aten.native_layer_norm_backward(dy, x, [cols], mean, rstd, w, b, [True, True, True]),
            lambda: aten.native_layer_norm_backward(dy, x, [cols], mean.to(dtype), rstd.to(dtype), w, b,
                                                    [True, True, True]))
        return dict(ins=ins, outs=outs, attrs={"axis": -1}, peer=peer, shape=[rows, cols])
    return op, make


def batch_norm(op, shape=(32, 256, 28, 28), channels_last=False):
    """BatchNorm on an NCHW `shape`, in NHWC memory where channels_last (PyTorch gets NCHW-shaped
    tensors in the channels_last memory format, gradops the same memory as NHWC)."""
    grad = op == "BatchNormalizationGrad"

    def make(dtype, scale):
        n = max(1, int(shape[0] * scale))
        _, c, h, w_ = shape
        shp = (n, h, w_, c) if channels_last else (n, c, h, w_)
        to_nchw = (lambda t: t.permute(0, 3, 1, 2)) if channels_last else (lambda t: t)
        from_nchw = (lambda t: t.permute(0, 2, 3, 1)) if channels_last else (lambda t: t)
        x = uniform(shp, dtype, -2, 3)
        xt = to_nchw(x)
        w = uniform((c,), torch.float32)
        wt = w.to(dtype)  # gradops: scale in the tensors' dtype, statistics in f32
        label = [n, h, w_, c] if channels_last else [n, c, h, w_]
        layout = "NHWC" if channels_last else "NCHW"
        attrs = {"channels_last": 1 if channels_last else 0}
        if not grad:
            b = uniform((c,), torch.float32).to(dtype)
            rmean, rvar = torch.zeros(c), torch.ones(c)
            y = torch.empty_like(x)
            outs = [y, rmean, rvar, torch.empty(c), torch.empty(c)]
            prm, prv = torch.zeros(c), torch.ones(c)
            peer = first_working(
                lambda: aten.native_batch_norm(xt, wt, b, prm, prv, True, 0.1, 1e-5),
                lambda: aten.native_batch_norm(xt, wt.float(), b.float(), prm, prv, True, 0.1, 1e-5))
            return dict(ins=[x, wt, b, rmean, rvar], outs=outs,
                        attrs=dict(attrs, epsilon=1e-5, momentum=0.9, training_mode=1), peer=peer,
                        check=against(y, from_nchw), shape=label, layout=layout)
        dy = uniform(shp, dtype)
        dyt = to_nchw(dy)
        xf = xt.float().transpose(0, 1).reshape(c, -1)
        mean = xf.mean(1)
        invstd = torch.rsqrt(xf.var(1, unbiased=False) + 1e-5)
        dx = torch.empty_like(x)
        outs = [dx, torch.empty_like(wt), torch.empty_like(wt)]
        peer = first_working(
            lambda: aten.native_batch_norm_backward(dyt, xt, wt, None, None, mean, invstd, True, 1e-5,
                                                    [True, True, True]),
            lambda: aten.native_batch_norm_backward(dyt, xt, wt.float(), None, None, mean, invstd, True, 1e-5,
                                                    [True, True, True]),
            lambda: aten.native_batch_norm_backward(dyt, xt, wt, None, None, mean.to(dtype), invstd.to(dtype),
                                                    True, 1e-5, [True, True, True]))
        return dict(ins=[dy, x, wt, mean, invstd], outs=outs, attrs=dict(attrs, epsilon=1e-5), peer=peer,
                    check=against(dx, from_nchw), shape=label, layout=layout)
    return op, make


# ResNet-50's BatchNorm layers at N = 32, the large end to the small, both layouts.
RESNET_BN = [(32, 64, 56, 56), (32, 256, 28, 28), (32, 1024, 14, 14), (32, 2048, 7, 7)]

CASES = [
    elementwise("GeluGrad", lambda dy, x: aten.gelu_backward(dy, x)),
    elementwise("FastGeluGrad", lambda dy, x: aten.gelu_backward(dy, x, approximate="tanh")),
    bias_gelu("BiasGeluGrad_dX", "none"),
    bias_gelu("BiasFastGeluGrad_dX", "tanh"),
    elementwise("ReluGrad", lambda dy, x: aten.threshold_backward(dy, x, 0)),
    elementwise("SigmoidGrad", lambda dy, y: aten.sigmoid_backward(dy, y), second="sigmoid"),
    elementwise("TanhGrad", lambda dy, y: aten.tanh_backward(dy, y), second="tanh"),
    elementwise("QuickGeluGrad", quick_gelu_composite),
    elementwise("LeakyReluGrad", lambda dy, y: aten.leaky_relu_backward(dy, y, 0.01, True), attrs={"alpha": 0.01}),
    softmax("SoftmaxGrad_13", False),
    softmax("LogSoftmaxGrad_13", True),
    # A middle axis (PyTorch's kernels take it in place too).
    softmax("SoftmaxGrad_13", False, (256, 16, 4096), 1),
    softmax("SoftmaxGrad_13", False, (256, 1000, 96), 1),
    softmax("SoftmaxGrad_13", False, (4096, 1000, 3), 1),
    softmax("LogSoftmaxGrad_13", True, (256, 1000, 96), 1),
    layer_norm("LayerNormalizationGrad"),
    layer_norm("InvertibleLayerNormalizationGrad"),
    layer_norm("SimplifiedLayerNormalizationGrad"),
] + [batch_norm(op, shape, last) for op in ("BatchNormalizationGrad", "BatchNormInternal")
     for last in (False, True) for shape in RESNET_BN]


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--dtype", default="f32,bf16")
    ap.add_argument("--scale", type=float, default=1.0, help="scales the number of rows of every shape")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3, help="independent rounds; the spread is reported")
    ap.add_argument("--op", default="", help="comma-separated ORT names")
    ap.add_argument("--json")
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    g = load_gradops(args.lib)
    wanted = set(filter(None, args.op.split(",")))
    rows = []
    print(f"torch {torch.__version__}, threads {args.threads}, {platform.processor() or platform.machine()}")
    print(f"{'op':36} {'dtype':5} {'shape':>25} {'torch ms':>9} {'gradops ms':>10} {'ratio':>6} {'spread':>13}")
    for op, make in CASES:
        if wanted and op not in wanted:
            continue
        for name in args.dtype.split(","):
            dtype = TORCH_DTYPES[name]
            try:
                c = make(dtype, args.scale)
                run = prepare(g, op, c["ins"], c["outs"], c["attrs"], num_threads=args.threads)
                run()
                peer_out = c["peer"]()
            except (RuntimeError, NotImplementedError) as e:
                print(f"{op:36} {name:5} skipped: {str(e).splitlines()[0][:80]}")
                rows.append(dict(op=op, dtype=name, status="skipped", note=str(e).splitlines()[0]))
                continue
            agree = True
            if "check" in c:  # gradops' (main) output against the peer's
                got, ref = (t.float() for t in c["check"](peer_out))
                tol = 1e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4
                err = ((got - ref).abs() / (ref.abs() + 1)).max().item()
                agree = err <= tol
            ratios, tt, tg = [], [], []
            for _ in range(args.rounds):
                t_torch = median_time(c["peer"], args.repeats)
                t_gradops = median_time(run, args.repeats)
                tt.append(t_torch)
                tg.append(t_gradops)
                ratios.append(t_torch / t_gradops)
            ratio = statistics.median(ratios)
            shape = case_label(c)
            flag = "" if agree else "  RESULTS DISAGREE"
            print(f"{op:36} {name:5} {shape:>25} {statistics.median(tt)*1e3:9.3f} {statistics.median(tg)*1e3:10.3f}"
                  f" {ratio:6.2f} {min(ratios):6.2f}-{max(ratios):5.2f}{flag}", flush=True)
            rows.append(dict(op=op, dtype=name, shape=c["shape"], axis=c.get("axis", -1), layout=c.get("layout"),
                             torch_ms=statistics.median(tt) * 1e3,
                             gradops_ms=statistics.median(tg) * 1e3, ratio=ratio, ratio_min=min(ratios),
                             ratio_max=max(ratios), status="pass" if agree else "disagree"))
    timed = [r for r in rows if "ratio" in r]
    geo = math.exp(sum(math.log(r["ratio"]) for r in timed) / len(timed)) if timed else float("nan")
    slowest = min(timed, key=lambda r: r["ratio"]) if timed else None
    print(f"geomean ratio (torch / gradops) over {len(timed)} cases: {geo:.2f}")
    if slowest:
        print(f"slowest relative to torch: {slowest['op']} {slowest['dtype']} at {slowest['ratio']:.2f}")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(dict(torch=torch.__version__, threads=args.threads, geomean=geo, cases=rows), f, indent=1)
    return 0 if all(r.get("status") == "pass" for r in timed) else 1


if __name__ == "__main__":
    sys.exit(main())
