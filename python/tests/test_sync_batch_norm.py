"""gradops.torch.SyncBatchNorm in 2 processes: gloo on the CPU, NCCL on two GPUs.

Each process normalizes its slice of one global batch (the slices may differ in size). Outputs,
input gradients and running statistics must match a single process's BatchNorm on the
concatenated batch (torch.nn's and gradops'), and the weight and bias gradients, which are each
process's own as in torch.nn.SyncBatchNorm, must add up to the single process's. On GPUs every
value must also match torch.nn.SyncBatchNorm on the same slices (it runs on CUDA only)."""
import os
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import gradops  # noqa: E402
import gradops.torch as gt  # noqa: E402

WORLD = 2
C = 5
STEPS = 3
SPLIT_OPS = ("BatchNormStatsReduce", "BatchNormStatsApply", "BatchNormGradReduce", "BatchNormGradApply")


def test_sync_batch_norm_exists():
    """The library has the BatchNorm split operators, so gradops.torch has SyncBatchNorm."""
    missing = [n for n in SPLIT_OPS if n not in gradops.ops]
    assert not missing, f"this libgradops lacks {', '.join(missing)}"
    assert gt.SyncBatchNorm is not None and issubclass(gt.SyncBatchNorm, torch.nn.SyncBatchNorm)


def _global_batch(shape):
    g = torch.Generator().manual_seed(0)
    xs = [(torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5).float() for _ in range(STEPS)]
    gs = [torch.randn(shape, generator=g) for _ in range(STEPS)]
    return xs, gs


def _bounds(sizes):
    starts = [sum(sizes[:r]) for r in range(len(sizes))]
    return [slice(s, s + n) for s, n in zip(starts, sizes)]


def _init(module, momentum):
    with torch.no_grad():
        module.weight.copy_(torch.linspace(0.5, 1.5, C))
        module.bias.copy_(torch.linspace(-1, 1, C))
    return module


