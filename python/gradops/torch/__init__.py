"""PyTorch layers computed by gradops, forward and backward.

Each module subclasses its ``torch.nn`` counterpart, so constructor arguments, parameters, buffers,
``state_dict`` keys, defaults and ``repr`` are PyTorch's; only ``forward`` differs: it runs gradops'
forward operator and, in backward, the matching ORT gradient operator. ``replace_layers(model)``
swaps the layers of an existing model in place (same parameter objects, so an optimizer built
before keeps working).

    LayerNorm, RMSNorm, GELU (approximate="none" | "tanh"), BiasGELU (a fused bias + GELU),
    QuickGELU, Softmax, LogSoftmax, BatchNorm1d/2d/3d, SyncBatchNorm (if the library has the
    BatchNorm split operators).

Every forward and backward is one library call; which operators, attributes and dtypes exist
comes from the library. Unsupported calls raise the library's error (NotImplementedError for a
device or dtype this build has no kernel for): nothing falls back to PyTorch silently, except
BatchNorm in eval mode (inference by running statistics has no gradops operator; it runs
``torch.nn.functional.batch_norm``).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import ops as _table
from . import _ops
from ._ops import run as _run

__all__ = ["LayerNorm", "RMSNorm", "GELU", "BiasGELU", "QuickGELU", "Softmax", "LogSoftmax", "BatchNorm1d",
           "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm", "replace_layers", "bias_gelu", "layer_norm",
           "rms_norm", "gelu", "quick_gelu", "softmax", "log_softmax", "batch_norm", "sync_batch_norm", "registered"]

registered = _ops.registered  # True when torch.ops.gradops.run exists (torch.compile can trace it)

# The table's attribute names and defaults, and output names, per operator: plain tuples, so that
# the layers' use of them traces cleanly under torch.compile.
_ATTRS = {name: tuple((a.name, float(a.default) if a.default is not None else 0.0) for a in op.attributes)
          for name, op in _table.items()}
_OUTPUTS = {name: tuple(o.name for o in op.outputs) for name, op in _table.items()}


# Both are memoized: a layer asks for the same few tuples on every call.
_attrs_memo, _flags_memo = {}, {}


def _attrs(name, **kw):
    """The attribute values of `name` in the table's order: the given ones, defaults elsewhere."""
    if _ops._compiling():  # a pure function of its arguments while a graph is traced
        return tuple(float(kw[n]) if n in kw else d for n, d in _ATTRS[name])
    key = (name, *kw.items())
    r = _attrs_memo.get(key)
    if r is None:
        r = tuple(float(kw[n]) if n in kw else d for n, d in _ATTRS[name])
        if len(_attrs_memo) < 65536:  # attribute values (epsilon, alpha) are few in practice
            _attrs_memo[key] = r
    return r


def _flags(name, *wanted):
    if _ops._compiling():
        return tuple(n in wanted for n in _OUTPUTS[name])
    key = (name, wanted)
    r = _flags_memo.get(key)
    if r is None:
        r = _flags_memo[key] = tuple(n in wanted for n in _OUTPUTS[name])
    return r


class _NoGrad:
    """The ctx of an autograd function's forward run directly, when nothing needs a gradient:
    torch.autograd.Function.apply costs more than a small kernel, and its bookkeeping is unused."""

    def save_for_backward(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass


def _direct(*tensors):
    """A ctx to run an autograd function's forward without apply, or None when apply is needed
    (a tensor requires grad, or a graph is being traced)."""
    if torch.is_grad_enabled():
        for t in tensors:
            if t is not None and t.requires_grad:
                return None
    if _ops._compiling():
        return None
    return _NoGrad()


_ones_cache = {}


def _ones(n, like):
    """A constant scale of ones for layers without one (the ops take a required scale)."""
    if _ops._compiling():
        return torch.ones(n, dtype=like.dtype, device=like.device)
    key = (n, like.dtype, like.device)
    t = _ones_cache.get(key)
    if t is None:
        t = _ones_cache[key] = torch.ones(n, dtype=like.dtype, device=like.device)
    return t


def _zeros(n, like):
    if _ops._compiling():
        return torch.zeros(n, dtype=like.dtype, device=like.device)
    key = ("z", n, like.dtype, like.device)
    t = _ones_cache.get(key)
    if t is None:
        t = _ones_cache[key] = torch.zeros(n, dtype=like.dtype, device=like.device)
    return t


# ---- activations ---------------------------------------------------------------------------------

_GELU_FWD = {"none": "Gelu", "tanh": "FastGelu"}
_GELU_BWD = {"none": "GeluGrad", "tanh": "FastGeluGrad"}


class _Gelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, approximate):
        x = x.contiguous()
        ctx.save_for_backward(x)
        ctx.approximate = approximate
        f = _GELU_FWD[approximate]
        return _run(f, (x,), _attrs(f), _flags(f, "Y"))[0]

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        b = _GELU_BWD[ctx.approximate]
        return _run(b, (dy.contiguous(), x), _attrs(b), _flags(b, "dX"))[0], None


