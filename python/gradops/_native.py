"""The C ABI through ctypes: finding libgradops, its structures, and the op table read from it.

Nothing here knows an operator: names, arguments, attributes, defaults, dtype signatures and alias
rules are read from the library when the package is imported.
"""
import ctypes
import os

MAX_RANK = 8
MAX_TYPE_VARS = 4

DTYPE_NAMES = ("float32", "float64", "float16", "bfloat16")  # gradops_dtype 0..3
DEVICE_CPU, DEVICE_CUDA = 0, 1


class Device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int32), ("index", ctypes.c_int32)]


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", Device), ("rank", ctypes.c_int32),
                ("dtype", ctypes.c_int32), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64))]


class Attribute(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_double)]


ALLOCATE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, Device, ctypes.c_size_t)
DEALLOCATE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, Device, ctypes.c_void_p, ctypes.c_size_t)


class Allocator(ctypes.Structure):
    _fields_ = [("allocate", ALLOCATE), ("deallocate", DEALLOCATE), ("user", ctypes.c_void_p)]


class Context(ctypes.Structure):
    _fields_ = [("num_threads", ctypes.c_int32), ("cuda_stream", ctypes.c_void_p),
                ("allocator", ctypes.POINTER(Allocator))]


class _OpInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("domain", ctypes.c_char_p), ("family", ctypes.c_char_p),
                ("summary", ctypes.c_char_p), ("since_version", ctypes.c_int32), ("gradient", ctypes.c_int32),
                ("num_inputs", ctypes.c_int32), ("num_outputs", ctypes.c_int32),
                ("num_attributes", ctypes.c_int32), ("num_type_vars", ctypes.c_int32),
                ("num_signatures", ctypes.c_int32), ("num_aliases", ctypes.c_int32),
                ("origin", ctypes.c_char_p)]  # newer libraries; left NULL by older ones


class _ArgInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("type_var", ctypes.c_char_p), ("doc", ctypes.c_char_p),
                ("type_var_index", ctypes.c_int32), ("optional", ctypes.c_int32), ("extension", ctypes.c_int32)]


class _AttrInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("doc", ctypes.c_char_p), ("default_value", ctypes.c_double),
                ("type", ctypes.c_int32), ("required", ctypes.c_int32), ("extension", ctypes.c_int32)]


# ---- finding the library ------------------------------------------------------------------------

def _candidates():
    env = os.environ.get("GRADOPS_LIBRARY")
    if env:
        yield env
        return  # an explicit choice: no silent fallback to another copy
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "_lib", "libgradops.so")  # copied in by the package build
    yield "libgradops.so"  # the loader's search path: LD_LIBRARY_PATH, an installed gradops


def find_library():
    errors = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            errors.append(f"{path}: not found")
            continue
        try:
            ctypes.CDLL(path)
            return path
        except OSError as e:
            errors.append(str(e))
    raise ImportError("gradops: cannot load libgradops.so (set GRADOPS_LIBRARY to its path, or install "
                      "the package from a build that has it; see python/README.md): " + "; ".join(errors))


_EXCEPTIONS = {1: ValueError, 2: NotImplementedError, 3: MemoryError}


class Library:
    """One loaded libgradops: its functions and its op table (name -> OpInfo)."""

    def __init__(self, path):
        self.path = path
        self.cdll = lib = ctypes.CDLL(os.path.abspath(path) if os.sep in path else path)
        c = ctypes
        lib.gradops_last_error.restype = c.c_char_p
        lib.gradops_last_error.argtypes = []
        lib.gradops_status_string.restype = c.c_char_p
        lib.gradops_status_string.argtypes = [c.c_int]
        lib.gradops_op_count.restype = c.c_int32
        lib.gradops_op_count.argtypes = []
        lib.gradops_op_get_info.restype = c.c_int
        lib.gradops_op_get_info.argtypes = [c.c_int32, c.POINTER(_OpInfo)]
        for fn in ("gradops_op_get_input", "gradops_op_get_output"):
            getattr(lib, fn).restype = c.c_int
            getattr(lib, fn).argtypes = [c.c_int32, c.c_int32, c.POINTER(_ArgInfo)]
        lib.gradops_op_get_attribute.restype = c.c_int
        lib.gradops_op_get_attribute.argtypes = [c.c_int32, c.c_int32, c.POINTER(_AttrInfo)]
        lib.gradops_op_get_type_var.restype = c.c_int
        lib.gradops_op_get_type_var.argtypes = [c.c_int32, c.c_int32, c.POINTER(c.c_char_p)]
        lib.gradops_op_get_signature.restype = c.c_int
        lib.gradops_op_get_signature.argtypes = [c.c_int32, c.c_int32, c.c_int32 * MAX_TYPE_VARS]
        lib.gradops_op_get_alias.restype = c.c_int
        lib.gradops_op_get_alias.argtypes = [c.c_int32, c.c_int32, c.POINTER(c.c_int32), c.POINTER(c.c_int32)]
        # The hot path (gradops_run) is called without argtypes: every argument is passed as a ready
        # ctypes object (pointers to prebuilt arrays, c_size_t counts), which skips ctypes'
        # per-call conversion.
        self.c_run = lib.gradops_run
        self.c_run.restype = c.c_int
        self.c_impl_name = lib.gradops_implementation_name
        self.c_impl_name.restype = c.c_int
        self.infer = getattr(lib, "gradops_infer_output_shapes", None)
        if self.infer is not None:
            self.infer.restype = c.c_int
        self.supports_fn = getattr(lib, "gradops_supports", None)
        if self.supports_fn is not None:
            self.supports_fn.restype = c.c_int
            self.supports_fn.argtypes = [c.c_int32, c.c_int32, c.POINTER(c.c_int32), c.c_size_t, c.POINTER(c.c_int32)]
        self.has_shape_inference = self.infer is not None
        # For the compiled path (gradops._torch_call), which calls the library without ctypes.
        self.fast_functions = (c.cast(self.c_run, c.c_void_p).value,
                               c.cast(self.infer, c.c_void_p).value if self.infer is not None else 0)
        self.ops = {op.name: op for op in (OpInfo(self, i) for i in range(lib.gradops_op_count()))}

    def error(self, code):
        """The exception for a gradops_status, carrying the library's message for this thread."""
        message = self.cdll.gradops_last_error().decode("utf-8", "replace")
        if not message:
            message = self.cdll.gradops_status_string(code).decode()
        return _EXCEPTIONS.get(code, RuntimeError)(message)

    def check(self, code):
        if code:
            raise self.error(code)

    def __repr__(self):
        return f"<gradops library {self.path}>"


