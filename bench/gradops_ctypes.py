"""A minimal ctypes binding of gradops' C ABI (include/gradops/gradops.h) for the benchmark scripts.

Tensors are passed as PyTorch tensors (CPU or CUDA, contiguous); gradops reads and writes their
memory in place.
"""
import ctypes
import os

_DTYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3}
MAX_RANK = 8


class _Device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int32), ("index", ctypes.c_int32)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("rank", ctypes.c_int32),
                ("dtype", ctypes.c_int32), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64))]


class _Attribute(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_double)]


class _Context(ctypes.Structure):
    _fields_ = [("num_threads", ctypes.c_int32), ("cuda_stream", ctypes.c_void_p),
                ("allocator", ctypes.c_void_p)]


class Gradops:
    """gradops loaded from libgradops.so."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(os.path.abspath(path))
        self.lib.gradops_run.restype = ctypes.c_int
        self.lib.gradops_run.argtypes = [
            ctypes.c_char_p, ctypes.POINTER(ctypes.POINTER(_Tensor)), ctypes.c_size_t,
            ctypes.POINTER(ctypes.POINTER(_Tensor)), ctypes.c_size_t, ctypes.POINTER(_Attribute),
            ctypes.c_size_t, ctypes.POINTER(_Context)]
        self.lib.gradops_last_error.restype = ctypes.c_char_p
        self.lib.gradops_implementation_name.restype = ctypes.c_int
        # Declared so that the size_t counts go out as 64-bit values: undeclared, ctypes passes
        # Python ints as C ints and the upper half of each count is whatever the register held.
        self.lib.gradops_implementation_name.argtypes = self.lib.gradops_run.argtypes + [
            ctypes.c_char_p, ctypes.c_size_t]

    @staticmethod
    def _describe(t, keep):
        if t is None:
            return None
        assert t.is_contiguous(), "gradops takes dense row-major tensors"
        shape = (ctypes.c_int64 * max(t.dim(), 1))(*t.shape)
        keep.append(shape)
        dev = _Device(1, t.device.index or 0) if t.is_cuda else _Device(0, 0)
        desc = _Tensor(t.data_ptr(), dev, t.dim(), _DTYPES[str(t.dtype).replace("torch.", "")], shape, None)
        keep.append(desc)
        return ctypes.pointer(desc)

    def prepare(self, op, inputs, outputs, attrs=None, threads=0, stream=None):
        """Returns a zero-argument callable running the op on these tensors (for timing loops)."""
        keep = []
        ins = (ctypes.POINTER(_Tensor) * len(inputs))(*[self._describe(t, keep) for t in inputs])
        outs = (ctypes.POINTER(_Tensor) * len(outputs))(*[self._describe(t, keep) for t in outputs])
        attrs = attrs or {}
        names = [k.encode() for k in attrs]
        at = (_Attribute * max(len(attrs), 1))(*[_Attribute(n, float(v)) for n, v in zip(names, attrs.values())])
        ctx = _Context(threads, stream, None)
        name = op.encode()
        run, n_in, n_out, n_at = self.lib.gradops_run, len(inputs), len(outputs), len(attrs)
        keep += [ins, outs, at, ctx, names]

        def call():
            code = run(name, ins, n_in, outs, n_out, at, n_at, ctypes.byref(ctx))
            if code != 0:
                raise RuntimeError(self.lib.gradops_last_error().decode())
        call.keep = keep
        return call

    def run(self, op, inputs, outputs, attrs=None, threads=0, stream=None):
        self.prepare(op, inputs, outputs, attrs, threads, stream)()

    def implementation_name(self, op, inputs, outputs, attrs=None, threads=0):
        keep = []
        ins = (ctypes.POINTER(_Tensor) * len(inputs))(*[self._describe(t, keep) for t in inputs])
        outs = (ctypes.POINTER(_Tensor) * len(outputs))(*[self._describe(t, keep) for t in outputs])
        attrs = attrs or {}
        names = [k.encode() for k in attrs]  # alive until the call returns, as in prepare()
        at = (_Attribute * max(len(attrs), 1))(*[_Attribute(n, float(v)) for n, v in zip(names, attrs.values())])
        ctx = _Context(threads, None, None)
        buf = ctypes.create_string_buffer(64)
        status = self.lib.gradops_implementation_name(op.encode(), ins, len(inputs), outs, len(outputs), at,
                                                      len(attrs), ctypes.byref(ctx), buf, 64)
        if status:  # shown where the name would be, so that a table says why it has none
            return "error: " + self.lib.gradops_last_error().decode()
        return buf.value.decode()