def gelu(x, approximate="none"):
    if approximate not in _GELU_FWD:
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    ctx = _direct(x)
    return _Gelu.apply(x, approximate) if ctx is None else _Gelu.forward(ctx, x, approximate)


class GELU(nn.GELU):
    """torch.nn.GELU on gradops' Gelu / FastGelu (approximate="tanh") and their gradients."""

    def forward(self, x):
        return gelu(x, self.approximate)


_BIAS_GELU_FWD = {"none": "BiasGelu", "tanh": "FastGelu"}
_BIAS_GELU_BWD = {"none": "BiasGeluGrad_dX", "tanh": "BiasFastGeluGrad_dX"}


class _BiasGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, approximate):
        x, bias = x.contiguous(), bias.contiguous()
        ctx.save_for_backward(x, bias)
        ctx.approximate = approximate
        f = _BIAS_GELU_FWD[approximate]
        return _run(f, (x, bias), _attrs(f), _flags(f, "Y", "C"))[0]

    @staticmethod
    def backward(ctx, dy):
        x, bias = ctx.saved_tensors
        b = _BIAS_GELU_BWD[ctx.approximate]
        # dB comes from the same pass as dX (a gradops extension of ORT's op).
        dx, db = _run(b, (dy.contiguous(), x, bias), _attrs(b), _flags(b, "dX", "dB"))
        return dx, db, None


def bias_gelu(x, bias, approximate="none"):
    """gelu(x + bias) in one pass forward and one backward (bias: 1-D, x's last dim)."""
    if approximate not in _BIAS_GELU_FWD:
        raise ValueError(f"bias_gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    if bias.dtype != x.dtype:  # autocast: a 16-bit activation and an f32 parameter
        bias = bias.to(x.dtype)
    ctx = _direct(x, bias)
    return _BiasGelu.apply(x, bias, approximate) if ctx is None else _BiasGelu.forward(ctx, x, bias, approximate)


class BiasGELU(nn.Module):
    """A bias followed by GELU, fused: ``gelu(x + bias)``; put after a ``Linear(bias=False)``."""

    def __init__(self, num_features, approximate="none", device=None, dtype=None):
        super().__init__()
        self.num_features = num_features
        self.approximate = approximate
        self.bias = nn.Parameter(torch.zeros(num_features, device=device, dtype=dtype))

    def forward(self, x):
        return bias_gelu(x, self.bias, self.approximate)

    def extra_repr(self):
        return f"{self.num_features}, approximate={self.approximate!r}"


class _QuickGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha):
        x = x.contiguous()
        ctx.save_for_backward(x)
        ctx.alpha = alpha
        return _run("QuickGelu", (x,), _attrs("QuickGelu", alpha=alpha), _flags("QuickGelu", "Y"))[0]

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return _run("QuickGeluGrad", (dy.contiguous(), x), _attrs("QuickGeluGrad", alpha=ctx.alpha),
                    _flags("QuickGeluGrad", "dX"))[0], None


def quick_gelu(x, alpha=None):
    if alpha is None:
        alpha = next(a.default for a in _table["QuickGelu"].attributes if a.name == "alpha")
    ctx = _direct(x)
    return _QuickGelu.apply(x, alpha) if ctx is None else _QuickGelu.forward(ctx, x, alpha)


class QuickGELU(nn.Module):
    """x * sigmoid(alpha * x) (CLIP's QuickGELU); alpha defaults to the library's (1.702)."""

    def __init__(self, alpha=None):
        super().__init__()
        self.alpha = next(a.default for a in _table["QuickGelu"].attributes if a.name == "alpha") \
            if alpha is None else alpha

    def forward(self, x):
        return quick_gelu(x, self.alpha)

    def extra_repr(self):
        return f"alpha={self.alpha}"


