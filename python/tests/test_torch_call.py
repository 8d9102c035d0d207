"""The compiled call path for PyTorch tensors (gradops._torch_call): the same outputs, bit for bit,
and the same errors as the Python path, for every operator and dtype of the oracle's cases; calls
it must not take go to the Python path; plans are per call shape and safe across threads.

scripts/test_python.sh builds the package with the extension required and sets
GRADOPS_EXPECT_TORCH_CALL=1, so that a build without it fails here instead of being skipped."""
import os
import threading

import pytest

torch = pytest.importorskip("torch")

import gradops  # noqa: E402
from gradops import _call  # noqa: E402
from test_ops import CASES, _check, _to_array  # noqa: E402

LOADED, WHY = gradops.torch_call()


def test_loaded_where_expected():
    if os.environ.get("GRADOPS_EXPECT_TORCH_CALL") == "1":
        assert LOADED, f"gradops._torch_call: {WHY}"
    elif not LOADED:
        pytest.skip(f"gradops._torch_call: {WHY}")


needs = pytest.mark.skipif(not LOADED, reason=f"gradops._torch_call: {WHY}")


@needs
def test_built_for_the_running_pytorch():
    from gradops import _torch_call
    assert _torch_call.torch_version == torch.__version__


@needs
def test_an_extension_built_for_another_pytorch_is_not_loaded(monkeypatch):
    from gradops import _torch_call
    monkeypatch.setattr(_torch_call, "torch_version", "0.0.0")
    monkeypatch.setattr(_call, "_torch_call_state", [False, ""])
    monkeypatch.setattr(_call, "run", _call._run_python)
    _call._load_torch_call()
    loaded, why = _call._torch_call_state
    assert not loaded and "built for PyTorch 0.0.0" in why and torch.__version__ in why
    assert _call.run is _call._run_python


def _stats():
    from gradops import _torch_call
    return _torch_call.stats()


def _same(a, b):
    """Equal bit for bit (NaN payloads aside: NaN where the other has NaN)."""
    if a is None or b is None:
        return a is None and b is None
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


@needs
@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_same_bits_as_the_python_path(case):
    op = gradops.ops[case["op"]]
    inputs = [None if t is None else _to_array(t, "torch") for t in case["inputs"]]
    wanted = [o.name for o, e in zip(op.outputs, case["outputs"]) if e is not None]
    hits0, misses0, python0 = _stats()
    compiled = gradops.run(case["op"], inputs, case["attributes"], outputs=wanted)
    compiled = gradops.run(case["op"], inputs, case["attributes"], outputs=wanted)  # the plan, found
    hits1, misses1, python1 = _stats()
    assert (hits1 - hits0, misses1 - misses0, python1 - python0) == (1, 1, 0) or \
        (hits1 - hits0, python1 - python0) == (2, 0), "the call did not take the compiled path"
    attrs = gradops._attr_values(op, case["attributes"])
    python = _call._run_python(op, inputs, attrs, gradops._want(op, wanted))
    for o, (a, b) in enumerate(zip(compiled, python)):
        assert _same(a, b), f"{case['case']}: output {op.outputs[o].name} differs from the Python path"
    # Outputs of types no input carries may differ from the case's signature (test_ops says why).
    carried = {a.type_var for a in op.inputs}
    res = [r if r is None or op.outputs[o].type_var in carried else None for o, r in enumerate(compiled)]
    _check(case, res, allow_missing=True)
    # Into outputs given with out= (poisoned: every element must be written), the same bits.
    out = [None if e is None else _to_array(dict(e["tensor"], values=[float("nan")] * len(e["tensor"]["values"])),
                                            "torch") for e in case["outputs"]]
    hits = _stats()[0]
    given = gradops.run(case["op"], inputs, case["attributes"], outputs=wanted, out=out)
    gradops.run(case["op"], inputs, case["attributes"], outputs=wanted, out=out)
    assert _stats()[0] >= hits + 1, "a call with out= did not take the compiled path"
    assert all(g is o for g, o in zip(given, out) if o is not None)
    expect = _call._run_python(op, inputs, attrs, gradops._want(op, wanted), list(out))
    for o, (a, b) in enumerate(zip(given, expect)):
        if a is not None and op.outputs[o].type_var in carried:
            assert _same(a, b), f"{case['case']}: output {op.outputs[o].name} (out=) differs from the Python path"


@needs
def test_calls_it_must_not_take_go_to_the_python_path():
    x = torch.randn(4, 6)
    gradops.Softmax_13(x)
    cases = {
        "non-contiguous": lambda: gradops.Softmax_13(x.t()),
        "out= not contiguous": lambda: gradops.Softmax_13(x, out=torch.empty(6, 4).t()),
        "out= not asked for": lambda: gradops.LayerNormalization(x, torch.ones(6), outputs=("Y",),
                                                                 out=(None, torch.empty(4, 1))),
        "numpy": lambda: gradops.Softmax_13(x.numpy()),
        "numpy scalar attribute": lambda: gradops.Softmax_13(x, axis=__import__("numpy").int64(0)),
        "int64 tensor": lambda: gradops.Gelu(torch.ones(3, dtype=torch.int64)),
    }
    for name, call in cases.items():
        before = _stats()[2]
        try:
            call()
        except (TypeError, ValueError, NotImplementedError):
            pass  # an error is the Python path's to raise; where it came from is what is checked
        assert _stats()[2] == before + 1, f"{name}: not handed to the Python path"
    # The Python path's answer for a transposed input is the contiguous input's.
    assert torch.equal(gradops.Softmax_13(x.t()), gradops.Softmax_13(x.t().contiguous()))


