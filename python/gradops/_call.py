"""Running one operator: tensors to descriptors, outputs allocated from the library's inferred
shapes, one gradops_run.

Every call is described by a key (op, each input's dtype, shape and device, the attribute values,
the outputs wanted and the shapes of any given); the first call with a key builds a plan (the
ctypes descriptors, the inferred output shapes, the attribute array) and later calls only write
data pointers into it. Plans are per thread, since their descriptors are written on every call.
"""
import ctypes
import functools
import sys
import threading

from . import _native as N

_c_size_t = ctypes.c_size_t
_byref = ctypes.byref
_TensorPtr = ctypes.POINTER(N.Tensor)

# ---- array libraries ---------------------------------------------------------------------------
# numpy and torch are imported only if the caller has them imported: gradops itself needs neither.

_np = None
_torch = None
_NP_CODES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3}
_np_dtypes = {}
_TORCH_CODES = {}
_TORCH_DTYPES = {}


def _numpy():
    global _np
    if _np is None:
        import numpy
        _np = numpy
        for code, name in enumerate(N.DTYPE_NAMES[:3]):
            _np_dtypes[code] = numpy.dtype(name)
    return _np


def _np_dtype(code):
    if code not in _np_dtypes:
        if code == 3:
            try:
                import ml_dtypes
            except ImportError:
                raise ValueError("gradops: a bfloat16 numpy array needs the ml_dtypes package") from None
            _np_dtypes[3] = _numpy().dtype(ml_dtypes.bfloat16)
        else:
            _numpy()
    return _np_dtypes[code]


def _torch_module():
    global _torch
    if _torch is None:
        import torch
        _torch = torch
        for code, dt in enumerate((torch.float32, torch.float64, torch.float16, torch.bfloat16)):
            _TORCH_CODES[dt] = code
            _TORCH_DTYPES[code] = dt
        _load_torch_call()
    return _torch


def _is_torch(x):
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


def _is_numpy(x):
    n = sys.modules.get("numpy")
    return n is not None and isinstance(x, n.ndarray)


# ---- CUDA: PyTorch's stream and caching allocator ---------------------------------------------

_current_stream = None


def _stream_of(index):
    global _current_stream
    if _current_stream is None:
        torch = _torch_module()
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _current_stream = raw if raw is not None else (lambda i: torch.cuda.current_stream(i).cuda_stream)
    return _current_stream(index)


def _torch_alloc(user, device, nbytes):
    try:
        torch = _torch
        return torch.cuda.caching_allocator_alloc(nbytes, device.index, _stream_of(device.index))
    except Exception:  # noqa: BLE001 - reported to gradops as an allocation failure (OUT_OF_MEMORY)
        return None


def _torch_free(user, device, ptr, nbytes):
    _torch.cuda.caching_allocator_delete(ptr)


_alloc_fn = N.ALLOCATE(_torch_alloc)
_free_fn = N.DEALLOCATE(_torch_free)
torch_cuda_allocator = N.Allocator(_alloc_fn, _free_fn, None)
_torch_cuda_allocator_ptr = ctypes.pointer(torch_cuda_allocator)

# ---- one tensor -----------------------------------------------------------------------------------


def _describe(x):
    """(tensor to keep, data pointer, dtype code, shape, device type, device index, kind).

    kind is how outputs are made: "torch", "numpy" or ("dlpack", namespace) for other libraries.
    Non-contiguous inputs are copied to contiguous ones here (gradops has no strided kernels).
    """
    if _is_torch(x):
        if not x.is_contiguous():
            x = x.contiguous()
        if _torch is None:
            _torch_module()
        code = _TORCH_CODES.get(x.dtype)
        if code is None:
            raise TypeError(f"gradops: dtype {x.dtype} is not one of float32, float64, float16, bfloat16")
        if x.is_cuda:
            return x, x.data_ptr(), code, tuple(x.shape), N.DEVICE_CUDA, x.get_device(), "torch"
        return x, x.data_ptr(), code, tuple(x.shape), N.DEVICE_CPU, 0, "torch"
    if _is_numpy(x):
        if not x.flags.c_contiguous:
            x = _numpy().ascontiguousarray(x)
        code = _NP_CODES.get(x.dtype.name)
        if code is None:
            raise TypeError(f"gradops: dtype {x.dtype} is not one of float32, float64, float16, bfloat16")
        return x, x.__array_interface__["data"][0], code, x.shape, N.DEVICE_CPU, 0, "numpy"
    if hasattr(x, "__dlpack__"):
        # Read zero-copy through PyTorch (which handles DLPack's stream handshake on CUDA) or,
        # for CPU arrays without PyTorch, through numpy; outputs go back the same way.
        ns = x.__array_namespace__() if hasattr(x, "__array_namespace__") else None
        try:
            t = _torch_module().from_dlpack(x) if _torch is not None or _have_torch() else None
        except ImportError:
            t = None
        if t is not None:
            desc = _describe(t)
            return desc[:6] + (("dlpack", ns, type(x)),)
        arr = _numpy().from_dlpack(x)
        desc = _describe(arr)
        return desc[:6] + (("dlpack", ns, type(x)),)
    if isinstance(x, (int, float, list, tuple)):
        raise TypeError("gradops: inputs are arrays (numpy, PyTorch, or objects with __dlpack__), "
                        f"not {type(x).__name__}")
    raise TypeError(f"gradops: cannot read a {type(x).__name__} (expected a numpy array, a PyTorch "
                    "tensor, or an object with __dlpack__)")


