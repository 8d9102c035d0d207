"""gradops.torch's layers against their torch.nn counterparts: outputs, gradients, parameters,
buffers and state_dict keys; gradcheck in f64; f16/bf16 within tolerance."""
import copy

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import gradops  # noqa: E402
import gradops.torch as gt  # noqa: E402

if not gradops.has_shape_inference:
    pytest.skip("this libgradops has no output-shape inference (the layers allocate their outputs)",
                allow_module_level=True)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _rmsnorm_ref(x, normalized_shape, weight, eps):
    dims = tuple(range(-len(normalized_shape), 0))
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    return y * weight if weight is not None else y


class QuickGELURef(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class BiasGELURef(nn.Module):
    def __init__(self, n, approximate="none"):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(n))
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x + self.bias, approximate=self.approximate) if self.approximate != "none" else F.gelu(x + self.bias)


class RMSNormRef(nn.Module):
    def __init__(self, shape, eps=None, elementwise_affine=True):
        super().__init__()
        self.normalized_shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(self.normalized_shape)) if elementwise_affine else None

    def forward(self, x):
        return _rmsnorm_ref(x, self.normalized_shape, self.weight, self.eps)


def _gelu_tanh_supported():
    try:
        nn.GELU(approximate="tanh")
        return True
    except TypeError:
        return False


def _pairs():
    """(id, reference module, gradops module, input shape)."""
    p = [
        ("LayerNorm", lambda: nn.LayerNorm(16), lambda: gt.LayerNorm(16), (4, 5, 16)),
        ("LayerNorm2d_noaffine", lambda: nn.LayerNorm((5, 16), elementwise_affine=False),
         lambda: gt.LayerNorm((5, 16), elementwise_affine=False), (4, 5, 16)),
        ("LayerNorm_eps", lambda: nn.LayerNorm(33, eps=1e-2), lambda: gt.LayerNorm(33, eps=1e-2), (7, 33)),
        ("GELU", lambda: nn.GELU(), lambda: gt.GELU(), (3, 40)),
        ("Softmax", lambda: nn.Softmax(dim=-1), lambda: gt.Softmax(dim=-1), (3, 4, 17)),
        ("Softmax_dim1", lambda: nn.Softmax(dim=1), lambda: gt.Softmax(dim=1), (3, 4, 17)),
        ("LogSoftmax", lambda: nn.LogSoftmax(dim=-1), lambda: gt.LogSoftmax(dim=-1), (6, 33)),
        ("QuickGELU", lambda: QuickGELURef(), lambda: gt.QuickGELU(), (5, 9)),
        ("BiasGELU", lambda: BiasGELURef(12), lambda: gt.BiasGELU(12), (4, 3, 12)),
        ("BatchNorm1d", lambda: nn.BatchNorm1d(6), lambda: gt.BatchNorm1d(6), (8, 6)),
        ("BatchNorm1d_3d", lambda: nn.BatchNorm1d(6), lambda: gt.BatchNorm1d(6), (8, 6, 5)),
        ("BatchNorm2d", lambda: nn.BatchNorm2d(3), lambda: gt.BatchNorm2d(3), (4, 3, 5, 7)),
        ("BatchNorm3d", lambda: nn.BatchNorm3d(2, momentum=0.3), lambda: gt.BatchNorm3d(2, momentum=0.3), (2, 2, 3, 4, 5)),
        ("BatchNorm2d_cma", lambda: nn.BatchNorm2d(3, momentum=None), lambda: gt.BatchNorm2d(3, momentum=None), (4, 3, 5, 5)),
        ("BatchNorm2d_noaffine", lambda: nn.BatchNorm2d(3, affine=False), lambda: gt.BatchNorm2d(3, affine=False), (4, 3, 5, 5)),
        ("BatchNorm2d_nostats", lambda: nn.BatchNorm2d(3, track_running_stats=False),
         lambda: gt.BatchNorm2d(3, track_running_stats=False), (4, 3, 5, 5)),
    ]
    if _gelu_tanh_supported():
        p.append(("GELU_tanh", lambda: nn.GELU(approximate="tanh"), lambda: gt.GELU(approximate="tanh"), (3, 40)))
        p.append(("BiasGELU_tanh", lambda: BiasGELURef(12, "tanh"), lambda: gt.BiasGELU(12, "tanh"), (4, 12)))
    rms_ref = (lambda s, **k: nn.RMSNorm(s, **k)) if hasattr(nn, "RMSNorm") else (lambda s, **k: RMSNormRef(s, **k))
    p.append(("RMSNorm", lambda: rms_ref(16), lambda: gt.RMSNorm(16), (4, 5, 16)))
    p.append(("RMSNorm_eps", lambda: rms_ref(16, eps=1e-3), lambda: gt.RMSNorm(16, eps=1e-3), (4, 16)))
    p.append(("RMSNorm_noaffine", lambda: rms_ref((2, 8), elementwise_affine=False),
              lambda: gt.RMSNorm((2, 8), elementwise_affine=False), (3, 2, 8)))
    return p