def error(code):
    """The exception type's mapping alone (for tests): ValueError, NotImplementedError, ..."""
    return _EXCEPTIONS.get(code, RuntimeError)(f"status {code}")


class Arg:
    __slots__ = ("name", "type_var", "type_var_index", "optional", "extension", "doc")

    def __init__(self, a):
        self.name = a.name.decode()
        self.type_var = a.type_var.decode()
        self.type_var_index = a.type_var_index
        self.optional = bool(a.optional)
        self.extension = bool(a.extension)
        self.doc = a.doc.decode()

    def __repr__(self):
        return f"Arg({self.name!r}, {self.type_var}{', optional' if self.optional else ''})"


class Attr:
    __slots__ = ("name", "type", "default", "required", "extension", "doc")

    def __init__(self, a):
        self.name = a.name.decode()
        self.type = "int" if a.type == 0 else "float"
        self.required = bool(a.required)
        self.default = None if self.required else (int(a.default_value) if self.type == "int" else a.default_value)
        self.extension = bool(a.extension)
        self.doc = a.doc.decode()

    def __repr__(self):
        return f"Attr({self.name!r}, {self.type}, default={self.default!r})"


class OpInfo:
    """One operator of the library's table."""

    def __init__(self, library, index):
        self.library = library
        lib = library.cdll
        check = library.check
        info = _OpInfo()
        check(lib.gradops_op_get_info(index, ctypes.byref(info)))
        self.index = index
        self.name = info.name.decode()
        self.domain = info.domain.decode()
        self.family = info.family.decode()
        self.summary = info.summary.decode()
        self.since_version = info.since_version
        self.gradient = bool(info.gradient)

        def items(fn, cls, out_cls, n):
            res = []
            for i in range(n):
                s = cls()
                check(fn(index, i, ctypes.byref(s)))
                res.append(out_cls(s))
            return tuple(res)
        self.inputs = items(lib.gradops_op_get_input, _ArgInfo, Arg, info.num_inputs)
        self.outputs = items(lib.gradops_op_get_output, _ArgInfo, Arg, info.num_outputs)
        self.attributes = items(lib.gradops_op_get_attribute, _AttrInfo, Attr, info.num_attributes)
        tv = []
        for v in range(info.num_type_vars):
            p = ctypes.c_char_p()
            check(lib.gradops_op_get_type_var(index, v, ctypes.byref(p)))
            tv.append(p.value.decode())
        self.type_vars = tuple(tv)
        sigs = []
        for s in range(info.num_signatures):
            d = (ctypes.c_int32 * MAX_TYPE_VARS)()
            check(lib.gradops_op_get_signature(index, s, d))
            sigs.append(tuple(DTYPE_NAMES[d[v]] for v in range(info.num_type_vars)))
        self.signatures = tuple(sigs)
        al = []
        for a in range(info.num_aliases):
            o, i = ctypes.c_int32(), ctypes.c_int32()
            check(lib.gradops_op_get_alias(index, a, ctypes.byref(o), ctypes.byref(i)))
            al.append((o.value, i.value))
        self.aliases = tuple(al)
        self.c_name = self.name.encode()
        self.origin = info.origin.decode() if info.origin else "onnxruntime"

    def supports(self, signature, device="cpu"):
        """Whether this build has a kernel for the dtypes `signature` (one per type variable, names
        as in `signatures`) on `device` ("cpu" or "cuda"); None if the library cannot say."""
        fn = self.library.supports_fn
        if fn is None:
            return None
        d = (ctypes.c_int32 * MAX_TYPE_VARS)(*[DTYPE_NAMES.index(n) for n in signature])
        out = ctypes.c_int32(0)
        self.library.check(fn(self.index, DEVICE_CUDA if device == "cuda" else DEVICE_CPU, d, len(signature),
                              ctypes.byref(out)))
        return bool(out.value)

    @property
    def devices(self):
        """The devices with a kernel for at least one signature (None if the library cannot say)."""
        if self.library.supports_fn is None:
            return None
        return tuple(dev for dev in ("cpu", "cuda") if any(self.supports(s, dev) for s in self.signatures))

    def __repr__(self):
        return f"<gradops op {self.name} ({self.family})>"