# ---- softmax -------------------------------------------------------------------------------------

class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, log):
        f = "LogSoftmax_13" if log else "Softmax_13"
        y = _run(f, (x.contiguous(),), _attrs(f, axis=dim), _flags(f, "output"))[0]
        ctx.save_for_backward(y)
        ctx.dim, ctx.log = dim, log
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        b = "LogSoftmaxGrad_13" if ctx.log else "SoftmaxGrad_13"
        return _run(b, (dy.contiguous(), y), _attrs(b, axis=ctx.dim), _flags(b, "dX"))[0], None, None


def _dim(dim, x, name):
    if dim is None:  # PyTorch's legacy implicit dim, as torch.nn.Softmax(dim=None) picks it
        return F._get_softmax_dim(name, x.dim(), 3)
    return dim


def softmax(x, dim=None):
    dim = _dim(dim, x, "softmax")
    ctx = _direct(x)
    return _Softmax.apply(x, dim, False) if ctx is None else _Softmax.forward(ctx, x, dim, False)


def log_softmax(x, dim=None):
    dim = _dim(dim, x, "log_softmax")
    ctx = _direct(x)
    return _Softmax.apply(x, dim, True) if ctx is None else _Softmax.forward(ctx, x, dim, True)


class Softmax(nn.Softmax):
    """torch.nn.Softmax on gradops' Softmax_13 / SoftmaxGrad_13."""

    def forward(self, x):
        return softmax(x, self.dim)


class LogSoftmax(nn.LogSoftmax):
    """torch.nn.LogSoftmax on gradops' LogSoftmax_13 / LogSoftmaxGrad_13."""

    def forward(self, x):
        return log_softmax(x, self.dim)


# ---- LayerNorm, RMSNorm --------------------------------------------------------------------------

def _stash(x):
    """ONNX's stash_type: the statistics in double for double inputs (as PyTorch keeps them), else float."""
    return 11 if x.dtype == torch.float64 else 1


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, axis, eps, has_weight, has_bias):
        x = x.contiguous()
        y, mean, inv_std = _run("LayerNormalization", (x, weight, bias),
                                _attrs("LayerNormalization", axis=axis, epsilon=eps, stash_type=_stash(x)),
                                _flags("LayerNormalization", "Y", "Mean", "InvStdDev"))
        ctx.save_for_backward(x, weight, mean, inv_std)
        ctx.axis, ctx.has_weight, ctx.has_bias = axis, has_weight, has_bias
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, inv_std = ctx.saved_tensors
        want = ["X_grad"] + (["scale_grad"] if ctx.has_weight else []) + (["bias_grad"] if ctx.has_bias else [])
        res = _run("LayerNormalizationGrad", (dy.contiguous(), x, weight, mean, inv_std),
                   _attrs("LayerNormalizationGrad", axis=ctx.axis), _flags("LayerNormalizationGrad", *want))
        dx = res[0]
        dw = res[1] if ctx.has_weight else None
        db = res[-1] if ctx.has_bias else None
        return dx, dw, db, None, None, None, None


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.layer_norm on gradops' LayerNormalization and its gradient."""
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    cols = 1
    for d in normalized_shape:
        cols *= d
    w = weight if weight is not None else _ones(cols, x)
    args = (x, w, bias, -len(normalized_shape), eps, weight is not None, bias is not None)
    ctx = _direct(x, weight, bias)
    return _LayerNorm.apply(*args) if ctx is None else _LayerNorm.forward(ctx, *args)


class LayerNorm(nn.LayerNorm):
    """torch.nn.LayerNorm on gradops' LayerNormalization / LayerNormalizationGrad."""

    def forward(self, x):
        return layer_norm(x, self.normalized_shape, self.weight, getattr(self, "bias", None), self.eps)