def _have_torch():
    try:
        _torch_module()
        return True
    except ImportError:
        return False


def _allocator(kind, code, shape, device_type, device_index):
    """A zero-argument function making one output (cached in the plan: no per-call parsing)."""
    if kind == "numpy" or (kind != "torch" and not _have_torch()):
        return functools.partial(_numpy().empty, shape, dtype=_np_dtype(code))
    torch = _torch_module()
    dev = torch.device("cuda", device_index) if device_type == N.DEVICE_CUDA else torch.device("cpu")
    return functools.partial(torch.empty, shape, dtype=_TORCH_DTYPES[code], device=dev)


def _give_back(kind, t):
    """An output made for a DLPack input, handed back in the input's library (zero-copy)."""
    if isinstance(kind, tuple):
        ns, typ = kind[1], kind[2]
        if ns is not None and hasattr(ns, "from_dlpack"):
            return ns.from_dlpack(t)
        mod = sys.modules.get(typ.__module__.split(".")[0])
        if mod is not None and hasattr(mod, "from_dlpack"):
            return mod.from_dlpack(t)
    return t


# ---- plans ------------------------------------------------------------------------------------------


class _Plan:
    __slots__ = ("in_desc", "out_desc", "ins", "outs", "n_in", "n_out", "attrs", "n_attrs", "ctx", "ctx_ref",
                 "specs", "keep", "cuda", "allocators")

    def __init__(self, op, in_meta, attr_values, want, given):
        keep = []

        def desc(code, shape, dev_type, dev_index):
            shp = (ctypes.c_int64 * max(len(shape), 1))(*shape)
            keep.append(shp)
            return N.Tensor(None, N.Device(dev_type, dev_index), len(shape), code, shp, None)

        self.in_desc = [None if m is None else desc(*m) for m in in_meta]
        n_in = len(in_meta)
        self.ins = (_TensorPtr * max(n_in, 1))(*[None if d is None else ctypes.pointer(d) for d in self.in_desc])
        self.n_in = _c_size_t(n_in)
        names = [a.name.encode() for a in op.attributes]
        keep.append(names)
        pairs = [(nm, float(v)) for nm, v in zip(names, attr_values) if v is not None]
        self.attrs = (N.Attribute * max(len(pairs), 1))(*[N.Attribute(nm, v) for nm, v in pairs])
        self.n_attrs = _c_size_t(len(pairs))

        # Output dtypes and shapes: from the library, for every output; given outputs keep theirs.
        n_all = len(op.outputs)
        specs = [None] * n_all
        if any(w and g is None for w, g in zip(want, given)):
            lib = op.library
            if lib.infer is None:
                raise NotImplementedError(
                    f"{op.name}: this libgradops ({lib.path}) cannot infer output shapes "
                    "(no gradops_infer_output_shapes); pass every output with out=")
            dims = (ctypes.c_int64 * (N.MAX_RANK * n_all))()
            ranks = (ctypes.c_int32 * n_all)()
            dtypes = (ctypes.c_int32 * n_all)()
            lib.check(lib.infer(op.c_name, self.ins, self.n_in, self.attrs, self.n_attrs, dims, ranks, dtypes,
                                _c_size_t(n_all)))
            specs = [(dtypes[o], tuple(dims[o * N.MAX_RANK:o * N.MAX_RANK + ranks[o]])) for o in range(n_all)]
        dev = next(((m[2], m[3]) for m in in_meta if m is not None), (N.DEVICE_CPU, 0))
        n_out = max((i + 1 for i, w in enumerate(want) if w), default=0)
        self.out_desc = []
        for i in range(n_out):
            if not want[i]:
                self.out_desc.append(None)
            elif given[i] is not None:
                self.out_desc.append(desc(*given[i]))
            else:
                self.out_desc.append(desc(specs[i][0], specs[i][1], *dev))
        self.outs = (_TensorPtr * max(n_out, 1))(*[None if d is None else ctypes.pointer(d) for d in self.out_desc])
        self.n_out = _c_size_t(n_out)
        self.specs = specs
        self.cuda = dev if dev[0] == N.DEVICE_CUDA else None
        self.ctx = N.Context(0, None, _torch_cuda_allocator_ptr if self.cuda else None)
        self.ctx_ref = _byref(self.ctx)
        self.keep = keep
        self.allocators = {}  # input kind -> one function per output (None: given or not wanted)

    def allocators_for(self, kind, given):
        a = self.allocators.get(kind)
        if a is None:
            a = self.allocators[kind] = [
                None if d is None or given[i] is not None else
                _allocator(kind, self.specs[i][0], self.specs[i][1], d.device.type, d.device.index)
                for i, d in enumerate(self.out_desc)]
        return a


