#!/usr/bin/env python3
"""gradops' CUDA kernels against PyTorch's own backward ops: same tensors, same stream, same GPU, same run.

Usage: bench/gpu_bench.py --lib build/gpu/libgradops.so [--out out/gpu] [--dtypes f32,bf16,f16]
       [--families elementwise,bias_gelu,softmax,forward,softmax_axis,layer_norm,batch_norm] [--repeats 30] [--quick]
       [--ops LayerNormalizationGrad,...] [--shapes 8x32768x128,...] [--axis-shapes 64x8192x64,...]
       bench/gpu_bench.py --table out/gpu/gpu_bench.json   (the table of a saved run, no GPU needed)

For every case the inputs go to both sides; the outputs are compared first (a disagreement beyond the
dtype's tolerance marks the case FAILED and it is not timed). Then the two sides are timed in
alternation with CUDA events (median of --repeats runs each, the order swapped every run so that drift
falls on both), with the L2 flushed (a 256 MiB write) before every run and a short spin kernel queued
ahead of the timed call, so that the host's launch cost stays out of the interval.
A device-to-device copy, timed the same way, gives the bandwidth reference. Bytes model: each input
read once, each output written once. Writes gpu_bench.json and, where matplotlib is available,
gpu_bench.png into --out, and prints a table: time, GB/s, share of copy bandwidth, share of a copy of
the same byte count (what the method leaves at that size: launch, ramp and drain, and the write-back
of the flush's dirty lines weigh more on small cases), ratio to PyTorch (> 1: gradops is faster)
and each case's mark against the docs/performance.md targets: pass, tie (a ratio target of 1.0 met
only in that 1.0 lies inside the 10th-90th percentile spread of the per-run ratios) or miss. Cases
under 64 MB are held to the copy of their own byte count, larger ones to the large copy.
"""
import argparse
import collections
import json
import math
import os
import statistics
import struct
import sys

try:
    import torch
except ImportError:  # --table reads a saved run and needs no torch
    torch = None


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


