"""gradops.torch.SyncBatchNorm in 2 processes: gloo on the CPU, NCCL on two GPUs. Outputs, input
and parameter gradients and running statistics must match a single process's BatchNorm on the
concatenated batch, and (on GPUs) torch.nn.SyncBatchNorm on the same global batch."""
import os
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import gradops.torch as gt  # noqa: E402

WORLD = 2
C = 5


def _blocked():
    if gt.SyncBatchNorm is None:
        return ("blocked: this libgradops has no BatchNorm reduce/apply operators, which SyncBatchNorm "
                "needs to all-reduce per-channel sums between the two passes")
    return None


def _global_batch(steps, shape):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5).float() for _ in range(steps)], \
        [torch.randn(shape, generator=g) for _ in range(steps)]


def _worker(rank, backend, init_file, result_dir, shape):
    sys.path[:0] = [p for p in os.environ.get("GRADOPS_TEST_PATH", "").split(os.pathsep) if p]
    import gradops.torch as gt  # noqa: F811 - in the child
    dev = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    xs, gs = _global_batch(3, shape)
    n = shape[0] // WORLD
    torch.manual_seed(1)
    ours = gt.SyncBatchNorm(C, momentum=0.2).to(dev)
    with torch.no_grad():
        ours.weight.copy_(torch.linspace(0.5, 1.5, C))
        ours.bias.copy_(torch.linspace(-1, 1, C))
    ref = None
    if backend == "nccl":
        ref = torch.nn.SyncBatchNorm(C, momentum=0.2).to(dev)
        ref.load_state_dict(ours.state_dict())
    res = {"y": [], "dx": [], "dw": [], "db": [], "rm": [], "rv": [], "ref": []}
    for x, g in zip(xs, gs):
        xl = x[rank * n:(rank + 1) * n].to(dev).requires_grad_()
        y = ours(xl)
        y.backward(g[rank * n:(rank + 1) * n].to(dev))
        res["y"].append(y.detach().cpu())
        res["dx"].append(xl.grad.cpu())
        res["dw"].append(ours.weight.grad.clone().cpu())
        res["db"].append(ours.bias.grad.clone().cpu())
        res["rm"].append(ours.running_mean.clone().cpu())
        res["rv"].append(ours.running_var.clone().cpu())
        ours.zero_grad()
        if ref is not None:
            xr = x[rank * n:(rank + 1) * n].to(dev).requires_grad_()
            yr = ref(xr)
            yr.backward(g[rank * n:(rank + 1) * n].to(dev))
            res["ref"].append({"y": yr.detach().cpu(), "dx": xr.grad.cpu(), "dw": ref.weight.grad.clone().cpu(),
                               "db": ref.bias.grad.clone().cpu(), "rm": ref.running_mean.clone().cpu(),
                               "rv": ref.running_var.clone().cpu()})
            ref.zero_grad()
    torch.save(res, os.path.join(result_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def _run(backend, shape):
    with tempfile.TemporaryDirectory() as d:
        os.environ["GRADOPS_TEST_PATH"] = os.pathsep.join(sys.path)
        mp.spawn(_worker, args=(backend, os.path.join(d, "init"), d, shape), nprocs=WORLD, join=True)
        ranks = [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(WORLD)]
    # The single-process reference on the concatenated batch.
    xs, gs = _global_batch(3, shape)
    single = torch.nn.BatchNorm1d(C, momentum=0.2) if len(shape) < 4 else torch.nn.BatchNorm2d(C, momentum=0.2)
    with torch.no_grad():
        single.weight.copy_(torch.linspace(0.5, 1.5, C))
        single.bias.copy_(torch.linspace(-1, 1, C))
    n = shape[0] // WORLD
    for step, (x, g) in enumerate(zip(xs, gs)):
        x = x.clone().requires_grad_()
        y = single(x)
        y.backward(g)
        for r, res in enumerate(ranks):
            sl = slice(r * n, (r + 1) * n)
            torch.testing.assert_close(res["y"][step], y.detach()[sl], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(res["dx"][step], x.grad[sl], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(res["dw"][step], single.weight.grad, atol=1e-4, rtol=1e-5)
            torch.testing.assert_close(res["db"][step], single.bias.grad, atol=1e-4, rtol=1e-5)
            torch.testing.assert_close(res["rm"][step], single.running_mean, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(res["rv"][step], single.running_var, atol=1e-6, rtol=1e-5)
            for k, v in (res["ref"][step].items() if res["ref"] else []):
                torch.testing.assert_close(res[k][step], v, atol=1e-4, rtol=1e-5, msg=lambda m: f"{k} vs torch.nn.SyncBatchNorm: {m}")
        single.zero_grad()


@pytest.mark.parametrize("shape", [(8, C), (6, C, 4, 3)], ids=["1d", "2d"])
def test_sync_batch_norm_gloo_cpu(shape):
    reason = _blocked()
    if reason:
        pytest.xfail(reason)
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    _run("gloo", shape)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs two CUDA devices")
@pytest.mark.parametrize("shape", [(8, C), (6, C, 4, 3)], ids=["1d", "2d"])
def test_sync_batch_norm_nccl_two_gpus(shape):
    reason = _blocked()
    if reason:
        pytest.xfail(reason)
    import gradops
    if not gradops.ops["BatchNormInternal"].supports(("float32", "float32", "float32"), "cuda"):
        pytest.xfail("blocked: this libgradops has no CUDA BatchNorm kernels")
    _run("nccl", shape)