def _worker(rank, backend, init_file, result_dir, shape, sizes, momentum):
    sys.path[:0] = [p for p in os.environ.get("GRADOPS_TEST_PATH", "").split(os.pathsep) if p]
    import gradops.torch as gt  # noqa: F811 - in the child
    torch.set_num_threads(1)
    dev = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        xs, gs = _global_batch(shape)
        sl = _bounds(sizes)[rank]
        ours = _init(gt.SyncBatchNorm(C, momentum=momentum), momentum).to(dev)
        ref = None
        if backend == "nccl":
            ref = torch.nn.SyncBatchNorm(C, momentum=momentum).to(dev)
            ref.load_state_dict(ours.state_dict())
        res = {"y": [], "dx": [], "dw": [], "db": [], "rm": [], "rv": [], "ref": []}
        for x, g in zip(xs, gs):
            xl = x[sl].to(dev).requires_grad_()
            y = ours(xl)
            y.backward(g[sl].to(dev))
            res["y"].append(y.detach().cpu())
            res["dx"].append(xl.grad.cpu())
            res["dw"].append(ours.weight.grad.clone().cpu())
            res["db"].append(ours.bias.grad.clone().cpu())
            res["rm"].append(ours.running_mean.clone().cpu())
            res["rv"].append(ours.running_var.clone().cpu())
            ours.zero_grad()
            if ref is not None:
                xr = x[sl].to(dev).requires_grad_()
                yr = ref(xr)
                yr.backward(g[sl].to(dev))
                res["ref"].append({"y": yr.detach().cpu(), "dx": xr.grad.cpu(), "dw": ref.weight.grad.clone().cpu(),
                                   "db": ref.bias.grad.clone().cpu(), "rm": ref.running_mean.clone().cpu(),
                                   "rv": ref.running_var.clone().cpu()})
                ref.zero_grad()
        res["batches"] = int(ours.num_batches_tracked)
        torch.save(res, os.path.join(result_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _spawn(backend, shape, sizes, momentum):
    with tempfile.TemporaryDirectory() as d:
        os.environ["GRADOPS_TEST_PATH"] = os.pathsep.join(sys.path)
        if backend == "gloo":
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # both processes are on this host
        mp.spawn(_worker, args=(backend, os.path.join(d, "init"), d, shape, sizes, momentum), nprocs=WORLD,
                 join=True)
        return [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(WORLD)]


def _check(ranks, shape, sizes, momentum):
    xs, gs = _global_batch(shape)
    nn_bn = torch.nn.BatchNorm1d if len(shape) < 4 else torch.nn.BatchNorm2d
    gt_bn = gt.BatchNorm1d if len(shape) < 4 else gt.BatchNorm2d
    singles = {"torch.nn": _init(nn_bn(C, momentum=momentum), momentum),
               "gradops": _init(gt_bn(C, momentum=momentum), momentum)}
    bounds = _bounds(sizes)
    close = torch.testing.assert_close
    for step, (x, g) in enumerate(zip(xs, gs)):
        for who, single in singles.items():
            xg = x.clone().requires_grad_()
            y = single(xg)
            y.backward(g)
            for r, res in enumerate(ranks):
                def say(what, r=r, who=who, step=step):
                    return lambda m: f"rank {r}, step {step}, {what} vs one process on the whole batch ({who}): {m}"
                close(res["y"][step], y.detach()[bounds[r]], atol=1e-5, rtol=1e-5, msg=say("Y"))
                close(res["dx"][step], xg.grad[bounds[r]], atol=1e-5, rtol=1e-5, msg=say("dX"))
                close(res["rm"][step], single.running_mean, atol=1e-6, rtol=1e-5, msg=say("running_mean"))
                close(res["rv"][step], single.running_var, atol=1e-6, rtol=1e-5, msg=say("running_var"))
            # Weight and bias gradients are each process's own (torch.nn.SyncBatchNorm's convention):
            # together they are the whole batch's.
            close(sum(res["dw"][step] for res in ranks), single.weight.grad, atol=1e-4, rtol=1e-5,
                  msg=lambda m, who=who, step=step: f"step {step}, dW summed over ranks vs {who}: {m}")
            close(sum(res["db"][step] for res in ranks), single.bias.grad, atol=1e-4, rtol=1e-5,
                  msg=lambda m, who=who, step=step: f"step {step}, dB summed over ranks vs {who}: {m}")
            single.zero_grad()
    for r, res in enumerate(ranks):
        assert res["batches"] == STEPS
        for step, ref in enumerate(res["ref"]):
            for k, v in ref.items():
                close(res[k][step], v, atol=1e-4, rtol=1e-5,
                      msg=lambda m, k=k, r=r, step=step: f"rank {r}, step {step}, {k} vs torch.nn.SyncBatchNorm: {m}")


CASES = [((8, C), (4, 4), 0.2), ((6, C, 4, 3), (3, 3), 0.2), ((6, C, 4, 3), (2, 4), 0.2), ((7, C, 3), (5, 2), None)]
IDS = ["1d", "2d", "2d-uneven", "3d-input-uneven-cumulative"]


@pytest.mark.parametrize("shape,sizes,momentum", CASES, ids=IDS)
def test_sync_batch_norm_gloo_cpu(shape, sizes, momentum):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available in this PyTorch")
    _check(_spawn("gloo", shape, sizes, momentum), shape, sizes, momentum)


def _cuda_kernels_blocked():
    """The library's own message when it lacks a CUDA kernel of one of the split operators (until
    the CUDA BatchNorm kernels land), else None: each runs once on a small CUDA batch."""
    x = torch.randn(2, C, device="cuda")
    mean, var = torch.zeros(C, device="cuda"), torch.ones(C, device="cuda")
    try:
        sums = gradops.BatchNormStatsReduce(x, mean)
        _, _, _, saved_mean, saved_inv_std = gradops.BatchNormStatsApply(x, var, mean, mean, var, sums)
        gsums = gradops.BatchNormGradReduce(x, x, saved_mean, saved_inv_std)
        gradops.BatchNormGradApply(x, x, var, saved_mean, saved_inv_std, gsums)
    except NotImplementedError as e:
        return f"blocked: {e}"
    return None


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs two CUDA devices")
@pytest.mark.parametrize("shape,sizes,momentum", CASES, ids=IDS)
def test_sync_batch_norm_nccl_two_gpus(shape, sizes, momentum):
    if not dist.is_nccl_available():
        pytest.skip("torch.distributed with NCCL is not available in this PyTorch")
    reason = _cuda_kernels_blocked()
    if reason:
        pytest.xfail(reason)
    _check(_spawn("nccl", shape, sizes, momentum), shape, sizes, momentum)


def test_sync_batch_norm_single_process_is_batch_norm():
    """Without an initialized process group (or in eval mode) it is a BatchNorm of this batch."""
    assert not dist.is_available() or not dist.is_initialized()
    torch.manual_seed(3)
    ref = _init(torch.nn.BatchNorm2d(C, momentum=0.3), 0.3)
    ours = gt.SyncBatchNorm(C, momentum=0.3)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, C, 3, 2)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = ref(x1), ours(x2)
    torch.testing.assert_close(y2, y1, atol=1e-5, rtol=1e-5)
    y1.backward(torch.ones_like(y1) + x)
    y2.backward(torch.ones_like(y2) + x)
    torch.testing.assert_close(x2.grad, x1.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.weight.grad, ref.weight.grad, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(ours.running_var, ref.running_var)
    ref.eval()
    ours.eval()
    torch.testing.assert_close(ours(x), ref(x))


def test_convert_sync_batchnorm_shares_parameters():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, C, 1), torch.nn.BatchNorm2d(C),
                                torch.nn.Sequential(gt.BatchNorm2d(C, momentum=None, affine=False)))
    bn, inner = model[1], model[2][0]
    converted = gt.SyncBatchNorm.convert_sync_batchnorm(model)
    assert converted is model
    assert type(model[1]) is gt.SyncBatchNorm and type(model[2][0]) is gt.SyncBatchNorm
    assert model[1].weight is bn.weight and model[1].running_mean is bn.running_mean
    assert model[2][0].momentum is None and model[2][0].weight is None
    assert model[2][0].running_var is inner.running_var
    assert list(model.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean",
                                        "1.running_var", "1.num_batches_tracked", "2.0.running_mean",
                                        "2.0.running_var", "2.0.num_batches_tracked"]
    single = gt.SyncBatchNorm.convert_sync_batchnorm(torch.nn.BatchNorm1d(4).double())
    assert type(single) is gt.SyncBatchNorm and single.weight.dtype == torch.float64
    # replace_layers turns torch.nn.SyncBatchNorm into gradops' in place.
    m = torch.nn.Sequential(torch.nn.SyncBatchNorm(C))
    gt.replace_layers(m)
    assert type(m[0]) is gt.SyncBatchNorm
