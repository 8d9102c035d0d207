"""gradops: ONNX Runtime's training-gradient operators (and their forwards) for numpy and PyTorch.

A thin layer over the C ABI of libgradops: every operator of the library's table is a function of
this module with ORT's name, inputs, attribute names and defaults, all read from the library when
the package is imported::

    import numpy as np, gradops
    x = np.random.randn(4, 8).astype(np.float32)
    y = gradops.Gelu(x)                       # output allocated, shape from the library
    dx = gradops.GeluGrad(np.ones_like(x), x)
    y, mean, inv_std = gradops.LayerNormalization(x, np.ones(8, np.float32), epsilon=1e-6)

Inputs are numpy arrays, PyTorch tensors (CPU or CUDA; CUDA work goes on PyTorch's current stream),
or any object with ``__dlpack__``; they are read in place. Non-contiguous inputs are copied to a
contiguous array first (gradops has no strided kernels). Outputs are allocated in the library of the
first input unless given with ``out=``. Errors: ``ValueError`` (the call breaks the op's contract),
``NotImplementedError`` (a valid call this build has no kernel for), ``MemoryError``, and
``RuntimeError`` (a device or internal error), each with the library's message.
"""
from . import _native
from . import _call

__all__ = ["ops", "run", "prepare", "implementation_name", "library_path", "load", "Library", "OpInfo",
           "torch_call"]

OpInfo = _native.OpInfo


def _want(op, outputs):
    if outputs is None:
        return op._all
    if isinstance(outputs, str):
        outputs = (outputs,)
    names = [o.name for o in op.outputs]
    for n in outputs:
        if n not in names:
            raise ValueError(f"{op.name}: no output named '{n}' (outputs: {', '.join(names)})")
    return tuple(o.name in outputs for o in op.outputs)


def _outs(op, out):
    if out is None:
        return None
    if isinstance(out, (list, tuple)):
        if len(out) > len(op.outputs):
            raise ValueError(f"{op.name}: out= has {len(out)} entries; the op has {len(op.outputs)} outputs")
        return list(out) + [None] * (len(op.outputs) - len(out))
    return [out] + [None] * (len(op.outputs) - 1)


def _attr_values(op, attributes):
    attributes = dict(attributes or {})
    vals = []
    for a in op.attributes:
        vals.append(attributes.pop(a.name, None))
    if attributes:
        raise ValueError(f"{op.name}: no attribute named {', '.join(map(repr, attributes))} "
                         f"(attributes: {', '.join(a.name for a in op.attributes) or 'none'})")
    return tuple(vals)


def _inputs(op, inputs):
    inputs = list(inputs)
    if len(inputs) > len(op.inputs):
        raise ValueError(f"{op.name}: {len(inputs)} inputs given; the op has {len(op.inputs)}")
    return inputs + [None] * (len(op.inputs) - len(inputs))


class Library(_native.Library):
    """A loaded libgradops. The module's functions use the default one; load() gives others (to
    compare two builds in one process)."""

    def _op(self, op_name):
        op = self.ops.get(op_name)
        if op is None:
            raise ValueError(f"gradops: no operator named '{op_name}'")
        return op

    def run(self, op_name, inputs, attributes=None, *, outputs=None, out=None, num_threads=0):
        """Runs the operator `op_name` on `inputs` (in the schema's order; None for an absent
        optional) with `attributes` (a dict; unlisted ones take the library's defaults).

        outputs: the names of the outputs to compute (default: all, optional ones included).
        out: one array, or a sequence with one entry per output (None: allocate).
        Returns a tuple with one entry per output of the op (None for those not computed).
        """
        op = self._op(op_name)
        return tuple(_call.run(op, _inputs(op, inputs), _attr_values(op, attributes), _want(op, outputs),
                               _outs(op, out), num_threads))

    def prepare(self, op_name, inputs, attributes=None, *, outputs=None, out=None, num_threads=0, stream=None):
        """(call, outputs): `call()` runs this very call again on the same tensors, for timing
        loops (one gradops_run per call, nothing else). stream: a cudaStream_t as an int (default:
        PyTorch's current stream for CUDA tensors)."""
        op = self._op(op_name)
        return _call.prepare(op, _inputs(op, inputs), _attr_values(op, attributes), _want(op, outputs),
                             _outs(op, out), num_threads, stream)

    def implementation_name(self, op_name, inputs, attributes=None, *, outputs=None, out=None):
        """The name of the implementation that would run this call ("cpu:simd [AVX3]"), after the
        same validation as run()."""
        op = self._op(op_name)
        return _call.implementation_name(op, _inputs(op, inputs), _attr_values(op, attributes),
                                         _want(op, outputs), _outs(op, out))


