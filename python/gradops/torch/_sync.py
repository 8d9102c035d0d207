"""SyncBatchNorm: BatchNorm whose batch statistics span every process of a torch.distributed group.

The library splits each BatchNorm pass in two around a sum that the caller adds up across
processes: BatchNormStatsReduce / BatchNormStatsApply forward, BatchNormGradReduce /
BatchNormGradApply backward. Each reduce writes one tensor of per-channel sums together with the
count of values they cover, so one ``torch.distributed.all_reduce`` of that tensor per pass is the
whole synchronization: no counts are gathered and the host never waits for the device in between.
The structure (and the gradients of weight and bias being this process's own, which
DistributedDataParallel then averages) is torch.nn.SyncBatchNorm's.

Importing this module raises ImportError when the library lacks the split operators; the package
then has no SyncBatchNorm (gradops.torch.SyncBatchNorm is None).
"""
import torch
import torch.distributed as dist
import torch.nn as nn

from .. import ops as _table

_SPLIT = ("BatchNormStatsReduce", "BatchNormStatsApply", "BatchNormGradReduce", "BatchNormGradApply")
_missing = [n for n in _SPLIT if n not in _table]
if _missing:
    raise ImportError("gradops.torch.SyncBatchNorm needs the library's BatchNorm split operators; this "
                      f"libgradops lacks {', '.join(_missing)}")

# The layers' helpers (defined in gradops.torch before it imports this module).
from . import _attrs, _flags, _ones, _zeros, _stats_dtype, batch_norm  # noqa: E402
from ._ops import run as _run  # noqa: E402

__all__ = ["SyncBatchNorm", "sync_batch_norm"]


def _all_reduce(sums, group):
    # Every participant's sums (both per-channel sums and the count) added in one collective, on
    # the tensor's device: NCCL on CUDA tensors, gloo on CPU ones.
    dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group)


class _SyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, ort_momentum, has_weight, update, group):
        x = x.contiguous()
        sums = _run("BatchNormStatsReduce", (x, running_mean), _attrs("BatchNormStatsReduce"),
                    _flags("BatchNormStatsReduce", "sums"))[0]
        _all_reduce(sums, group)
        want = ("Y", "running_mean", "running_var", "saved_mean", "saved_inv_std") if update else \
            ("Y", "saved_mean", "saved_inv_std")
        res = _run("BatchNormStatsApply", (x, weight, bias, running_mean, running_var, sums),
                   _attrs("BatchNormStatsApply", epsilon=eps, momentum=ort_momentum),
                   _flags("BatchNormStatsApply", *want))
        if update:
            y, new_mean, new_var, mean, inv_std = res
        else:
            (y, mean, inv_std), new_mean, new_var = res, None, None
        ctx.save_for_backward(x, weight, mean, inv_std)
        ctx.has_weight, ctx.group = has_weight, group
        ctx.mark_non_differentiable(*[t for t in (new_mean, new_var) if t is not None])
        return (y, new_mean, new_var) if update else (y,)

    @staticmethod
    def backward(ctx, dy, *unused):
        x, weight, mean, inv_std = ctx.saved_tensors
        dy = dy.contiguous()
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.has_weight and any(ctx.needs_input_grad[1:3])
        dx = dw = db = None
        if need_dx or need_dw:
            sums = _run("BatchNormGradReduce", (dy, x, mean, inv_std), _attrs("BatchNormGradReduce"),
                        _flags("BatchNormGradReduce", "sums"))[0]
            if need_dw:
                # torch.nn.SyncBatchNorm's weight and bias gradients are this process's own sums
                # (sum(dY * xhat) and sum(dY), the first 2C values of `sums`, as the op's schema
                # lays them out); DistributedDataParallel averages them like every other gradient.
                c = weight.shape[0]
                db = sums[:c].to(weight.dtype, copy=True)  # copies: the all-reduce below is in place
                dw = sums[c:2 * c].to(weight.dtype, copy=True)
            if need_dx:  # the same on every participant, so every one takes part in the all-reduce
                _all_reduce(sums, ctx.group)
                dx = _run("BatchNormGradApply", (dy, x, weight, mean, inv_std, sums), _attrs("BatchNormGradApply"),
                          _flags("BatchNormGradApply", "X_grad"))[0]
        return dx, dw, db, None, None, None, None, None, None, None


def sync_batch_norm(x, running_mean, running_var, weight=None, bias=None, momentum=0.1, eps=1e-5, group=None):
    """Training-mode batch_norm with statistics over every process of `group` (default: the whole
    world): running statistics updated in place, PyTorch's momentum (the weight of the new value)."""
    c = x.shape[1]
    w = weight if weight is not None else _ones(c, x)
    b = bias if bias is not None else _zeros(c, x)
    update = running_mean is not None
    stats = _stats_dtype(x.dtype, w.dtype, running_mean.dtype if update else w.dtype)
    if update:
        rm, rv = running_mean, running_var
        if stats != rm.dtype:  # e.g. bf16 running statistics: the op keeps them in a wider type
            rm, rv = rm.to(stats), rv.to(stats)
    else:  # the sums are taken about zero; the running outputs are not asked for
        rm = torch.zeros(c, dtype=stats, device=x.device)
        rv = torch.ones(c, dtype=stats, device=x.device)
    res = _SyncBatchNorm.apply(x, w, b, rm, rv, eps, 1.0 - momentum, weight is not None, update,
                               group if group is not None else dist.group.WORLD)
    if update:
        with torch.no_grad():
            running_mean.copy_(res[1])
            running_var.copy_(res[2])
    return res[0]


class SyncBatchNorm(nn.SyncBatchNorm):
    """torch.nn.SyncBatchNorm on gradops' BatchNorm split operators: CPU tensors (gloo) as well
    as CUDA ones (NCCL). Without an initialized process group, with a group of one, and in eval
    mode it is a BatchNorm of this process's batch, as torch.nn.SyncBatchNorm is."""

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        if input.dim() > 1 and input.shape[1] == 0:
            raise ValueError("SyncBatchNorm number of input channels should be non-zero")
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # the cumulative average
                factor = 1.0 / float(self.num_batches_tracked)
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        running_mean = self.running_mean if track else None
        running_var = self.running_var if track else None
        group = None
        if bn_training and self.training and dist.is_available() and dist.is_initialized():
            group = self.process_group if self.process_group else dist.group.WORLD
            if dist.get_world_size(group) <= 1:
                group = None
        if group is None:
            return batch_norm(input, running_mean, running_var, self.weight, self.bias, bn_training, factor,
                              self.eps)
        return sync_batch_norm(input, running_mean, running_var, self.weight, self.bias, factor, self.eps, group)

    @classmethod
    def convert_sync_batchnorm(cls, module, process_group=None):
        """torch.nn.SyncBatchNorm.convert_sync_batchnorm with gradops' SyncBatchNorm: every
        BatchNorm*d of `module` (torch.nn's or gradops') becomes one, sharing its parameters and
        buffers. Returns the module (a new one if `module` itself is a BatchNorm)."""
        out = module
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            ref = module.running_mean if module.running_mean is not None else module.weight
            kw = {} if ref is None else {"device": ref.device, "dtype": ref.dtype}
            out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                      process_group, **kw)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
            if hasattr(module, "qconfig"):
                out.qconfig = module.qconfig
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return out


convert_sync_batchnorm = SyncBatchNorm.convert_sync_batchnorm
