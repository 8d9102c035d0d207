"""gradops operators as PyTorch operators, so that torch.compile traces them.

One operator, ``torch.ops.gradops.run(op, inputs, attributes, outputs) -> Tensor[]``, runs any
operator of the library's table: ``op`` is its ORT name, ``attributes`` one value per schema
attribute, ``outputs`` one flag per schema output; it returns the flagged outputs. It is registered
with ``torch.library`` (``define`` + ``impl`` for CPU and CUDA + a fake implementation whose shapes
come from the library's shape inference), on PyTorch 2.2 and later. Older PyTorch runs the same
calls eagerly, without the registration.

Eager calls from the layers skip the dispatcher (``call`` below) unless a graph is being traced.
"""
import torch

from .. import _call, _native, ops, has_shape_inference

_table = ops


def _attrs(op, attributes):
    return tuple(attributes)


_picks = {}  # output flags -> the positions of the flagged outputs


def call(name, inputs, attributes, outputs):
    """The eager path: one gradops_run on these tensors; the flagged outputs, in order.
    attributes and outputs are tuples (they are part of the call's cache key)."""
    res = _call.run(_table[name], inputs, attributes, outputs)
    pick = _picks.get(outputs)
    if pick is None:
        pick = _picks[outputs] = tuple(i for i, w in enumerate(outputs) if w)
    return [res[i] for i in pick]


def _fake(name, inputs, attributes, outputs):
    op = _table[name]
    metas = []
    dev = None
    for x in inputs:
        if x is None:
            metas.append(None)
            continue
        _call._torch_module()
        code = _call._TORCH_CODES[x.dtype]
        dt = _native.DEVICE_CUDA if x.device.type == "cuda" else _native.DEVICE_CPU
        metas.append((code, tuple(int(s) for s in x.shape), dt, x.device.index or 0))
        dev = dev or x.device
    plan = _call._Plan(op, metas, tuple(attributes), tuple(True for _ in op.outputs), [None] * len(op.outputs))
    return [torch.empty(shape, dtype=_call._TORCH_DTYPES[code], device=dev)
            for (code, shape), w in zip(plan.specs, outputs) if w]


registered = False
_lib = None


def _register():
    global registered, _lib
    register_fake = getattr(torch.library, "register_fake", None) or getattr(torch.library, "impl_abstract", None)
    if register_fake is None or not hasattr(torch.library, "Library"):
        return
    if not has_shape_inference:
        return  # the fake implementation needs the library's shapes
    _lib = torch.library.Library("gradops", "DEF")
    _lib.define("run(str op, Tensor?[] inputs, float[] attributes, bool[] outputs) -> Tensor[]")

    def impl(op, inputs, attributes, outputs):
        return call(op, inputs, tuple(attributes), tuple(outputs))
    _lib.impl("run", impl, "CPU")
    _lib.impl("run", impl, "CUDA")
    register_fake("gradops::run", _fake, lib=_lib)
    registered = True


_register()

def _find_is_compiling():
    f = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if f is None:
        try:
            import torch._dynamo as d
            f = d.is_compiling
        except Exception:  # noqa: BLE001 - no dynamo: nothing is ever traced
            f = None
    return f


_is_compiling = _find_is_compiling()  # looked up once here, so that tracing sees a plain call


def _compiling():
    return _is_compiling is not None and _is_compiling()


def run(name, inputs, attributes, outputs):
    """A gradops operator inside PyTorch: the registered operator while tracing, else direct."""
    if registered and _compiling():
        return torch.ops.gradops.run(name, list(inputs), [float(a) for a in attributes], list(outputs))
    return call(name, inputs, attributes, outputs)