_local = threading.local()


def _plans():
    try:
        return _local.plans
    except AttributeError:
        _local.plans = {}
        return _local.plans


def _ptr(r):
    return r.data_ptr() if hasattr(r, "data_ptr") else r.__array_interface__["data"][0]


def _prepare(op, inputs, attr_values, want, out, num_threads):
    """The plan for this call with every data pointer written, the outputs, and the input kind."""
    metas = []
    ptrs = []
    keep = []
    kind = None
    for x in inputs:
        if x is None:
            metas.append(None)
            continue
        t, ptr, code, shape, dt, di, k = _describe(x)
        keep.append(t)
        ptrs.append(ptr)
        metas.append((code, shape, dt, di))
        if kind is None:
            kind = k
    n_all = len(op.outputs)
    given = [None] * n_all
    results = [None] * n_all
    out_ptrs = [None] * n_all
    if out is not None:
        for i, o in enumerate(out):
            if o is None:
                continue
            if not want[i]:
                raise ValueError(f"{op.name}: out= gives output '{op.outputs[i].name}', which is not asked for")
            t, ptr, code, shape, dt, di, k = _describe(o)
            if t is not o and not isinstance(k, tuple):  # a DLPack view shares the caller's memory
                raise ValueError(f"{op.name}: output '{op.outputs[i].name}' must be contiguous (gradops writes "
                                 "dense row-major outputs and does not copy them back)")
            results[i] = o
            out_ptrs[i] = ptr
            keep.append(t)
            given[i] = (code, shape, dt, di)
    key = (op.index, tuple(metas), tuple(attr_values), tuple(want), tuple(given), num_threads)
    plans = _plans()
    plan = plans.get(key)
    if plan is None:
        plan = _Plan(op, metas, attr_values, want, given)
        plan.ctx.num_threads = num_threads
        if len(plans) > 4096:
            plans.clear()
        plans[key] = plan
    i = 0
    for d in plan.in_desc:
        if d is not None:
            d.data = ptrs[i]
            i += 1
    allocators = plan.allocators_for(kind, given)
    for i, d in enumerate(plan.out_desc):
        if d is None:
            continue
        if out_ptrs[i] is not None:
            d.data = out_ptrs[i]
        else:
            r = results[i] = allocators[i]()
            d.data = _ptr(r)
    if plan.cuda is not None:
        plan.ctx.cuda_stream = _stream_of(plan.cuda[1])
    return plan, results, kind, keep, given