class _RmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, axis, eps, has_weight):
        x = x.contiguous()
        y, inv = _run("SimplifiedLayerNormalization", (x, weight),
                      _attrs("SimplifiedLayerNormalization", axis=axis, epsilon=eps, stash_type=_stash(x)),
                      _flags("SimplifiedLayerNormalization", "Y", "inv_std_var"))
        ctx.save_for_backward(x, weight, inv)
        ctx.axis, ctx.has_weight = axis, has_weight
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, inv = ctx.saved_tensors
        want = ("X_grad", "scale_grad") if ctx.has_weight else ("X_grad",)
        res = _run("SimplifiedLayerNormalizationGrad", (dy.contiguous(), x, weight, inv),
                   _attrs("SimplifiedLayerNormalizationGrad", axis=ctx.axis),
                   _flags("SimplifiedLayerNormalizationGrad", *want))
        return res[0], (res[1] if ctx.has_weight else None), None, None, None


def rms_norm(x, normalized_shape, weight=None, eps=None):
    """torch.nn.functional.rms_norm (PyTorch >= 2.4) on gradops' SimplifiedLayerNormalization.
    eps=None is PyTorch's default: torch.finfo(x.dtype).eps."""
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    cols = 1
    for d in normalized_shape:
        cols *= d
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    w = weight if weight is not None else _ones(cols, x)
    args = (x, w, -len(normalized_shape), eps, weight is not None)
    ctx = _direct(x, weight)
    return _RmsNorm.apply(*args) if ctx is None else _RmsNorm.forward(ctx, *args)


if hasattr(nn, "RMSNorm"):
    class RMSNorm(nn.RMSNorm):
        """torch.nn.RMSNorm on gradops' SimplifiedLayerNormalization and its gradient."""

        def forward(self, x):
            return rms_norm(x, self.normalized_shape, self.weight, self.eps)
else:
    class RMSNorm(nn.Module):
        """torch.nn.RMSNorm (PyTorch >= 2.4: same arguments, parameter and defaults) on gradops'
        SimplifiedLayerNormalization and its gradient."""

        def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None):
            super().__init__()
            if isinstance(normalized_shape, int):
                normalized_shape = (normalized_shape,)
            self.normalized_shape = tuple(normalized_shape)
            self.eps = eps
            self.elementwise_affine = elementwise_affine
            if elementwise_affine:
                self.weight = nn.Parameter(torch.ones(self.normalized_shape, device=device, dtype=dtype))
            else:
                self.register_parameter("weight", None)

        def reset_parameters(self):
            if self.weight is not None:
                nn.init.ones_(self.weight)

        def forward(self, x):
            return rms_norm(x, self.normalized_shape, self.weight, self.eps)

        def extra_repr(self):
            return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


# ---- BatchNorm -------------------------------------------------------------------------------------

class _BatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, ort_momentum, has_weight, update):
        x = x.contiguous()
        want = ("Y", "running_mean", "running_var", "saved_mean", "saved_inv_std") if update else \
            ("Y", "saved_mean", "saved_inv_std")
        res = _run("BatchNormInternal", (x, weight, bias, running_mean, running_var),
                   _attrs("BatchNormInternal", epsilon=eps, momentum=ort_momentum),
                   _flags("BatchNormInternal", *want))
        if update:
            y, new_mean, new_var, mean, inv_std = res
        else:
            (y, mean, inv_std), new_mean, new_var = res, None, None
        ctx.save_for_backward(x, weight, mean, inv_std)
        ctx.eps, ctx.has_weight = eps, has_weight
        ctx.mark_non_differentiable(*[t for t in (new_mean, new_var) if t is not None])
        return (y, new_mean, new_var) if update else (y,)

    @staticmethod
    def backward(ctx, dy, *unused):
        x, weight, mean, inv_std = ctx.saved_tensors
        want = ("X_grad", "scale_grad", "bias_grad") if ctx.has_weight else ("X_grad",)
        res = _run("BatchNormalizationGrad", (dy.contiguous(), x, weight, mean, inv_std),
                   _attrs("BatchNormalizationGrad", epsilon=ctx.eps), _flags("BatchNormalizationGrad", *want))
        dx = res[0]
        dw, db = (res[1], res[2]) if ctx.has_weight else (None, None)
        return dx, dw, db, None, None, None, None, None, None


_TORCH_NAMES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.bfloat16: "bfloat16"}
_NAME_TORCH = {v: k for k, v in _TORCH_NAMES.items()}


_stats_memo = {}


