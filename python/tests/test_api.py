"""The package's interface: the table, generated functions, outputs, out=, layouts and errors."""
import inspect

import numpy as np
import pytest

import gradops
from gradops import _native


def test_table_matches_library():
    assert len(gradops.ops) == gradops.library.cdll.gradops_op_count()
    op = gradops.ops["LayerNormalization"]
    assert [a.name for a in op.inputs] == ["X", "Scale", "B"]
    assert [a.name for a in op.attributes] == ["axis", "epsilon", "stash_type"]
    assert op.inputs[2].optional and not op.inputs[0].optional


def test_generated_signature_is_the_tables():
    sig = inspect.signature(gradops.LayerNormalization)
    assert list(sig.parameters)[:3] == ["X", "Scale", "B"]
    assert sig.parameters["axis"].default == -1
    assert sig.parameters["epsilon"].default == pytest.approx(1e-5)
    assert sig.parameters["axis"].kind is inspect.Parameter.KEYWORD_ONLY
    # BatchNormalizationGrad's epsilon is required in ORT's schema: no default here either.
    assert gradops.ops["BatchNormalizationGrad"].attributes[0].required
    assert inspect.signature(gradops.BatchNormalizationGrad).parameters["epsilon"].default is inspect.Parameter.empty
    assert "GeluGrad" in gradops.GeluGrad.__doc__ and "dY" in gradops.GeluGrad.__doc__


def test_allocates_outputs_with_library_shapes():
    if not gradops.has_shape_inference:
        pytest.skip("this libgradops has no output-shape inference")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    y, mean, inv = gradops.LayerNormalization(x, np.ones(5, np.float32), axis=-1)
    assert y.shape == (3, 4, 5) and y.dtype == np.float32
    assert mean.shape == inv.shape == (3, 4, 1)
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    # Only the outputs asked for are computed.
    y2, m2, i2 = gradops.LayerNormalization(x, np.ones(5, np.float32), outputs=["Y"])
    assert m2 is None and i2 is None
    np.testing.assert_array_equal(y, y2)


def test_out_and_in_place():
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    dy = np.ones_like(x)
    out = np.full_like(x, np.nan)
    r = gradops.ReluGrad(dy, x, out=out)
    assert r is out
    np.testing.assert_array_equal(out, (x > 0).astype(np.float32))
    # dX over dY: the schema's alias rule.
    gradops.ReluGrad(dy, x, out=dy)
    np.testing.assert_array_equal(dy, (x > 0).astype(np.float32))


def test_non_contiguous_input_is_copied():
    if not gradops.has_shape_inference:
        pytest.skip("this libgradops has no output-shape inference")
    x = (np.arange(24, dtype=np.float64).reshape(4, 6) / 10.0)[:, ::2]
    assert not x.flags.c_contiguous
    y = gradops.Tanh(x)
    np.testing.assert_allclose(y, np.tanh(x), rtol=1e-15)


def test_non_contiguous_output_is_refused():
    x = np.zeros((4, 6), np.float32)
    out = np.zeros((4, 12), np.float32)[:, ::2]
    with pytest.raises(ValueError, match="contiguous"):
        gradops.Relu(x, out=out)


def test_invalid_argument_is_value_error_with_the_library_message():
    dy = np.ones(4, np.float32)
    x = np.ones(5, np.float32)
    with pytest.raises(ValueError, match=r"ReluGrad: 'X' has shape \[5\], expected \[4\]"):
        gradops.ReluGrad(dy, x, out=np.empty(4, np.float32))


def test_attribute_errors():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="LeakyReluGrad.*alpha"):
        gradops.LeakyReluGrad(x, x, alpha=-1.0, out=np.empty_like(x))
    with pytest.raises(ValueError, match="no attribute named 'alpah'"):
        gradops.run("LeakyRelu", [x], {"alpah": 1.0})
    with pytest.raises(TypeError):
        gradops.LeakyRelu(x, alpah=1.0)
    with pytest.raises(ValueError, match="no operator named"):
        gradops.run("Nope", [x])


def test_unsupported_dtype_and_type():
    with pytest.raises(TypeError, match="int32"):
        gradops.Relu(np.ones(3, np.int32))
    with pytest.raises(TypeError, match="list"):
        gradops.Relu([1.0, 2.0])


def test_status_codes_map_to_exceptions():
    assert isinstance(_native.error(1), ValueError)
    assert isinstance(_native.error(2), NotImplementedError)
    assert isinstance(_native.error(3), MemoryError)
    assert type(_native.error(4)) is RuntimeError and type(_native.error(5)) is RuntimeError