def _run_python(op, inputs, attr_values, want, out=None, num_threads=0):
    """Runs `op` (an OpInfo) on `inputs` (schema order, None for absent optionals).

    attr_values: one value per schema attribute (None: the library's default), a tuple. want: one
    bool per output, a tuple. out: None, or one entry per output (None: allocate). Returns a list
    with one entry per output (None where not wanted).
    """
    if out is None:
        # The fast path: a call seen before on this thread, whose inputs are all contiguous PyTorch
        # tensors (or all C-contiguous numpy arrays) and whose outputs are allocated, is found by a
        # key of the tensors' own attributes; its entry holds everything else.
        try:
            fast = _local.fast
        except AttributeError:
            fast = _local.fast = {}
        ptrs = None
        if _np is not None and type(inputs[0]) is _np.ndarray:
            ptrs = []
            key = _numpy_key(op, inputs, attr_values, want, num_threads, ptrs)
        else:
            key = [op, attr_values, want, num_threads]
            try:
                for x in inputs:
                    if x is None:
                        key.append(None)
                    else:
                        key += (x.dtype, x.shape, x.get_device(), x.is_contiguous())
            except AttributeError:  # not a PyTorch tensor: the general path
                key = None
            else:
                key = tuple(key)
        entry = fast.get(key) if key is not None else None
        if entry is not None:
            ins, outs, c_run, args, blank, cuda, is_torch = entry
            res = list(blank)
            if is_torch:
                for i, d in ins:
                    d.data = inputs[i].data_ptr()
                for i, d, k, alloc in outs:
                    r = res[i] = alloc() if k < 0 else alloc(inputs[k])
                    d.data = r.data_ptr()
            else:
                for (i, d), p in zip(ins, ptrs):
                    d.data = p
                for i, d, k, alloc in outs:
                    r = res[i] = alloc()
                    d.data = r.__array_interface__["data"][0]
            if cuda is not None:
                cuda[0].cuda_stream = _stream_of(cuda[1])
            code = c_run(*args)
            if code:
                raise op.library.error(code)
            return res
    plan, results, kind, keep, given = _prepare(op, inputs, attr_values, want, out, num_threads)
    code = op.library.c_run(op.c_name, plan.ins, plan.n_in, plan.outs, plan.n_out, plan.attrs, plan.n_attrs,
                            plan.ctx_ref)
    if code:
        raise op.library.error(code)
    if isinstance(kind, tuple):
        results = [r if r is None or given[i] is not None else _give_back(kind, r) for i, r in enumerate(results)]
    elif out is None and key is not None and kind in ("torch", "numpy"):
        _remember(fast, key, op, inputs, plan, kind)
    return results


#: What runs a call: _run_python, or the compiled path for PyTorch tensors once it is loaded
#: (gradops._torch_call.run, which hands every other call to _run_python).
run = _run_python


# ---- the compiled path for PyTorch tensors ----------------------------------------------------------

_torch_call_state = [False, "PyTorch has not been imported yet"]


def _load_torch_call():
    """Loads gradops._torch_call (built with the package where PyTorch's headers were present)
    once PyTorch is imported; without it every call stays on the Python path, with the same results."""
    global run
    import os
    if os.environ.get("GRADOPS_TORCH_CALL", "1") == "0":
        _torch_call_state[:] = [False, "disabled by GRADOPS_TORCH_CALL=0"]
        return
    try:
        from . import _torch_call
    except ImportError as e:  # not built, or built for another PyTorch
        _torch_call_state[:] = [False, f"not loaded: {e}"]
        return
    built_for = getattr(_torch_call, "torch_version", "")
    if built_for != _torch.__version__:  # the ABI may differ though the symbols resolved
        _torch_call_state[:] = [False, f"not loaded: built for PyTorch {built_for or '(unknown)'}, running "
                                       f"{_torch.__version__}; reinstall gradops to rebuild it"]
        return
    _torch_call.init(_run_python, _stream_of, ctypes.addressof(torch_cuda_allocator))
    _torch_call_state[:] = [True, f"loaded from {_torch_call.__file__}"]
    run = _torch_call.run


def torch_call():
    """(True, where it was loaded from) when calls on PyTorch tensors take the compiled path,
    else (False, why not)."""
    if _torch is None and "torch" in sys.modules:
        _torch_module()  # loads it, as the first call on a PyTorch tensor would
    return tuple(_torch_call_state)


# ---- the fast path's entries ------------------------------------------------------------------------

_NP_TYPESTR = {"<f4", "<f8", "<f2"}


def _numpy_key(op, inputs, attr_values, want, num_threads, ptrs):
    """The fast key of a call on C-contiguous numpy arrays of gradops' dtypes, or None; appends
    the arrays' data pointers to ptrs."""
    np = _np
    if np is None:
        return None
    key = [op, attr_values, want, num_threads, "numpy"]
    for x in inputs:
        if x is None:
            key.append(None)
            continue
        if type(x) is not np.ndarray:
            return None
        ai = x.__array_interface__
        if ai["strides"] is not None or ai["typestr"] not in _NP_TYPESTR:
            return None
        key.append(ai["typestr"])
        key.append(ai["shape"])
        ptrs.append(ai["data"][0])
    return tuple(key)