def _stats_dtype(t, t1, t2):
    """The statistics dtype (T2) for BatchNormInternal: the given one if the table has (T, T1, T2),
    else the first T2 the table pairs with (T, T1)."""
    if _ops._compiling():
        return _stats_dtype_of(t, t1, t2)
    r = _stats_memo.get((t, t1, t2))
    if r is None:
        r = _stats_memo[(t, t1, t2)] = _stats_dtype_of(t, t1, t2)
    return r


def _stats_dtype_of(t, t1, t2):
    sigs = _table["BatchNormInternal"].signatures
    names = (_TORCH_NAMES.get(t), _TORCH_NAMES.get(t1), _TORCH_NAMES.get(t2))
    if names in sigs:
        return t2
    for s in sigs:
        if s[:2] == names[:2]:
            return _NAME_TORCH[s[2]]
    return t2  # no signature: the library's message says so


def batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """torch.nn.functional.batch_norm: training on gradops' BatchNormInternal and
    BatchNormalizationGrad (running statistics updated in place, PyTorch's momentum: the weight of
    the new value); inference by running statistics is PyTorch's."""
    if not training:
        return F.batch_norm(x, running_mean, running_var, weight, bias, False, momentum, eps)
    c = x.shape[1] if x.dim() > 1 else 1
    w = weight if weight is not None else _ones(c, x)
    b = bias if bias is not None else _zeros(c, x)
    update = running_mean is not None
    rm = running_mean if update else _zeros(c, x)
    rv = running_var if update else _ones(c, x)
    stats = _stats_dtype(x.dtype, w.dtype, rm.dtype)
    if stats != rm.dtype:  # e.g. bf16 running statistics: the op keeps them in a wider type
        rm, rv = rm.to(stats), rv.to(stats)
    res = _BatchNorm.apply(x, w, b, rm, rv, eps, 1.0 - momentum, weight is not None, update)
    if update:
        with torch.no_grad():
            running_mean.copy_(res[1])
            running_var.copy_(res[2])
    return res[0]


class _BatchNormMixin:
    def forward(self, input):
        self._check_input_dim(input)
        # PyTorch's own bookkeeping of _BatchNorm.forward: the momentum, or the cumulative average.
        if self.momentum is None:
            factor = 0.0
        else:
            factor = self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        training = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        return batch_norm(input, self.running_mean if track else None, self.running_var if track else None,
                          self.weight, self.bias, training, factor, self.eps)


class BatchNorm1d(_BatchNormMixin, nn.BatchNorm1d):
    """torch.nn.BatchNorm1d, trained with gradops' BatchNormInternal / BatchNormalizationGrad."""


class BatchNorm2d(_BatchNormMixin, nn.BatchNorm2d):
    """torch.nn.BatchNorm2d, trained with gradops' BatchNormInternal / BatchNormalizationGrad."""


class BatchNorm3d(_BatchNormMixin, nn.BatchNorm3d):
    """torch.nn.BatchNorm3d, trained with gradops' BatchNormInternal / BatchNormalizationGrad."""


# SyncBatchNorm needs the library's BatchNorm split operators (reduce, all-reduce, apply); None
# without them.
SyncBatchNorm = sync_batch_norm = None
if all(n in _table for n in ("BatchNormStatsReduce", "BatchNormStatsApply", "BatchNormGradReduce",
                             "BatchNormGradApply")):
    from ._sync import SyncBatchNorm, sync_batch_norm  # noqa: F811


# ---- swapping a model's layers ------------------------------------------------------------------------

_SWAPS = [(nn.LayerNorm, LayerNorm), (nn.GELU, GELU), (nn.Softmax, Softmax), (nn.LogSoftmax, LogSoftmax),
          (nn.BatchNorm1d, BatchNorm1d), (nn.BatchNorm2d, BatchNorm2d), (nn.BatchNorm3d, BatchNorm3d)]
if hasattr(nn, "RMSNorm"):
    _SWAPS.append((nn.RMSNorm, RMSNorm))
if SyncBatchNorm is not None:
    _SWAPS.append((nn.SyncBatchNorm, SyncBatchNorm))


def replace_layers(model):
    """Turns every torch.nn layer of `model` that gradops has (exact type match) into gradops' layer,
    in place: the module objects, parameters and buffers stay the same. Returns the model."""
    swaps = dict(_SWAPS)
    for m in model.modules():
        cls = swaps.get(type(m))
        if cls is not None:
            m.__class__ = cls
    return model