PAIRS = _pairs()
TOL = {torch.float32: (2e-5, 1e-5), torch.float64: (1e-12, 1e-12), torch.float16: (2e-2, 1e-2),
       torch.bfloat16: (6e-2, 2e-2)}


def _randomize(ref):
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(torch.randn_like(p) * 0.5 + (1.0 if p.dim() and "weight" in _name(ref, p) else 0.0))
        for name, b in ref.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn_like(b) * 0.1)
            elif name.endswith("running_var"):
                b.copy_(torch.rand_like(b) + 0.5)


def _name(mod, param):
    for n, p in mod.named_parameters():
        if p is param:
            return n
    return ""


def _compare(ref_mod, our_mod, shape, dtype, device, train=True, steps=2, tol=None):
    atol, rtol = tol or TOL[dtype]
    ref_mod = ref_mod.to(device=device, dtype=dtype).train(train)
    our_mod = our_mod.to(device=device, dtype=dtype).train(train)
    assert list(ref_mod.state_dict()) == list(our_mod.state_dict())
    for _ in range(steps):  # two steps: running statistics carry over
        x = (torch.randn(shape, dtype=torch.float64) * 1.5 + 0.25).to(device=device, dtype=dtype)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        y1, y2 = ref_mod(x1), our_mod(x2)
        assert y2.dtype == y1.dtype and y2.shape == y1.shape
        torch.testing.assert_close(y2.double(), y1.double(), atol=atol * 4, rtol=rtol * 4)
        g = torch.randn_like(y1)
        y1.backward(g)
        y2.backward(g)
        torch.testing.assert_close(x2.grad.double(), x1.grad.double(), atol=atol * 20, rtol=rtol * 20)
        for (n1, p1), (n2, p2) in zip(ref_mod.named_parameters(), our_mod.named_parameters()):
            assert n1 == n2
            torch.testing.assert_close(p2.grad.double(), p1.grad.double(), atol=atol * 200, rtol=rtol * 20,
                                       msg=lambda m: f"grad of {n1}: {m}")
        for (n1, b1), (n2, b2) in zip(ref_mod.named_buffers(), our_mod.named_buffers()):
            assert n1 == n2
            torch.testing.assert_close(b2.double(), b1.double(), atol=atol * 4, rtol=rtol * 4,
                                       msg=lambda m: f"buffer {n1}: {m}")


def _blocked_without_kernel(fn, device):
    """Runs fn; a layer whose operator has no kernel on `device` in this build (BatchNorm on CUDA
    until the CUDA BatchNorm kernels exist) is reported as XFAIL with the library's message, not
    as a pass or a silent skip."""
    try:
        fn()
    except NotImplementedError as e:
        if device == "cpu":
            raise
        pytest.xfail(f"blocked: {e}")

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,make_ref,make_ours,shape", PAIRS, ids=[p[0] for p in PAIRS])
def test_layer_matches_torch_nn_f32(name, make_ref, make_ours, shape, device):
    torch.manual_seed(0)
    ref = make_ref()
    _randomize(ref)
    ours = make_ours()
    ours.load_state_dict(ref.state_dict())
    _blocked_without_kernel(lambda: _compare(ref, ours, shape, torch.float32, device), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,make_ref,make_ours,shape", PAIRS, ids=[p[0] for p in PAIRS])
def test_layer_matches_torch_nn_f64(name, make_ref, make_ours, shape, device):
    torch.manual_seed(1)
    ref = make_ref()
    _randomize(ref)
    ours = make_ours()
    ours.load_state_dict(ref.state_dict())
    # ONNX FLOAT attributes are f32: QuickGelu's alpha and BatchNorm's momentum reach the kernel
    # rounded to f32 (relative 1e-8 and 2.4e-7), and so does a large epsilon: f64 results show it.
    # BatchNorm's running mean moves by (1 - momentum)·(mean - running_mean), and 1 - 0.9f is off by
    # 2.4e-8 absolute: |mean - running_mean| reaches about 0.6 on these inputs, so 1.4e-8 (4 x 1e-8
    # covers it; the f64 arithmetic itself is good to about 1e-16).
    f32_attr = name.startswith(("QuickGELU", "BatchNorm")) or name.endswith("_eps")
    _blocked_without_kernel(
        lambda: _compare(ref, ours, shape, torch.float64, device, tol=(1e-8, 1e-6) if f32_attr else None), device)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,make_ref,make_ours,shape", PAIRS, ids=[p[0] for p in PAIRS])
def test_layer_16bit_within_tolerance(name, make_ref, make_ours, shape, device, dtype):
    """Against the f32 reference (PyTorch's CPU kernels lack some 16-bit ops in older releases):
    gradops in 16 bits within the 16-bit tolerance of PyTorch in f32 on the same (rounded) data."""
    torch.manual_seed(2)
    ref = make_ref()
    _randomize(ref)
    ours = make_ours()
    ours.load_state_dict(ref.state_dict())
    atol, rtol = TOL[dtype]
    ref = ref.to(device=device, dtype=torch.float32).train()
    ours = ours.to(device=device, dtype=dtype).train()
    with torch.no_grad():  # the reference sees the parameters as rounded to 16 bits
        for p in ref.parameters():
            p.copy_(p.to(dtype).float())
    x = (torch.randn(shape) * 1.5).to(device=device, dtype=dtype)
    x1, x2 = x.float().requires_grad_(), x.clone().requires_grad_()
    y1 = ref(x1)
    outputs = []
    _blocked_without_kernel(lambda: outputs.append(ours(x2)), device)
    y2 = outputs[0]
    assert y2.dtype == dtype
    torch.testing.assert_close(y2.float(), y1, atol=atol, rtol=rtol)
    g = torch.randn_like(y1).to(dtype)
    y1.backward(g.float())
    y2.backward(g)
    scale = max(1.0, float(x1.grad.abs().max()))
    torch.testing.assert_close(x2.grad.float(), x1.grad, atol=atol * scale * 4, rtol=rtol * 4)


GRADCHECK = [
    ("gelu", lambda x: gt.gelu(x)),
    ("gelu_tanh", lambda x: gt.gelu(x, "tanh")),
    ("quick_gelu", lambda x: gt.quick_gelu(x)),
    ("softmax", lambda x: gt.softmax(x, -1)),
    ("softmax0", lambda x: gt.softmax(x, 0)),
    ("log_softmax", lambda x: gt.log_softmax(x, 1)),
]


@pytest.mark.parametrize("name,fn", GRADCHECK, ids=[g[0] for g in GRADCHECK])
def test_gradcheck_activations(name, fn):
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fn, (x,))