if torch is not None:
    aten = torch.ops.aten
    DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64}
    # Normwise relative disagreement allowed between gradops and PyTorch (both round once to the dtype;
    # f32 differs in the math library and the summation order).
    AGREE = {torch.float32: 2e-5, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

ELEMENTWISE_N = 1 << 26
BIAS_SHAPES = [(16384, 4096), (8192, 3072), (4096, 16384)]
SOFTMAX_SHAPES = [(65536, 128), (32768, 512), (16384, 1024), (8192, 4096), (2048, 32768), (512, 131072),
                  (8192, 50257)]
# The softmax family on axis 1 of [outer, axis, inner]: inner 2 to 4096, axes 16 to 32768, 2^25
# elements (64 MB a tensor in 16-bit, 128 MB in f32).
SOFTMAX_AXIS_SHAPES = [(512, 16, 4096), (64, 128, 4096), (341, 1000, 96), (2048, 2048, 8), (8192, 1024, 4),
                       (11000, 1000, 3), (512, 32768, 2), (64, 8192, 64), (8, 32768, 128)]
# LayerNorm family: (shape, the share of copy bandwidth its gradients are held to). 229x541 (about
# 1 MB) is launch-bound and held to its same-size copy instead; 648720x128 is a per-head norm.
# Cases that move fewer bytes than this are held to a copy of their own size (the small-case rule).
SMALL_BYTES = 64 << 20

LAYER_NORM_SHAPES = [((32768, 768), 0.85), ((16384, 1024), 0.90), ((8192, 1600), 0.90), ((8192, 4096), 0.90),
                     ((4096, 8192), 0.90), ((2048, 16384), 0.90), ((1024, 65536), 0.85), ((512, 131072), 0.85),
                     ((229, 541), 0.0),
                     ((648720, 128), 0.85)]

# BatchNorm: ResNet-50's layer shapes (C, H, W) at N = 32.
BATCH_NORM_N = 32
BATCH_NORM_SHAPES = [(64, 112, 112), (64, 56, 56), (256, 56, 56), (128, 28, 28), (512, 28, 28), (256, 14, 14),
                     (1024, 14, 14), (512, 7, 7), (2048, 7, 7)]
# Inputs (X, and dY for the gradient) of at most this many bytes stay in the H100's 50 MB L2 from
# the reduction to the elementwise pass: such cases are held to 0.70 of copy; larger ones read them
# twice, and are held to 0.90 of the two-pass bound (grad: 5 tensor transfers where the bytes model
# counts 3; forward: 3 where it counts 2).
BATCH_NORM_L2_BYTES = 40 << 20


def randn(shape, dtype, scale=1.0):
    return (torch.randn(shape, device="cuda", dtype=torch.float32) * scale).to(dtype)


def f32(v):
    """v rounded to float32. ORT's attributes are FLOATs: gradops computes with their f32 value in
    every dtype, so PyTorch is given that value too (a difference only f64 shows)."""
    return struct.unpack("f", struct.pack("f", v))[0]


def quick_gelu_backward(dy, x, alpha=f32(1.702)):
    """The eager composite a PyTorch user writes for QuickGelu's gradient (no native op exists)."""
    s = torch.sigmoid(alpha * x)
    return dy * s * (1 + alpha * x * (1 - s))


# ---- cases: each builds its tensors and returns the two sides ------------------------------------

def elementwise_case(op, kind, torch_fn, target):
    def build(dtype):
        n = ELEMENTWISE_N
        dy, x = randn((n,), dtype), randn((n,), dtype, 2.0)
        second = {"x": x, "sigmoid": torch.sigmoid(x), "tanh": torch.tanh(x),
                  "leaky": torch.nn.functional.leaky_relu(x, 0.01)}[kind]
        dx = torch.empty_like(dy)
        return dict(ins=[dy, second], outs=[dx], attrs={}, torch=lambda: torch_fn(dy, second),
                    check=[(dx, None)], nbytes=3 * n * dy.element_size(), shape=[n])
    return dict(family="elementwise", op=op, build=build, target=target)


def bias_gelu_case(op, approximate, shape, with_db, target):
    def build(dtype):
        rows, cols = shape
        dy, x, b = randn(shape, dtype), randn(shape, dtype, 2.0), randn((cols,), dtype)
        dx = torch.empty_like(dy)
        db = torch.empty_like(b) if with_db else None
        es = dy.element_size()
        if with_db:
            def peer():
                g = aten.gelu_backward(dy, x + b, approximate=approximate)
                return g, g.sum(0)
        else:
            def peer():
                return aten.gelu_backward(dy, x + b, approximate=approximate)
        return dict(ins=[dy, x, b], outs=[dx, db] if with_db else [dx], attrs={}, torch=peer,
                    check=[(dx, 0), (db, 1)] if with_db else [(dx, None)],
                    nbytes=(3 * rows * cols + (2 if with_db else 1) * cols) * es, shape=list(shape))
    name = op + (" +dB" if with_db else "")
    return dict(family="bias_gelu", op=op, name=name, build=build, target=target, shape=list(shape))


def softmax_case(op, log, shape, target, axis=-1, family="softmax"):
    def build(dtype):
        dy = randn(shape, dtype)
        logits = randn(shape, torch.float32, 2.0)
        y = (torch.log_softmax(logits, axis) if log else torch.softmax(logits, axis)).to(dtype)
        dx = torch.empty_like(dy)
        fn = aten._log_softmax_backward_data if log else aten._softmax_backward_data
        return dict(ins=[dy, y], outs=[dx], attrs={"axis": axis}, torch=lambda: fn(dy, y, axis, dtype),
                    check=[(dx, None)], nbytes=3 * dy.numel() * dy.element_size(), shape=list(shape))
    return dict(family=family, op=op, build=build, target=target, shape=list(shape))


def forward_case(op, shape, torch_fn, target, attrs=None, family="forward"):
    def build(dtype):
        x = randn(shape, dtype, 2.0)
        y = torch.empty_like(x)
        return dict(ins=[x], outs=[y], attrs=attrs or {}, torch=lambda: torch_fn(x), check=[(y, None)],
                    nbytes=2 * x.numel() * x.element_size(), shape=list(shape))
    return dict(family=family, op=op, build=build, target=target, shape=list(shape))


def layer_norm_case(op, shape, target):
    """LayerNorm family against PyTorch's native_layer_norm_backward / _fused_rms_norm_backward (the
    autograd of F.rms_norm where that op is absent) and their forwards. Statistics are [rows, 1],
    f32 for every dtype but f64 (f64 there), as PyTorch keeps them; the invertible gradient (no
    PyTorch op) is held against native_layer_norm_backward on the same problem."""
    rows, cols = shape

    def build(dtype):
        x = randn(shape, dtype, 2.0)
        w = (1 + 0.25 * torch.randn(cols, device="cuda")).to(dtype)
        b = randn((cols,), dtype)
        es = x.element_size()
        eps = 1e-5
        st = torch.float64 if dtype == torch.float64 else torch.float32  # the statistics' type
        ss = torch.finfo(st).bits // 8
        if op in ("LayerNormalization", "SimplifiedLayerNormalization"):
            y = torch.empty_like(x)
            inv = torch.empty((rows, 1), device="cuda", dtype=st)
            if op == "LayerNormalization":
                mean = torch.empty_like(inv)
                peer = lambda: aten.native_layer_norm(x, [cols], w, b, eps)  # noqa: E731
                return dict(ins=[x, w, b], outs=[y, mean, inv], attrs={"axis": -1, "epsilon": eps}, torch=peer,
                            check=[(y, 0), (mean, 1), (inv, 2)], nbytes=(2 * rows * cols + 2 * cols) * es + 2 * ss * rows,
                            shape=list(shape))
            if hasattr(aten, "_fused_rms_norm"):
                peer = lambda: aten._fused_rms_norm(x, [cols], w, eps)  # noqa: E731
            else:
                peer = lambda: (torch.nn.functional.rms_norm(x, [cols], w, eps), None)  # noqa: E731
            return dict(ins=[x, w], outs=[y, inv], attrs={"axis": -1, "epsilon": eps}, torch=peer,
                        check=[(y, 0)], nbytes=(2 * rows * cols + cols) * es + ss * rows, shape=list(shape))
        dy = randn(shape, dtype)
        dx = torch.empty_like(x)
        dw, db = torch.empty_like(w), torch.empty_like(b)
        if op == "SimplifiedLayerNormalizationGrad":
            xf = x.to(st)
            rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            if hasattr(aten, "_fused_rms_norm_backward"):
                peer = lambda: aten._fused_rms_norm_backward(dy, x, [cols], rstd, w, [True, True])  # noqa: E731
            else:
                xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
                yg = torch.nn.functional.rms_norm(xg, [cols], wg, eps)
                peer = lambda: torch.autograd.grad(yg, (xg, wg), dy, retain_graph=True)  # noqa: E731
            return dict(ins=[dy, x, w, rstd], outs=[dx, dw], attrs={"axis": -1}, torch=peer,
                        check=[(dx, 0), (dw, 1)], nbytes=(3 * rows * cols + 2 * cols) * es + ss * rows,
                        shape=list(shape))
        _, mean, rstd = aten.native_layer_norm(x, [cols], w, b, eps)
        peer = lambda: aten.native_layer_norm_backward(dy, x, [cols], mean, rstd, w, b, [True, True, True])  # noqa: E731
        if op == "LayerNormalizationGrad":
            return dict(ins=[dy, x, w, mean, rstd], outs=[dx, dw, db], attrs={"axis": -1}, torch=peer,
                        check=[(dx, 0), (dw, 1), (db, 2)], nbytes=(3 * rows * cols + 3 * cols) * es + 2 * ss * rows,
                        shape=list(shape))
        # Invertible: from the forward output y = (x - mean) rstd w + b.
        y = ((x.to(st) - mean) * rstd * w.to(st) + b.to(st)).to(dtype)
        return dict(ins=[dy, y, w, b, rstd], outs=[dx, dw, db], attrs={"axis": -1}, torch=peer,
                    check=[(dx, 0), (dw, 1), (db, 2)], nbytes=(3 * rows * cols + 4 * cols) * es + ss * rows,
                    shape=list(shape))

    fwd = op in ("LayerNormalization", "SimplifiedLayerNormalization")
    return dict(family="layer_norm", op=op, build=build, shape=list(shape),
                target=(0.90 if fwd and target else target, 1.0), grad=not fwd)


def batch_norm_case(op, chw, channels_last):
    """BatchNorm against both of PyTorch's CUDA kernels, each timed against gradops in its own
    alternation: native_batch_norm(_backward) (PyTorch's own kernels) and cudnn_batch_norm(_backward)
    (where cuDNN takes the dtype). Channels-last cases give PyTorch NCHW-shaped tensors in the
    channels_last memory format and gradops the same memory as NHWC. The ratio is to the faster peer."""
    c, h, w = chw
    n = BATCH_NORM_N
    grad = op == "BatchNormalizationGrad"

    def build(dtype):
        shape = (n, h, w, c) if channels_last else (n, c, h, w)
        x = randn(shape, dtype, 2.0)
        xt = x.permute(0, 3, 1, 2) if channels_last else x  # NCHW-shaped, channels_last strides
        # gradops' scale and bias in T1 of a signature it has ((bf16, bf16, f32), (f16, f16, f32),
        # (f64, f64, f64)); PyTorch's in f32, as mixed-precision training keeps them, f64 for f64.
        stat = torch.float64 if dtype == torch.float64 else torch.float32
        wdt = stat if dtype in (torch.float32, torch.float64) else dtype
        scale = (1 + 0.25 * torch.randn(c, device="cuda")).to(wdt)
        bias = randn((c,), wdt)
        es = x.element_size()
        eps = 1e-5
        attrs = {"channels_last": 1 if channels_last else 0}
        fw, fb = scale.to(stat), bias.to(stat)
        rm, rv = torch.zeros(c, device="cuda", dtype=stat), torch.ones(c, device="cuda", dtype=stat)
        if not grad:
            y = torch.empty_like(x)
            rmean, rvar = torch.zeros(c, device="cuda", dtype=stat), torch.ones(c, device="cuda", dtype=stat)
            smean, sinv = torch.empty_like(rmean), torch.empty_like(rmean)
            native = lambda: aten.native_batch_norm(xt, fw, fb, rm, rv, True, 0.1, eps)  # noqa: E731
            cudnn = lambda: aten.cudnn_batch_norm(xt, fw, fb, rm, rv, True, 0.1, eps)  # noqa: E731
            # saved_mean is not compared on its own: the means of these inputs sit near 0, where a
            # normwise relative disagreement says nothing (Y carries any error in it).
            return dict(ins=[x, scale, bias, rmean, rvar], outs=[y, rmean, rvar, smean, sinv],
                        attrs=dict(attrs, epsilon=eps, momentum=0.9, training_mode=1), torch=native, alt=cudnn,
                        check=[(y, "y"), (sinv, 2)], ref=native,
                        nbytes=2 * x.numel() * es, shape=[n, c, h, w], fits=x.numel() * es <= BATCH_NORM_L2_BYTES)
        dy = randn(shape, dtype)
        dyt = dy.permute(0, 3, 1, 2) if channels_last else dy
        _, smean, sinv = aten.native_batch_norm(xt, fw, fb, None, None, True, 0.1, eps)
        dx, ds, db = torch.empty_like(x), torch.empty_like(scale), torch.empty_like(bias)
        native = lambda: aten.native_batch_norm_backward(  # noqa: E731
            dyt, xt, fw, None, None, smean, sinv, True, eps, [True, True, True])
        try:
            _, cm, cv, reserve = aten.cudnn_batch_norm(xt, fw, fb, rm, rv, True, 0.1, eps)
            cudnn = lambda: aten.cudnn_batch_norm_backward(xt, dyt, fw, rm, rv, cm, cv, eps, reserve)  # noqa: E731
        except RuntimeError:  # no cuDNN kernel for this dtype or layout: one peer
            cudnn = None

        return dict(ins=[dy, x, scale, smean.to(stat), sinv.to(stat)], outs=[dx, ds, db],
                    attrs=dict(attrs, epsilon=eps), torch=native, alt=cudnn,
                    check=[(dx, "dx"), (ds, 1), (db, 2)], ref=native, nbytes=3 * x.numel() * es,
                    shape=[n, c, h, w], fits=2 * x.numel() * es <= BATCH_NORM_L2_BYTES)

    name = op + (" NHWC" if channels_last else " NCHW")
    return dict(family="batch_norm", op=op, name=name, build=build, target=(0.0, 2.0 if grad else 1.0),
                channels_last=channels_last, shape=[n, c, h, w])


def cases(axis_shapes=SOFTMAX_AXIS_SHAPES):
    # Targets (docs/performance.md): minimum share of copy bandwidth, minimum ratio to PyTorch.
    ew, bias, bias_db = (0.97, 1.0), (0.93, 1.7), (0.93, 2.0)
    sm, lsm = (0.85, 1.0), (0.85, 1.0)  # plus geomeans: 1.8 (softmax grad), 1.1 (log-softmax grad)
    out = [
        elementwise_case("GeluGrad", "x", lambda dy, x: aten.gelu_backward(dy, x, approximate="none"), ew),
        elementwise_case("FastGeluGrad", "x", lambda dy, x: aten.gelu_backward(dy, x, approximate="tanh"), ew),
        elementwise_case("ReluGrad", "x", lambda dy, x: aten.threshold_backward(dy, x, 0), ew),
        elementwise_case("SigmoidGrad", "sigmoid", lambda dy, y: aten.sigmoid_backward(dy, y), ew),
        elementwise_case("TanhGrad", "tanh", lambda dy, y: aten.tanh_backward(dy, y), ew),
        elementwise_case("LeakyReluGrad", "leaky", lambda dy, y: aten.leaky_relu_backward(dy, y, f32(0.01), True), ew),
        elementwise_case("QuickGeluGrad", "x", quick_gelu_backward, (0.97, 2.0)),
    ]
    for shape in BIAS_SHAPES:
        for op, approx in (("BiasGeluGrad_dX", "none"), ("BiasFastGeluGrad_dX", "tanh")):
            out.append(bias_gelu_case(op, approx, shape, False, bias))
            out.append(bias_gelu_case(op, approx, shape, True, bias_db))
    for shape in SOFTMAX_SHAPES:
        out.append(softmax_case("SoftmaxGrad_13", False, shape, sm))
        out.append(softmax_case("LogSoftmaxGrad_13", True, shape, lsm))
    fwd = (0.85, 1.0)
    out.append(forward_case("Gelu", (ELEMENTWISE_N,), lambda x: torch.nn.functional.gelu(x), (0.97, 1.0)))
    out.append(forward_case("Sigmoid", (ELEMENTWISE_N,), torch.sigmoid, (0.97, 1.0)))
    for shape in SOFTMAX_SHAPES:
        out.append(forward_case("Softmax_13", shape, lambda x: torch.softmax(x, -1), fwd, {"axis": -1}))
        out.append(forward_case("LogSoftmax_13", shape, lambda x: torch.log_softmax(x, -1), fwd, {"axis": -1}))
    for shape in axis_shapes:
        # A middle axis: 0.85 of copy where inner (the last dim) is 8 or more, 0.70 below, where a
        # warp's loads of one axis step span fewer than 8 elements.
        t = (0.85 if shape[-1] >= 8 else 0.70, 1.0)
        out.append(softmax_case("SoftmaxGrad_13", False, shape, t, 1, "softmax_axis"))
        out.append(softmax_case("LogSoftmaxGrad_13", True, shape, t, 1, "softmax_axis"))
        out.append(forward_case("Softmax_13", shape, lambda x: torch.softmax(x, 1), t, {"axis": 1}, "softmax_axis"))
        out.append(forward_case("LogSoftmax_13", shape, lambda x: torch.log_softmax(x, 1), t, {"axis": 1},
                                "softmax_axis"))
    for op in ("LayerNormalizationGrad", "SimplifiedLayerNormalizationGrad", "InvertibleLayerNormalizationGrad",
               "LayerNormalization", "SimplifiedLayerNormalization"):
        for shape, share in LAYER_NORM_SHAPES:
            out.append(layer_norm_case(op, shape, share))
    for op in ("BatchNormalizationGrad", "BatchNormInternal"):
        for last in (False, True):
            for chw in BATCH_NORM_SHAPES:
                out.append(batch_norm_case(op, chw, last))
    return out


# ---- timing ------------------------------------------------------------------------------------

class Timer:
    def __init__(self, repeats):
        self.repeats = repeats
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")

    def settle(self):
        """What runs ahead of every timed call."""
        self.flush.zero_()          # evict the inputs from L2
        torch.cuda._sleep(200_000)  # keeps the GPU busy while the host queues the timed call

    def _timed(self, fn):
        self.settle()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        return start, end

    def median_ms(self, fn):
        for _ in range(3):
            fn()
        times = [self._timed(fn) for _ in range(self.repeats)]
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in times)

    def paired_ms(self, fa, fb):
        """Times fa and fb in alternation (fa first on even runs, fb first on odd ones), so that
        drift of the clocks or the memory over the case falls on both sides. Returns the two
        medians and the 10th and 90th percentiles of the per-run ratio tb / ta."""
        for _ in range(3):
            fa()
            fb()
        ta, tb = [], []
        for i in range(self.repeats):
            for fn, out in ((fa, ta), (fb, tb)) if i % 2 == 0 else ((fb, tb), (fa, ta)):
                out.append(self._timed(fn))
        torch.cuda.synchronize()
        ta = [s.elapsed_time(e) for s, e in ta]
        tb = [s.elapsed_time(e) for s, e in tb]
        ratios = sorted(b / a for a, b in zip(ta, tb))
        deciles = statistics.quantiles(ratios, n=10) if len(ratios) > 1 else ratios * 9
        return statistics.median(ta), statistics.median(tb), deciles[0], deciles[8]