@needs
def test_out_is_written_in_place_on_the_compiled_path():
    x = torch.randn(5, 9)
    y = torch.full_like(x, float("nan"))
    gradops.Softmax_13(x, out=y)
    hits = _stats()[0]
    r = gradops.Softmax_13(x, out=y)
    assert r is y and _stats()[0] == hits + 1
    assert torch.equal(y, gradops.Softmax_13(x))
    # In place where the schema allows it (GeluGrad's dX may be dY): the out-of-place bits.
    dy, xx = torch.randn(5, 9), torch.randn(5, 9)
    want = gradops.GeluGrad(dy, xx)
    d = dy.clone()
    assert gradops.GeluGrad(d, xx, out=d) is d
    assert torch.equal(d, want)
    # A wrong shape given is the library's error, with its message, and writes nothing.
    bad = torch.zeros(5, 8)
    with pytest.raises(ValueError, match="Softmax_13"):
        gradops.Softmax_13(x, out=bad)
    assert torch.equal(bad, torch.zeros(5, 8))


@needs
def test_parameters_take_the_compiled_path():
    w = torch.nn.Parameter(torch.randn(3, 5))
    gradops.Gelu(w)
    hits = _stats()[0]
    y = gradops.Gelu(w)
    assert _stats()[0] == hits + 1
    assert torch.equal(y, gradops.Gelu(w.detach().clone()))


@needs
def test_errors_are_the_python_paths():
    x = torch.randn(2, 3)
    for call in (lambda: gradops.Softmax_13(x, axis=7),
                 lambda: gradops.GeluGrad(torch.randn(2, 4), x),
                 lambda: gradops.GeluGrad(x, x.double())):
        with pytest.raises(ValueError) as compiled:
            call()
        with pytest.raises(ValueError) as python:
            prev = _call.run
            _call.run = _call._run_python
            try:
                call()
            finally:
                _call.run = prev
        assert str(compiled.value) == str(python.value)


@needs
def test_plans_are_keyed_by_every_attribute_shape_and_dtype():
    x = torch.randn(3, 8)
    s, b = torch.rand(8) + 0.5, torch.randn(8)
    base = gradops.LayerNormalization(x, s, b, epsilon=1e-5)
    other_eps = gradops.LayerNormalization(x, s, b, epsilon=0.5)
    assert not torch.equal(base[0], other_eps[0])
    assert torch.equal(gradops.LayerNormalization(x, s, b, epsilon=1e-5)[0], base[0])
    axis0 = gradops.Softmax_13(x, axis=0)
    assert torch.allclose(axis0, torch.softmax(x, 0))
    assert torch.allclose(gradops.Softmax_13(x, axis=1), torch.softmax(x, 1))
    wide = torch.randn(3, 9)
    assert gradops.Softmax_13(wide).shape == (3, 9)
    assert gradops.Softmax_13(x.double()).dtype == torch.float64
    y, mean, inv = gradops.LayerNormalization(x, s, b, outputs=("Y",))
    assert mean is None and inv is None and torch.equal(y, base[0])


@needs
def test_another_library_object_gets_its_own_plans():
    lib = gradops.load(gradops.library_path)
    x = torch.randn(5, 7)
    assert torch.equal(lib.run("Gelu", [x])[0], gradops.Gelu(x))
    assert torch.equal(lib.run("Gelu", [x])[0], gradops.Gelu(x))


@needs
def test_threads_share_plans_and_get_their_own_outputs():
    xs = [torch.randn(16, 33) for _ in range(8)]
    want = [torch.softmax(x, -1) for x in xs]
    errors = []

    def work(i):
        try:
            for _ in range(200):
                if not torch.allclose(gradops.Softmax_13(xs[i]), want[i], rtol=1e-6, atol=1e-7):
                    errors.append(i)
                    return
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@needs
def test_keywords_reach_the_python_path():
    op = gradops.ops["Gelu"]
    x = torch.randn(3, 4)
    before = _stats()[2]
    r = _call.run(op, (x,), (None,) * len(op.attributes), op._all, out=None, num_threads=1)
    assert _stats()[2] == before + 1
    assert torch.equal(r[0], gradops.Gelu(x))


@needs
def test_plans_cleared_while_other_threads_run():
    # More call shapes than the cache keeps (4096), from several threads: the cache is cleared
    # while other threads hold plans.
    errors = []

    def work(t):
        try:
            for n in range(1, 1201):
                x = torch.full((t + 1, n), float(t))  # 4 x 1,200 distinct shapes
                y = gradops.Softmax_13(x)
                if y.shape != (t + 1, n) or not torch.allclose(y, torch.full((t + 1, n), 1.0 / n)):
                    errors.append((t, n))
                    return
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