def test_gradcheck_bias_gelu():
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, b: gt.bias_gelu(x, b), (x, b))
    assert torch.autograd.gradcheck(lambda x, b: gt.bias_gelu(x, b, "tanh"), (x, b))


def test_gradcheck_norms():
    x = torch.randn(4, 3, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: gt.layer_norm(x, (3, 6), w, b), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: gt.rms_norm(x, (6,), w[0], 1e-6), (x, w))


def test_gradcheck_batch_norm():
    x = torch.randn(5, 3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: gt.batch_norm(x, None, None, w, b, training=True), (x, w, b))


def test_eval_mode_batch_norm_uses_running_statistics():
    ref = nn.BatchNorm2d(3)
    _randomize(ref)
    ours = gt.BatchNorm2d(3)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 4, 4)
    torch.testing.assert_close(ours.eval()(x), ref.eval()(x))


def test_drop_in_signatures_and_state_dict():
    assert isinstance(gt.LayerNorm(8), nn.LayerNorm)
    assert isinstance(gt.BatchNorm2d(8), nn.BatchNorm2d)
    assert list(gt.BatchNorm2d(4).state_dict()) == list(nn.BatchNorm2d(4).state_dict())
    assert repr(gt.LayerNorm(8)) == repr(nn.LayerNorm(8))
    m = gt.BatchNorm1d(4)
    with pytest.raises(ValueError):  # torch.nn's own input check
        m(torch.randn(2, 4, 3, 3))


def test_replace_layers_in_place():
    model = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, 4), nn.Softmax(dim=-1))
    params = [id(p) for p in model.parameters()]
    ref = copy.deepcopy(model)
    gt.replace_layers(model)
    assert type(model[1]) is gt.LayerNorm and type(model[2]) is gt.GELU and type(model[4]) is gt.Softmax
    assert [id(p) for p in model.parameters()] == params
    x = torch.randn(5, 8)
    torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)


def test_errors_reach_the_caller():
    m = gt.LayerNorm(8)
    with pytest.raises((ValueError, RuntimeError)):
        m(torch.randn(3, 7))


@pytest.mark.parametrize("device", DEVICES)
def test_layers_without_autograd_match_with_autograd(device):
    """Under torch.no_grad (or with no input requiring grad) the layers run their forward without
    torch.autograd.Function.apply: the same values, and outputs that do not require grad."""
    torch.manual_seed(4)
    x = torch.randn(3, 4, 8, device=device)
    layers = [gt.LayerNorm(8), gt.RMSNorm(8), gt.GELU(), gt.GELU(approximate="tanh"), gt.BiasGELU(8),
              gt.QuickGELU(), gt.Softmax(dim=-1), gt.LogSoftmax(dim=1)]
    for layer in layers:
        layer = layer.to(device)
        _randomize(layer)
        try:
            with_grad = layer(x.clone().requires_grad_())
        except NotImplementedError as e:  # a layer whose op has no kernel on this device
            if device == "cpu":
                raise
            pytest.xfail(f"blocked: {e}")
        with torch.no_grad():
            without = layer(x)
        assert with_grad.requires_grad and not without.requires_grad
        torch.testing.assert_close(without, with_grad.detach(), rtol=0, atol=0,
                                   msg=lambda m, layer=layer: f"{type(layer).__name__}: {m}")
    # Grad enabled but nothing requires grad: a plain functional call.
    y = gt.gelu(x)
    assert not y.requires_grad and y.grad_fn is None
    torch.testing.assert_close(y, F.gelu(x), rtol=1e-6, atol=1e-6)