def copy_bandwidth(timer):
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    ms = timer.median_ms(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3) / 1e9  # bytes read + written


class SameSizeCopy:
    """A device-to-device copy moving as many bytes (read + written) as a case, timed the same way:
    what the timing method leaves of the bandwidth at that size (the launch, the ramp at the start
    and the drain at the end, and the write-back of the flush's dirty lines that the case's reads
    evict, weigh more on small cases). Cases of 2 GB and more use the large copy's figure."""

    def __init__(self, timer, copy_gbs):
        self.timer, self.copy_gbs, self.cache = timer, copy_gbs, {}
        self.src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_(0, 255)
        self.dst = torch.empty_like(self.src)

    def gbs(self, nbytes):
        half = nbytes // 2
        if half >= self.src.numel():
            return self.copy_gbs
        if half not in self.cache:
            s, d = self.src[:half], self.dst[:half]
            self.cache[half] = 2 * half / (self.timer.median_ms(lambda: d.copy_(s)) * 1e-3) / 1e9
        return self.cache[half]


def disagreement(ours, ref):
    ours, ref = ours.double(), ref.double()
    if not torch.isfinite(ours).all():
        return math.inf
    return ((ours - ref).norm() / max(ref.norm().item(), 1e-300)).item()


def run_case(case, dtype, gradops, timer, copy_gbs, same_size):
    c = case["build"](dtype)
    stream = torch.cuda.current_stream().cuda_stream
    call = prepare(gradops, case["op"], c["ins"], c["outs"], c["attrs"], stream=stream)
    row = dict(family=case["family"], op=case.get("name", case["op"]), dtype=str(dtype).replace("torch.", ""),
               shape=c["shape"], bytes=c["nbytes"], target_share=case["target"][0],
               target_ratio=case["target"][1])
    row["impl"] = implementation_name(gradops, case["op"], c["ins"], c["outs"], c["attrs"])
    inputs = {t.data_ptr() for t in c["ins"] if t is not None}
    for t in c["outs"]:
        if t is not None and t.data_ptr() not in inputs:  # not an in-place output (running stats)
            t.fill_(float("nan"))  # poisoned: every element must be written
    call()
    ref = c["ref"]() if "ref" in c else c["torch"]()
    torch.cuda.synchronize()
    worst = 0.0
    for out, idx in c["check"]:
        if isinstance(idx, str):  # BatchNorm: the output in PyTorch's layout is ref[0]
            out, idx = ref[0], None
            ours = c["outs"][0]
            if case.get("channels_last"):
                ours = ours.permute(0, 3, 1, 2)
            worst = max(worst, disagreement(ours, out))
            continue
        worst = max(worst, disagreement(out, ref if idx is None else ref[idx]))
    row["disagreement"] = worst
    # The invertible gradient rebuilds x-hat from y, itself rounded to the dtype; PyTorch's from x.
    agree = AGREE[dtype] * (2 if case["op"] == "InvertibleLayerNormalizationGrad" else 1)
    if not worst <= agree:
        row["status"] = "FAILED"
        return row
    row["gradops_ms"], row["torch_ms"], row["ratio_p10"], row["ratio_p90"] = timer.paired_ms(call, c["torch"])
    if c.get("alt") is not None:
        # The second peer, in its own alternation; the ratio (and its spread) is to the faster one.
        row["native_ms"] = row["torch_ms"]
        try:
            ours, alt, p10, p90 = timer.paired_ms(call, c["alt"])
            row["cudnn_ms"] = alt
            if alt < row["torch_ms"]:
                row["gradops_ms"], row["torch_ms"], row["ratio_p10"], row["ratio_p90"] = ours, alt, p10, p90
        except RuntimeError as e:  # cuDNN does not take this dtype or layout
            row["cudnn_ms"] = None
            row["cudnn_error"] = str(e).splitlines()[0]
            torch.cuda.synchronize()
    row["gradops_gbs"] = c["nbytes"] / (row["gradops_ms"] * 1e-3) / 1e9
    row["torch_gbs"] = c["nbytes"] / (row["torch_ms"] * 1e-3) / 1e9
    row["share_of_copy"] = row["gradops_gbs"] / copy_gbs
    row["same_size_copy_gbs"] = same_size.gbs(c["nbytes"])
    row["share_of_same_size_copy"] = row["gradops_gbs"] / row["same_size_copy_gbs"]
    row["ratio"] = row["torch_ms"] / row["gradops_ms"]
    share = row["share_of_copy"]
    if case["family"] == "batch_norm":
        # 0.70 of copy where X (and dY) stay in L2 between the two passes; else 0.90 of the bound
        # that reading them twice sets (grad 3/5 of copy, forward 2/3).
        grad = case["op"] == "BatchNormalizationGrad"
        row["target_share"] = 0.70 if c["fits"] else 0.90 * (3 / 5 if grad else 2 / 3)
        row["fits_l2"] = c["fits"]
        row["target_ratio"] = 1.0  # per case never slower; the gradient's geomean target is 2.0
    if c["nbytes"] < SMALL_BYTES:
        # The small-case rule (docs/performance.md): launch, ramp and drain and the write-back of the
        # L2 flush weigh on cases under 64 MB, so they are held to a copy of their own byte count
        # timed the same way: 0.95 of it, LayerNorm 0.90 (229x541, launch-bound: at most 1.5 times
        # that copy's time), BatchNorm its own share of it.
        share = row["share_of_same_size_copy"]
        row["target_on"] = "same_size_copy"
        if case["family"] == "layer_norm":
            row["target_share"] = 1 / 1.5 if row["target_share"] == 0 else 0.90
        elif case["family"] != "batch_norm":
            row["target_share"] = 0.95
    share_ok = share >= row["target_share"]
    ratio_ok = row["ratio"] >= row["target_ratio"]
    # Below a ratio target of 1 only by less than the spread of the paired runs: a tie, not a loss.
    row["tie"] = (not ratio_ok and row["target_ratio"] == 1.0 and row["ratio_p10"] <= 1.0 <= row["ratio_p90"])
    row["status"] = "pass" if share_ok and ratio_ok else "tie" if share_ok and row["tie"] else "miss"
    return row