def test_failed_call_leaves_outputs_untouched():
    dy = np.ones((2, 3), np.float32)
    out = np.full((2, 3), 7.0, np.float32)
    with pytest.raises(ValueError):
        gradops.GeluGrad(dy, np.ones((2, 4), np.float32), out=out)
    assert (out == 7.0).all()


def test_implementation_name():
    x = np.ones((4, 4), np.float32)
    name = gradops.implementation_name("Gelu", [x], out=np.empty_like(x))
    assert name.startswith("cpu:")


def test_threads_do_not_change_results():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 257)).astype(np.float32)
    a = gradops.Softmax_13(x, out=np.empty_like(x), num_threads=1)
    b = gradops.Softmax_13(x, out=np.empty_like(x), num_threads=2)
    np.testing.assert_array_equal(a, b)


def test_installed_package_carries_its_library():
    import os
    if os.environ.get("GRADOPS_TEST_INSTALLED") != "1":
        pytest.skip("testing the source tree (GRADOPS_TEST_INSTALLED=1 tests the installed package)")
    assert "site-packages" in gradops.__file__
    assert gradops.library_path.endswith(os.path.join("gradops", "_lib", "libgradops.so"))


class _DLPackOnly:
    """An array known only through the DLPack protocol (as CuPy or JAX arrays are to gradops)."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, stream=None):
        return self._a.__dlpack__()

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_object_is_read_in_place():
    if not gradops.has_shape_inference:
        pytest.skip("this libgradops has no output-shape inference")
    torch = pytest.importorskip("torch")
    x = torch.linspace(-2, 2, 10)
    y = gradops.Sigmoid(_DLPackOnly(x))
    torch.testing.assert_close(torch.as_tensor(np.asarray(y)), torch.sigmoid(x))
    # Given outputs are written in place through DLPack too (they share memory with the caller's).
    out = torch.full((10,), float("nan"))
    gradops.Sigmoid(_DLPackOnly(x), out=_DLPackOnly(out))
    torch.testing.assert_close(out, torch.sigmoid(x))


def test_repeated_calls_see_new_data_layouts_and_arrays():
    """The per-call cache (keyed by dtype, shape, device and contiguity) must never serve a call
    another layout, another array library or another op's plan: every result here is checked."""
    torch = pytest.importorskip("torch")
    if not gradops.has_shape_inference:
        pytest.skip("this libgradops has no output-shape inference")
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6) / 7.0 - 1.5
    for _ in range(3):  # the first call fills the cache, the later ones use it
        for x in (base, base.t().contiguous(), base[:, ::2], base.t(), base[1:3]):
            torch.testing.assert_close(gradops.Tanh(x), torch.tanh(x), rtol=1e-15, atol=0)
            torch.testing.assert_close(gradops.Relu(x), torch.relu(x), rtol=0, atol=0)
        xn = base.numpy()
        np.testing.assert_allclose(gradops.Tanh(xn), np.tanh(xn), rtol=1e-15)
        assert isinstance(gradops.Tanh(xn), np.ndarray) and isinstance(gradops.Tanh(base), torch.Tensor)
        # Same shapes, other attribute values and outputs: other plans.
        y0 = gradops.Softmax_13(base, axis=0)
        y1 = gradops.Softmax_13(base, axis=1)
        torch.testing.assert_close(y0, torch.softmax(base, 0), rtol=1e-13, atol=0)
        torch.testing.assert_close(y1, torch.softmax(base, 1), rtol=1e-13, atol=0)
        w, b = torch.ones(6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
        y, mean, inv = gradops.LayerNormalization(base, w, b)
        only_y = gradops.LayerNormalization(base, w, b, outputs=["Y"])
        assert only_y[1] is None and only_y[2] is None
        torch.testing.assert_close(only_y[0], y, rtol=0, atol=0)
        assert mean.shape == (4, 1) and inv.shape == (4, 1)
        # Fresh outputs on every call: a result is never overwritten by the next call.
        first = gradops.Tanh(base)
        kept = first.clone()
        gradops.Tanh(base * 2)
        torch.testing.assert_close(first, kept, rtol=0, atol=0)


def test_second_library_has_its_own_calls():
    """A library loaded beside the default one runs its own functions, not cached ones."""
    other = gradops.load(gradops.library_path)
    x = np.linspace(-2, 2, 12).astype(np.float32)
    for _ in range(2):
        (a,) = other.run("Gelu", [x])
        b = gradops.Gelu(x)
        np.testing.assert_array_equal(a, b)
    assert other.ops["Gelu"] is not gradops.ops["Gelu"]
