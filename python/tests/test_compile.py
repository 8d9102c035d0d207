"""torch.library registration: opcheck and torch.compile(fullgraph=True) on PyTorch >= 2.4."""
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import gradops.torch as gt  # noqa: E402

_version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
needs_24 = pytest.mark.skipif(_version < (2, 4) or not gt.registered,
                              reason=f"torch.library define/impl/register_fake needs PyTorch >= 2.4 "
                                     f"(this is {torch.__version__}): the layers run eagerly")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_registration_matches_version():
    if _version >= (2, 4):
        assert gt.registered and hasattr(torch.ops.gradops, "run")
    else:
        assert not gt.registered


@needs_24
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    from torch.library import opcheck
    x = torch.randn(4, 8, device=device)
    w = torch.randn(8, device=device)
    b = torch.randn(8, device=device)
    opcheck(torch.ops.gradops.run.default, ("LayerNormalization", [x, w, b], [-1.0, 1e-5, 1.0], [True, True, True]))
    opcheck(torch.ops.gradops.run.default, ("Gelu", [x], [], [True]))
    opcheck(torch.ops.gradops.run.default, ("BiasGeluGrad_dX", [x, x, b], [], [True, True]))


class Block(nn.Module):
    def __init__(self, d, ours, bn=True):
        super().__init__()
        m = gt if ours else nn
        self.ln = m.LayerNorm(d)
        self.fc = nn.Linear(d, d, bias=False)
        self.act = gt.BiasGELU(d) if ours else None
        self.bias = None if ours else nn.Parameter(torch.zeros(d))
        self.sm = m.Softmax(dim=-1)
        self.bn = m.BatchNorm1d(d) if bn else None

    def forward(self, x):
        h = self.fc(self.ln(x))
        h = self.act(h) if self.act is not None else torch.nn.functional.gelu(h + self.bias)
        if self.bn is not None:
            h = self.bn(h)
        return self.sm(h)


def _batch_norm_blocked(device):
    """The library's message when this build has no BatchNorm kernel on `device` (CUDA until the
    CUDA BatchNorm kernels land), else None."""
    import gradops
    x = torch.randn(4, 3, device=device)
    c = torch.ones(3, device=device)
    try:
        gradops.BatchNormInternal(x, c, c, c, c)
    except NotImplementedError as e:
        return f"blocked: {e}"
    return None


@needs_24
@pytest.mark.parametrize("bn", [False, True], ids=["ln-gelu-softmax", "with-batchnorm"])
@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device, bn):
    if bn:
        reason = _batch_norm_blocked(device)
        if reason:
            pytest.xfail(reason)
    torch.manual_seed(0)
    model = Block(16, ours=True, bn=bn).to(device)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(8, 16, device=device, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    ref = Block(16, ours=True, bn=bn).to(device)
    ref.load_state_dict(model.state_dict())
    for step in range(2):  # the second call runs the compiled graph again (no retrace)
        x.grad = x2.grad = None
        y = compiled(x)
        y_ref = ref(x2)
        torch.testing.assert_close(y, y_ref)
        y.sum().backward()
        y_ref.sum().backward()
        torch.testing.assert_close(x.grad, x2.grad)
        for (name, p), (_, p_ref) in zip(model.named_parameters(), ref.named_parameters()):
            torch.testing.assert_close(p.grad, p_ref.grad, msg=lambda m, name=name: f"grad of {name}: {m}")
            p.grad = p_ref.grad = None
        if bn:
            torch.testing.assert_close(model.bn.running_mean, ref.bn.running_mean)
            torch.testing.assert_close(model.bn.running_var, ref.bn.running_var)
            assert int(model.bn.num_batches_tracked) == step + 1


@needs_24
@pytest.mark.parametrize("device", DEVICES)
def test_compile_inference_no_grad(device):
    """Under torch.no_grad the layers skip autograd eagerly; compiled, they still trace in one graph."""
    torch.manual_seed(0)
    model = Block(16, ours=True, bn=False).to(device).eval()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(8, 16, device=device)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