def load(path):
    """Another libgradops, with its own table and functions (Library.run, prepare, ...)."""
    lib = Library(path)
    for op in lib.ops.values():
        op._all = tuple(True for _ in op.outputs)
    return lib


#: The library this package runs: $GRADOPS_LIBRARY, the copy installed with the package, or the
#: loader's libgradops.so.
library = load(_native.find_library())
library_path = library.path
has_shape_inference = library.has_shape_inference
#: The operator table: name -> OpInfo (inputs, outputs, attributes, signatures, devices, ...).
ops = library.ops
run = library.run
prepare = library.prepare
implementation_name = library.implementation_name
torch_call = _call.torch_call


def _doc(op):
    lines = [f"{op.name} ({op.domain or 'ai.onnx'}, version {op.since_version}): {op.summary}.", ""]
    lines.append("Inputs:")
    for a in op.inputs:
        lines.append(f"    {a.name} ({a.type_var}{', optional' if a.optional else ''}): {a.doc}")
    lines.append("Outputs (all computed unless `outputs=` names some):")
    for a in op.outputs:
        lines.append(f"    {a.name} ({a.type_var}{', optional' if a.optional else ''}"
                     f"{', gradops extension' if a.extension else ''}): {a.doc}")
    if op.attributes:
        lines.append("Attributes:")
        for a in op.attributes:
            d = "required" if a.required else f"default {a.default!r}"
            lines.append(f"    {a.name} ({a.type}, {d}{', gradops extension' if a.extension else ''}): {a.doc}")
    lines.append("Signatures (" + ", ".join(op.type_vars) + "): "
                 + "; ".join("(" + ", ".join(s) + ")" for s in op.signatures))
    if op.devices is not None:
        lines.append("Devices in this build: " + (", ".join(op.devices) or "none"))
    if op.aliases:
        lines.append("In place: " + ", ".join(f"{op.outputs[o].name} may be {op.inputs[i].name} (out=)"
                                              for o, i in op.aliases))
    if len(op.outputs) == 1:
        lines.append(f"Returns {op.outputs[0].name}.")
    else:
        lines.append("Returns a tuple (" + ", ".join(a.name for a in op.outputs) + "), None for outputs not computed.")
    return "\n".join(lines)


def _make(op):
    # The function is generated from the table so that its signature (names, defaults) is the
    # library's, visible to help() and fast to call.
    params, seen_optional = [], False
    for a in op.inputs:
        seen_optional = seen_optional or a.optional
        params.append(f"{a.name}=None" if seen_optional else a.name)
    params.append("*")
    for a in op.attributes:
        params.append(a.name if a.required else f"{a.name}={a.default!r}")
    params += ["outputs=None", "out=None", "num_threads=0"]
    ins = "".join(f"{a.name}, " for a in op.inputs)
    attrs = "".join(f"{a.name}, " for a in op.attributes)
    finish = "r[0]" if len(op.outputs) == 1 else "tuple(r)"
    src = (f"def {op.name}({', '.join(params)}):\n"
           f"    r = _call.run(_op, ({ins}), ({attrs}), _op._all if outputs is None else _want(_op, outputs),\n"
           f"             None if out is None else _outs(_op, out), num_threads)\n"
           f"    return {finish}\n")
    env = {"_call": _call, "_op": op, "_want": _want, "_outs": _outs}  # _call.run: see _call.torch_call
    exec(compile(src, f"<gradops.{op.name}>", "exec"), env)  # noqa: S102 - source built from the table
    fn = env[op.name]
    fn.__doc__ = _doc(op)
    fn.__module__ = __name__
    fn.__qualname__ = op.name
    return fn


for _op in ops.values():
    globals()[_op.name] = _make(_op)
    __all__.append(_op.name)
del _op