def geomean(values):
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def print_table(rows, copy_gbs):
    print(f"\ndevice-to-device copy: {copy_gbs:.0f} GB/s (bytes read + written); copy: share of it; "
          f"@size: share of a copy of the case's own byte count, timed the same way")
    print("ratio: PyTorch's median time / gradops' (the two timed in alternation); p10-p90: the spread of "
          "the per-run ratios; a tie: below a ratio target of 1 by less than that spread")
    head = (f"{'op':<26} {'dtype':<9} {'shape':<14} {'impl':<19} {'gradops us':>10} {'GB/s':>6} {'copy':>6} "
            f"{'@size':>6} {'torch us':>9} {'ratio':>6} {'p10-p90':>10}  status")
    print(head)
    print("-" * len(head))
    for r in rows:
        shape = "x".join(str(s) for s in r["shape"])
        if r["status"] == "FAILED":
            print(f"{r['op']:<26} {r['dtype']:<9} {shape:<14} {r['impl']:<19} FAILED: disagreement "
                  f"{r['disagreement']:.2e} with PyTorch")
            continue
        print(f"{r['op']:<26} {r['dtype']:<9} {shape:<14} {r['impl']:<19} {r['gradops_ms'] * 1e3:>10.1f} "
              f"{r['gradops_gbs']:>6.0f} {r['share_of_copy']:>6.2f} {r['share_of_same_size_copy']:>6.2f} "
              f"{r['torch_ms'] * 1e3:>9.1f} "
              f"{r['ratio']:>6.2f} {r['ratio_p10']:>5.2f}-{r['ratio_p90']:<4.2f}  {r['status']}")
    timed = [r for r in rows if r["status"] != "FAILED"]
    groups = [(f"{op}", want, lambda r, op=op: r["family"] == "softmax" and r["op"] == op)
              for op, want in (("SoftmaxGrad_13", 1.8), ("LogSoftmaxGrad_13", 1.1))]
    dts = sorted({r["dtype"] for r in timed})
    groups += [(f"{op} {dt}", 2.5, lambda r, op=op, dt=dt: r["family"] == "layer_norm" and r["op"] == op and r["dtype"] == dt)
               for op in ("LayerNormalizationGrad", "SimplifiedLayerNormalizationGrad", "InvertibleLayerNormalizationGrad")
               for dt in dts]
    groups += [(f"{op} {layout} {dt} (to the faster PyTorch peer)", want,
                lambda r, op=op, layout=layout, dt=dt: r["family"] == "batch_norm" and r["op"] == f"{op} {layout}"
                and r["dtype"] == dt)
               for op, want in (("BatchNormalizationGrad", 2.0), ("BatchNormInternal", 1.0))
               for layout in ("NCHW", "NHWC") for dt in dts]
    for label, want, member in groups:
        sel = [r for r in timed if member(r)]
        if not sel:
            continue
        g = geomean([r["ratio"] for r in sel])
        # What the target allows: the geomean a kernel would reach if it moved the bytes model at the
        # speed of a copy of the same byte count on every case. Below the target, no kernel meets it.
        ceiling = geomean([r["same_size_copy_gbs"] / r["torch_gbs"] for r in sel])
        print(f"geomean ratio {label}: {g:.2f} (target >= {want}) {'pass' if g >= want else 'miss'}; "
              f"at copy speed on every case {ceiling:.2f}{'' if ceiling >= want else ': the target is out of reach'}")
    print(f"geomean ratio, all timed cases: {geomean([r['ratio'] for r in timed]):.2f}")
    count = collections.Counter(r["status"] for r in rows)
    print(f"{len(rows)} cases: {count['pass']} pass, {count['tie']} tie with PyTorch (1.0 inside the p10-p90 "
          f"spread of the per-run ratios), {count['miss']} miss their targets, {count['FAILED']} FAILED")


