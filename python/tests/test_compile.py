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
    def __init__(self, d, ours):
        super().__init__()
        m = gt if ours else nn
        self.ln = m.LayerNorm(d)
        self.fc = nn.Linear(d, d, bias=False)
        self.act = gt.BiasGELU(d) if ours else None
        self.bias = None if ours else nn.Parameter(torch.zeros(d))
        self.sm = m.Softmax(dim=-1)
        self.bn = m.BatchNorm1d(d)

    def forward(self, x):
        h = self.fc(self.ln(x))
        h = self.act(h) if self.act is not None else torch.nn.functional.gelu(h + self.bias)
        return self.sm(self.bn(h))


@needs_24
@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph(device):
    torch.manual_seed(0)
    model = Block(16, ours=True).to(device)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(8, 16, device=device, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    ref = Block(16, ours=True).to(device)
    ref.load_state_dict(model.state_dict())
    y = compiled(x)
    y_ref = ref(x2)
    torch.testing.assert_close(y, y_ref)
    y.sum().backward()
    y_ref.sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(model.bn.running_mean, ref.bn.running_mean)