def _remember(fast, key, op, inputs, plan, kind):
    """Stores the fast entry of a call the general path just ran: per present input its position
    and descriptor; per output its position, descriptor and allocation (torch.empty_like of an input
    when the output has that input's dtype, shape and device, the cheapest allocation PyTorch has);
    gradops_run's arguments as ctypes objects, ready to pass."""
    if len(fast) > 4096:
        fast.clear()
    is_torch = kind == "torch"
    if is_torch and any(x is not None and not x.is_contiguous() for x in inputs):
        return
    allocators = plan.allocators_for(kind, [None] * len(op.outputs))
    ins = tuple((i, d) for i, d in enumerate(plan.in_desc) if d is not None)
    outs = []
    for i, d in enumerate(plan.out_desc):
        if d is None:
            continue
        like = -1
        if is_torch:
            spec = (d.dtype, tuple(d.shape[j] for j in range(d.rank)), d.device.type, d.device.index)
            for j, s in enumerate(plan.in_desc):
                if s is not None and (s.dtype, tuple(s.shape[k] for k in range(s.rank)), s.device.type,
                                      s.device.index) == spec:
                    like = j
                    break
        outs.append((i, d, like, _torch.empty_like if like >= 0 else allocators[i]))
    args = (op.c_name, plan.ins, plan.n_in, plan.outs, plan.n_out, plan.attrs, plan.n_attrs, plan.ctx_ref)
    cuda = (plan.ctx, plan.cuda[1]) if plan.cuda is not None else None
    fast[key] = (ins, tuple(outs), op.library.c_run, args, (None,) * len(op.outputs), cuda, is_torch)


def implementation_name(op, inputs, attr_values, want, out=None, num_threads=0):
    """The implementation gradops_run would pick for this call, validated but not run."""
    plan, results, kind, keep, given = _prepare(op, inputs, attr_values, want, out, num_threads)
    buf = ctypes.create_string_buffer(128)
    op.library.check(op.library.c_impl_name(op.c_name, plan.ins, plan.n_in, plan.outs, plan.n_out, plan.attrs,
                                          plan.n_attrs, plan.ctx_ref, buf, _c_size_t(128)))
    return buf.value.decode()


def prepare(op, inputs, attr_values, want, out=None, num_threads=0, stream=None):
    """A zero-argument callable that runs this very call again (same tensors, outputs and stream):
    for timing loops, where only gradops_run itself should be measured. Returns (call, outputs)."""
    plan, results, kind, keep, given = _prepare(op, inputs, attr_values, want, out, num_threads)
    plan = _copy_plan(plan)  # its own descriptors: later calls with the same key must not move it
    if stream is not None:
        plan.ctx.cuda_stream = stream
    run_fn, error, args = op.library.c_run, op.library.error, (op.c_name, plan.ins, plan.n_in, plan.outs, plan.n_out,
                                                             plan.attrs, plan.n_attrs, plan.ctx_ref)

    def call():
        code = run_fn(*args)
        if code:
            raise error(code)
    call.keep = (plan, results, keep)
    return call, results


def _copy_plan(plan):
    """A plan with descriptors of its own, pointing at the same data."""
    new = _Plan.__new__(_Plan)
    keep = list(plan.keep)
    in_desc = []
    for d in plan.in_desc:
        in_desc.append(None if d is None else N.Tensor.from_buffer_copy(d))
    out_desc = []
    for d in plan.out_desc:
        out_desc.append(None if d is None else N.Tensor.from_buffer_copy(d))
    new.in_desc, new.out_desc = in_desc, out_desc
    new.ins = (_TensorPtr * len(plan.ins))(*[None if d is None else ctypes.pointer(d) for d in in_desc])
    new.outs = (_TensorPtr * len(plan.outs))(*[None if d is None else ctypes.pointer(d) for d in out_desc])
    new.n_in, new.n_out, new.attrs, new.n_attrs = plan.n_in, plan.n_out, plan.attrs, plan.n_attrs
    new.ctx = N.Context.from_buffer_copy(plan.ctx)
    new.ctx_ref = _byref(new.ctx)
    new.specs, new.cuda, new.keep = plan.specs, plan.cuda, keep
    return new


if "torch" in sys.modules:  # imported before gradops: take the compiled path from the first call
    _torch_module()
