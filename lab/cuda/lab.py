#!/usr/bin/env python3
"""Kernel lab: check, then time, tuning variants of the CUDA kernels against each other, the
library's defaults (new), the previous build (old) and PyTorch, on the same tensors in one run.

    python3 lab/cuda/lab.py --new NEW/libgradops.so --old OLD/libgradops.so --lab NEW/liblab.so \
        --out OUT [--sections probe,softmax,softmax_fwd,elementwise,bias] [--repeats 20]

Every variant's output is poisoned with NaN, computed, compared with a float64 PyTorch reference
(normwise relative error within the dtype's budget) and recomputed once more to check that the
bits repeat; only then is it timed (CUDA events, median, L2 flushed before each run, as
bench/gpu_bench.py does). Prints one line per variant and a summary of the best per case; writes
lab.json.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "bench"))
from gpu_bench import Timer, copy_bandwidth, randn  # noqa: E402

aten = torch.ops.aten
DT = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
CODE = {torch.float32: 0, torch.float16: 2, torch.bfloat16: 3}
TOL = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}  # normwise, vs float64
# Bias kernel variants: rows per batch, register bound in resident 256-thread blocks, target blocks:
# the 16-bit and f32 defaults (4 x 4 blocks a multiprocessor, 8 x 2; one wave on 132 SMs).
BIAS_VARIANTS = [(4, 4, 528), (8, 2, 264)]
# Flat kernel: packs per thread, threads per block.
FLAT_VARIANTS = [(1, 128), (1, 256), (2, 128), (2, 256), (2, 512), (4, 128), (4, 256), (4, 512)]
BIAS_SHAPES = [(16384, 4096), (4096, 16384), (8192, 3072)]
SOFTMAX_SHAPES = [(65536, 128), (32768, 512), (16384, 1024), (8192, 4096), (2048, 32768), (512, 131072),
                  (8192, 50257)]


def load_gradops(path):
    """The Python package (python/gradops) running the library at `path`."""
    os.environ["GRADOPS_LIBRARY"] = os.path.abspath(path)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../python"))
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


class ReadFlushTimer(Timer):
    """Flushes by writing 256 MB and then reading another 256 MB: L2 ends up clean, not dirty."""

    def __init__(self, repeats):
        super().__init__(repeats)
        self.other = torch.ones(64 << 20, dtype=torch.float32, device="cuda")
        self.sink = torch.empty((), dtype=torch.float32, device="cuda")

    def settle(self):
        self.flush.zero_()
        torch.sum(self.other, 0, out=self.sink)
        torch.cuda._sleep(200_000)


class LongSleepTimer(Timer):
    """As Timer, with a ten times longer spin ahead of the timed call (host launch cost hidden)."""

    def settle(self):
        self.flush.zero_()
        torch.cuda._sleep(2_000_000)


def rel_err(out, ref):
    out = out.double()
    if not torch.isfinite(out).all():
        return math.inf
    return ((out - ref).norm() / max(ref.norm().item(), 1e-300)).item()


class Lab:
    def __init__(self, args):
        self.new = load_gradops(args.new)
        self.old = sys.modules["gradops"].load(args.old) if args.old else None
        self.lab = ctypes.CDLL(os.path.abspath(args.lab))
        i64, i32, vp = ctypes.c_int64, ctypes.c_int, ctypes.c_void_p
        self.lab.lab_softmax.argtypes = [i32, i32, vp, vp, vp, i64, i64, i32, i32, i32, vp]
        self.lab.lab_flat.argtypes = [i32, i32, vp, vp, vp, i64, i32, i32, vp]
        self.lab.lab_bias.argtypes = [i32, i32, vp, vp, vp, vp, vp, i64, i64, i32, i32, i64, i32, vp]
        self.timer = Timer(args.repeats)
        self.rows = []
        self.stream = torch.cuda.current_stream().cuda_stream

    def measure(self, case, name, fn, outs, ref, nbytes, torch_ms=None, check=True):
        """Checks fn (poisoned outputs vs ref, then repeatability), then times it."""
        row = dict(case=case, variant=name)
        if check:
            for o in outs:
                o.fill_(float("nan"))
            try:
                fn()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                row.update(status=f"ERROR {e}")
                print(f"  {name:<34} ERROR {e}", flush=True)
                self.rows.append(row)
                return row
            errs = [rel_err(o, r) for o, r in zip(outs, ref)]
            first = [o.clone() for o in outs]
            fn()
            torch.cuda.synchronize()
            same = all(torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a.view(torch.int32),
                                   b.view(torch.uint8) if b.dtype != torch.float32 else b.view(torch.int32))
                       for a, b in zip(first, outs))
            tol = TOL[outs[0].dtype]
            row.update(err=max(errs), repeatable=same)
            if not (max(errs) <= tol and same):
                row.update(status="FAILED")
                print(f"  {name:<34} FAILED err {max(errs):.2e} (tol {tol:.0e}) repeatable {same}", flush=True)
                self.rows.append(row)
                return row
        ms = self.timer.median_ms(fn)
        row.update(status="ok", us=ms * 1e3, gbs=nbytes / (ms * 1e-3) / 1e9)
        row["copy"] = row["gbs"] / self.copy_gbs
        if torch_ms:
            row["ratio"] = torch_ms / ms
        print(f"  {name:<34} {row['us']:9.1f} us {row['gbs']:6.0f} GB/s copy {row['copy']:.3f}"
              + (f"  x torch {row['ratio']:.2f}" if torch_ms else "")
              + (f"  err {row['err']:.1e}" if "err" in row else ""), flush=True)
        self.rows.append(row)
        return row

    def time_torch(self, case, fn, nbytes):
        ms = self.timer.median_ms(fn)
        row = dict(case=case, variant="torch", status="ok", us=ms * 1e3, gbs=nbytes / (ms * 1e-3) / 1e9)
        row["copy"] = row["gbs"] / self.copy_gbs
        print(f"  {'torch':<34} {row['us']:9.1f} us {row['gbs']:6.0f} GB/s copy {row['copy']:.3f}", flush=True)
        self.rows.append(row)
        return ms

    # ---- sections ---------------------------------------------------------------------------------

    def probe(self):
        """How the flush and the spin affect short kernels; the LogSoftmaxGrad 16384x1024 anomaly."""
        print("== probe: timer variants", flush=True)
        timers = {"zero-flush": self.timer, "read-flush": ReadFlushTimer(self.timer.repeats),
                  "long-sleep": LongSleepTimer(self.timer.repeats)}
        src = torch.empty(25 << 20, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        cases = [("copy 25MB", lambda: dst.copy_(src), 2 * src.numel())]
        lib = self.old or self.new
        for shape, dt, log in (((65536, 128), torch.bfloat16, False), ((16384, 1024), torch.float32, True),
                               ((16384, 1024), torch.float16, True), ((16384, 1024), torch.bfloat16, True)):
            dy = randn(shape, dt)
            y = (torch.log_softmax(randn(shape, torch.float32, 2.0), -1) if log
                 else torch.softmax(randn(shape, torch.float32, 2.0), -1)).to(dt)
            dx = torch.empty_like(dy)
            op = "LogSoftmaxGrad_13" if log else "SoftmaxGrad_13"
            call = prepare(lib, op, [dy, y], [dx], {"axis": -1}, stream=self.stream)
            fn = aten._log_softmax_backward_data if log else aten._softmax_backward_data
            nb = 3 * dy.numel() * dy.element_size()
            cases.append((f"old {op} {dt} {shape}", call, nb))
            cases.append((f"torch {op} {dt} {shape}", (lambda f=fn, a=dy, b=y, t=dt: f(a, b, -1, t)), nb))
        for name, fn, nb in cases:
            line = f"  {name:<52}"
            for tname, t in timers.items():
                ms = statistics.median([t.median_ms(fn) for _ in range(2)])
                line += f" {tname} {ms * 1e3:8.1f} us ({nb / (ms * 1e-3) / 1e9 / self.copy_gbs:.2f})"
                self.rows.append(dict(case="probe " + name, variant=tname, us=ms * 1e3, status="ok",
                                      copy=nb / (ms * 1e-3) / 1e9 / self.copy_gbs))
            print(line, flush=True)

    def softmax(self, dtypes, shapes):
        for shape in shapes:
            rows, cols = shape
            for name in dtypes:
                dt = DT[name]
                for kind, op in ((0, "SoftmaxGrad_13"), (1, "LogSoftmaxGrad_13")):
                    case = f"{op} {name} {rows}x{cols}"
                    print(f"== {case}", flush=True)
                    dy = randn(shape, dt)
                    logits = randn(shape, torch.float32, 2.0)
                    y = (torch.log_softmax(logits, -1) if kind else torch.softmax(logits, -1)).to(dt)
                    yd, gd = y.double(), dy.double()
                    ref = gd - torch.exp(yd) * gd.sum(-1, keepdim=True) if kind else \
                        yd * (gd - (yd * gd).sum(-1, keepdim=True))
                    del yd, gd
                    dx = torch.empty_like(dy)
                    nb = 3 * dy.numel() * dy.element_size()
                    tfn = aten._log_softmax_backward_data if kind else aten._softmax_backward_data
                    tms = self.time_torch(case, lambda: tfn(dy, y, -1, dt), nb)
                    pack = 16 // dy.element_size()
                    variants = []
                    if cols % pack == 0 and cols // pack <= 256:
                        variants += [("warp pf ppl1", 0, 0, 1), ("warp nopf ppl2", 0, 1, 2), ("warp nopf ppl4", 0, 1, 4)]
                    if 32 < cols // pack <= 512 * (4 if pack == 4 else 2):
                        variants += [("block regs m3", 1, 3, 2)]
                    if cols // pack > 32:
                        variants += [("block regs t512", 1, 2, 2), ("block regs n2", 1, 12, 2),
                                     ("two_pass auto", 2, 0, 2)]
                        variants += [(f"two_pass c{c}", 2, c, 2) for c in (1, 2, 4, 8)]
                    self._softmax_cases(case, op, kind, dt, dy, y, dx, ref, nb, tms, rows, cols, variants)
                    del ref
                    torch.cuda.empty_cache()

    def softmax_fwd(self, dtypes, shapes):
        """The forwards (Softmax_13, LogSoftmax_13): the library, held rows at 4 packs, two passes."""
        for shape in shapes:
            rows, cols = shape
            for name in dtypes:
                dt = DT[name]
                for kind, op in ((2, "Softmax_13"), (3, "LogSoftmax_13")):
                    case = f"{op} {name} {rows}x{cols}"
                    print(f"== {case}", flush=True)
                    x = randn(shape, torch.float32, 2.0).to(dt)
                    xd = x.double()
                    ref = torch.log_softmax(xd, -1) if kind == 3 else torch.softmax(xd, -1)
                    del xd
                    y = torch.empty_like(x)
                    nb = 2 * x.numel() * x.element_size()
                    tms = self.time_torch(case, lambda k=kind: (torch.log_softmax if k == 3 else torch.softmax)(x, -1),
                                          nb)
                    variants = []
                    if cols // (16 // x.element_size()) > 32:
                        variants += [("block regs t512", 1, 2, 2), ("block regs n4", 1, 14, 2),
                                     ("two_pass auto", 2, 0, 2)]
                    self._softmax_cases(case, op, kind, dt, None, x, y, ref, nb, tms, rows, cols, variants)
                    del ref
                    torch.cuda.empty_cache()

    def _softmax_cases(self, case, op, kind, dt, dy, y, out, ref, nb, tms, rows, cols, variants):
        """The libraries' own choice (new, old), then each lab variant (name, path, cfg, ppl); dy is
        None for the forwards, whose input is y."""
        ins = [y] if dy is None else [dy, y]
        for libname, lib in (("new", self.new), ("old", self.old)):
            if lib is None:
                continue
            impl = implementation_name(lib, op, ins, [out], {"axis": -1})
            call = prepare(lib, op, ins, [out], {"axis": -1}, stream=self.stream)
            self.measure(case, f"{libname} {impl}", call, [out], [ref], nb, tms)
        for vname, path, cfg, ppl in variants:
            fn = (lambda p=path, c=cfg, q=ppl: self._softmax_call(kind, dt, dy, y, out, rows, cols, p, c, q))
            self.measure(case, vname, fn, [out], [ref], nb, tms)

    def _softmax_call(self, kind, dt, dy, y, dx, rows, cols, path, cfg, ppl):
        rc = self.lab.lab_softmax(kind, CODE[dt], dy.data_ptr() if dy is not None else None, y.data_ptr(),
                                  dx.data_ptr(), rows, cols, path, cfg,
                                  ppl, self.stream)
        if rc:
            raise RuntimeError("lab_softmax failed")

    def elementwise(self, dtypes):
        n = 1 << 26
        ops = [(0, "GeluGrad", lambda dy, x: aten.gelu_backward(dy, x, approximate="none")),
               (1, "FastGeluGrad", lambda dy, x: aten.gelu_backward(dy, x, approximate="tanh")),
               (2, "ReluGrad", lambda dy, x: aten.threshold_backward(dy, x, 0)),
               (3, "SigmoidGrad", lambda dy, y: aten.sigmoid_backward(dy, y))]
        for fn_id, op, tfn in ops:
            for name in dtypes:
                dt = DT[name]
                case = f"{op} {name} 2^26"
                print(f"== {case}", flush=True)
                dy, x = randn((n,), dt), randn((n,), dt, 2.0)
                if op == "SigmoidGrad":
                    x = torch.sigmoid(x)
                ref = tfn(dy.double(), x.double())
                dx = torch.empty_like(dy)
                nb = 3 * n * dy.element_size()
                tms = self.time_torch(case, lambda: tfn(dy, x), nb)
                for libname, lib in (("new", self.new), ("old", self.old)):
                    if lib is not None:
                        call = prepare(lib, op, [dy, x], [dx], {}, stream=self.stream)
                        self.measure(case, f"{libname}", call, [dx], [ref], nb, tms)
                for u, threads in FLAT_VARIANTS:
                    def call(u=u, threads=threads):
                        if self.lab.lab_flat(fn_id, CODE[dt], dy.data_ptr(), x.data_ptr(), dx.data_ptr(), n, u,
                                             threads, self.stream):
                            raise RuntimeError("lab_flat failed")
                    self.measure(case, f"flat u{u} t{threads}", call, [dx], [ref], nb, tms)
                del ref
                torch.cuda.empty_cache()

    def bias(self, dtypes):
        for shape in BIAS_SHAPES:
            rows, cols = shape
            ops = [(0, "BiasGeluGrad_dX", "none"), (1, "BiasFastGeluGrad_dX", "tanh"), (2, "BiasReluGrad (lab)", "relu")]
            for fn_id, op, approx in [o for o in ops if o[2] in self.bias_ops]:
                for with_db in (False, True):
                    for name in dtypes:
                        dt = DT[name]
                        case = f"{op}{' +dB' if with_db else ''} {name} {rows}x{cols}"
                        print(f"== {case}", flush=True)
                        dy, x, b = randn(shape, dt), randn(shape, dt, 2.0), randn((cols,), dt)
                        def grad(g_, v_):
                            if approx == "relu":  # the kernel's access pattern with next to no math
                                return aten.threshold_backward(g_, v_, 0)
                            return aten.gelu_backward(g_, v_, approximate=approx)
                        g = grad(dy.double(), x.double() + b.double())
                        refs = [g, g.sum(0)] if with_db else [g]
                        dx = torch.empty_like(dy)
                        db = torch.empty_like(b) if with_db else None
                        outs = [dx, db] if with_db else [dx]
                        es = dy.element_size()
                        nb = (3 * rows * cols + (2 if with_db else 1) * cols) * es
                        if with_db:
                            def peer():
                                t = grad(dy, x + b)
                                return t, t.sum(0)
                        else:
                            def peer():
                                return grad(dy, x + b)
                        tms = self.time_torch(case, peer, nb)
                        for libname, lib in (("new", self.new), ("old", self.old)):
                            if lib is not None and fn_id < 2:
                                call = prepare(lib, op, [dy, x, b], outs, {}, stream=self.stream)
                                self.measure(case, libname, call, outs, refs, nb, tms)
                        for ru, mb, tb in BIAS_VARIANTS:
                            if es == 4 and mb > 2:
                                continue
                            def call(ru=ru, mb=mb, tb=tb):
                                if self.lab.lab_bias(fn_id, CODE[dt], dy.data_ptr(), x.data_ptr(), b.data_ptr(),
                                                     dx.data_ptr(), db.data_ptr() if with_db else None, rows,
                                                     cols, ru, mb, tb, 32, self.stream):
                                    raise RuntimeError("lab_bias failed")
                            self.measure(case, f"bias r{ru} m{mb} blocks{tb}", call, outs, refs, nb, tms)
                        del refs, g
                        torch.cuda.empty_cache()

    def summary(self):
        print("\n== summary: best variant per case (share of copy; x torch)")
        cases = []
        for r in self.rows:
            if r["case"] not in cases and not r["case"].startswith("probe"):
                cases.append(r["case"])
        for c in cases:
            rs = [r for r in self.rows if r["case"] == c and r.get("status") == "ok" and r["variant"] != "torch"]
            if not rs:
                print(f"{c:<44} no variant passed")
                continue
            best = max(rs, key=lambda r: r["gbs"])
            new = next((r for r in rs if r["variant"].startswith("new")), None)
            old = next((r for r in rs if r["variant"].startswith("old")), None)
            def fmt(r):
                return f"{r['copy']:.2f}/{r.get('ratio', float('nan')):.2f}" if r else "  -  "
            print(f"{c:<44} old {fmt(old)}  new {fmt(new)}  best {fmt(best)} {best['variant']}")
        bad = [r for r in self.rows if r.get("status", "ok") != "ok"]
        print(f"{len(self.rows)} measurements, {len(bad)} failed or errored")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new", required=True)
    ap.add_argument("--old")
    ap.add_argument("--lab", required=True)
    ap.add_argument("--out", default="out/lab")
    ap.add_argument("--sections", default="softmax,elementwise,bias",
                    help="also: softmax_fwd (the forwards), probe (timer variants)")
    ap.add_argument("--dtypes", default="f32,bf16,f16")
    ap.add_argument("--shapes", default="", help="softmax shapes, e.g. 65536x128,8192x4096 (default: all)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--flat-variants", default="",
                    help="flat kernel variants unroll,threads separated by ';' (default: FLAT_VARIANTS)")
    ap.add_argument("--bias-variants", default="",
                    help="bias kernel variants rows,blocks,target separated by ';' (default: BIAS_VARIANTS)")
    ap.add_argument("--bias-shapes", default="", help="bias shapes, e.g. 16384x4096 (default: all)")
    ap.add_argument("--bias-ops", default="none,tanh",
                    help="bias section: none (GELU), tanh (FastGelu), relu (ReluGrad of X + B: the kernel without its math)")
    args = ap.parse_args()
    torch.manual_seed(0)
    lab = Lab(args)
    lab.bias_ops = args.bias_ops.split(",")
    global BIAS_VARIANTS, BIAS_SHAPES, FLAT_VARIANTS
    if args.flat_variants:
        FLAT_VARIANTS = [tuple(int(v) for v in t.split(",")) for t in args.flat_variants.split(";")]
    if args.bias_variants:
        BIAS_VARIANTS = [tuple(int(v) for v in t.split(",")) for t in args.bias_variants.split(";")]
    if args.bias_shapes:
        BIAS_SHAPES = [tuple(int(v) for v in s.split("x")) for s in args.bias_shapes.split(",")]
    lab.copy_gbs = copy_bandwidth(lab.timer)
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, copy {lab.copy_gbs:.0f} GB/s",
          flush=True)
    dtypes = args.dtypes.split(",")
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s] or SOFTMAX_SHAPES
    sections = args.sections.split(",")
    if "probe" in sections:
        lab.probe()
    if "softmax" in sections:
        lab.softmax(dtypes, shapes)
    if "softmax_fwd" in sections:
        lab.softmax_fwd(dtypes, shapes)
    if "elementwise" in sections:
        lab.elementwise(dtypes)
    if "bias" in sections:
        lab.bias(dtypes)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "lab.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), copy_gbs=lab.copy_gbs, rows=lab.rows), f, indent=1)
    lab.summary()


if __name__ == "__main__":
    main()