def plot(meta, rows, path):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not available here: no plot (the JSON has every number)")
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import plot_gpu_bench
    plot_gpu_bench.plot(dict(meta=meta, rows=rows), path)
    print(f"plot: {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", help="libgradops.so built with the CUDA backend")
    ap.add_argument("--table", metavar="JSON", help="print the table of a saved gpu_bench.json and exit (no GPU needed)")
    ap.add_argument("--out", default="out/gpu")
    ap.add_argument("--dtypes", default="f32,bf16,f16")
    ap.add_argument("--families", default="elementwise,bias_gelu,softmax,forward,softmax_axis,layer_norm,batch_norm")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="f32 and bf16 only, 10 repeats")
    ap.add_argument("--ops", default="",
                    help="only these ops (comma-separated names, or BatchNorm's with its layout: "
                         "'BatchNormInternal NHWC'; default: every op)")
    ap.add_argument("--shapes", default="",
                    help="only the bias-GELU, softmax, forward and LayerNorm cases of these shapes (comma-separated, "
                         "as 8x32768x128; default: every case)")
    ap.add_argument("--axis-shapes", default="",
                    help="the softmax_axis family on these [outer, axis, inner] shapes instead of its own "
                         "(comma-separated, as 64x8192x64; the softmax runs over the middle one)")
    args = ap.parse_args()
    axis_shapes = SOFTMAX_AXIS_SHAPES
    if args.axis_shapes:
        try:
            axis_shapes = [tuple(int(n) for n in s.split("x")) for s in args.axis_shapes.split(",")]
        except ValueError:
            axis_shapes = []
        if not axis_shapes or any(len(s) != 3 or min(s) < 1 for s in axis_shapes):
            ap.error(f"--axis-shapes: expected OUTERxAXISxINNER of positive integers, comma-separated; "
                     f"found '{args.axis_shapes}'")
    if args.table:
        with open(args.table) as f:
            saved = json.load(f)
        print_table(saved["rows"], saved["meta"]["copy_gbs"])
        return 0
    if not args.lib:
        ap.error("--lib is required to run the benchmark")
    if torch is None or not torch.cuda.is_available():
        sys.exit("gpu_bench: PyTorch sees no CUDA device")
    dtypes = ["f32", "bf16"] if args.quick else args.dtypes.split(",")
    repeats = 10 if args.quick else args.repeats
    families = set(args.families.split(","))
    gradops = load_gradops(args.lib)
    torch.manual_seed(0)
    timer = Timer(repeats)
    copy_gbs = copy_bandwidth(timer)
    same_size = SameSizeCopy(timer, copy_gbs)
    rows = []
    ops = args.ops.split(",")
    for case in cases(axis_shapes):
        if case["family"] not in families or (args.ops and case["op"] not in ops and case.get("name") not in ops):
            continue
        if (args.shapes and case["family"] in ("bias_gelu", "softmax", "forward", "layer_norm")
                and "x".join(map(str, case["shape"])) not in args.shapes.split(",")):
            continue
        for name in dtypes:
            row = run_case(case, DTYPES[name], gradops, timer, copy_gbs, same_size)
            rows.append(row)
            shown = f"{row.get('gradops_ms', float('nan')) * 1e3:.1f} us" if "gradops_ms" in row else row["status"]
            print(f"  {row['op']} {row['dtype']} {row['shape']}: {shown}", flush=True)
            torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda,
                copy_gbs=copy_gbs, repeats=repeats, l2_flush_bytes=256 << 20)
    with open(os.path.join(args.out, "gpu_bench.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    print_table(rows, copy_gbs)
    plot(meta, rows, os.path.join(args.out, "gpu_bench.png"))
    return 1 if any(r["status"] == "FAILED" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
