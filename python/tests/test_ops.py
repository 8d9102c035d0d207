"""Every operator of the table through the numpy interface (bf16 through PyTorch, or numpy with
ml_dtypes), against the float64 oracle's values and tolerances that the C++ tests use (exported by
the oracle_export program; GRADOPS_ORACLE_JSON names the file)."""
import json
import os

import numpy as np
import pytest

import gradops

_PATH = os.environ.get("GRADOPS_ORACLE_JSON")


def _cases():
    if not _PATH or not os.path.exists(_PATH):
        return []
    with open(_PATH) as f:
        return json.load(f)


CASES = _cases()


def test_oracle_cases_present():
    if not CASES:
        pytest.skip("no oracle cases: set GRADOPS_ORACLE_JSON to the output of oracle_export "
                    "(scripts/test_python.sh does)")
    names = {c["op"] for c in CASES}
    missing = sorted(set(gradops.ops) - names)
    # Every operator of the library is checked, except those the oracle cannot make inputs for
    # (reported by oracle_export on stderr); today that is none.
    assert not missing, f"operators without oracle cases: {missing}"


def _np_dtype(name):
    if name == "bf16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype({"f32": "float32", "f64": "float64", "f16": "float16"}[name])


def _have(module):
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def _to_array(t, lib):
    vals = np.array(t["values"], dtype=np.float64).reshape(t["shape"])
    if lib == "torch":
        import torch
        dt = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16}[t["dtype"]]
        return torch.from_numpy(vals).to(dt)
    return vals.astype(_np_dtype(t["dtype"]))


def _as_f64(a):
    if hasattr(a, "detach"):
        return a.detach().double().cpu().numpy()
    return np.asarray(a).astype(np.float64)


def _check(case, results, allow_missing=False):
    op = gradops.ops[case["op"]]
    for o, (exp, act) in enumerate(zip(case["outputs"], results)):
        if exp is None or (allow_missing and act is None):
            continue
        name = op.outputs[o].name
        assert act is not None, f"{case['case']}: output {name} missing"
        want = np.array(exp["tensor"]["values"], dtype=np.float64)
        got = _as_f64(act).reshape(-1)
        assert got.size == want.size and tuple(_as_f64(act).shape) == tuple(exp["tensor"]["shape"]), \
            f"{case['case']}: {name} has shape {tuple(_as_f64(act).shape)}, expected {exp['tensor']['shape']}"
        err = np.abs(got - want)
        tol = exp["abs"] + exp["rel"] * np.abs(want)
        both_nan = np.isnan(got) & np.isnan(want)
        same_inf = np.isinf(want) & (got == want)
        bad = ~((err <= tol) | both_nan | same_inf)
        if bad.any():
            i = int(np.argmax(bad))
            pytest.fail(f"{case['case']}: {name}[{i}] = {got[i]!r}, expected {want[i]!r} "
                        f"(tolerance {tol[i]:.3g}; {int(bad.sum())} of {bad.size} elements off)")


@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_oracle(case):
    bf16 = any(t is not None and t["dtype"] == "bf16" for t in case["inputs"]) or \
        any(o is not None and o["tensor"]["dtype"] == "bf16" for o in case["outputs"])
    lib = "numpy"
    if bf16 and not _have("ml_dtypes"):
        if not _have("torch"):
            pytest.skip("bf16 needs ml_dtypes or PyTorch")
        lib = "torch"
    inputs = [None if t is None else _to_array(t, lib) for t in case["inputs"]]
    wanted = [o.name for o, e in zip(gradops.ops[case["op"]].outputs, case["outputs"]) if e is not None]
    # Outputs given, poisoned (NaN in every float format): every element must be written.
    out = [None if e is None else _poisoned(e["tensor"], lib) for e in case["outputs"]]
    res = gradops.run(case["op"], inputs, case["attributes"], outputs=wanted, out=out)
    assert all(r is o for r, o in zip(res, out) if o is not None)
    _check(case, res)
    if gradops.has_shape_inference:  # and allocated by the package from the library's shapes
        res = list(gradops.run(case["op"], inputs, case["attributes"], outputs=wanted))
        op = gradops.ops[case["op"]]
        carried = {a.type_var for a in op.inputs}
        for o, (e, r) in enumerate(zip(case["outputs"], res)):
            if e is None or r is None or _dtype_name(r) == e["tensor"]["dtype"]:
                continue
            # An output type no input carries (InvertibleLayerNormalizationGrad's T) is the first
            # matching signature's, which may differ from this case's: not compared here.
            assert op.outputs[o].type_var not in carried, f"{case['case']}: {op.outputs[o].name} is {_dtype_name(r)}"
            res[o] = None
        _check(case, res, allow_missing=True)


def _dtype_name(a):
    s = str(a.dtype).replace("torch.", "")
    return {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}[s]


def _poisoned(t, lib):
    a = _to_array(dict(t, values=[float("nan")] * len(t["values"])), lib)
    return a


@pytest.mark.skipif(not _have("torch"), reason="PyTorch is not installed")
@pytest.mark.parametrize("case", [c for c in CASES if "(f32" in c["case"]][:40],
                         ids=[c["case"] for c in CASES if "(f32" in c["case"]][:40])
def test_oracle_torch_generated_functions(case):
    """The same values through the generated per-operator functions and PyTorch CPU tensors."""
    op = gradops.ops[case["op"]]
    inputs = [None if t is None else _to_array(t, "torch") for t in case["inputs"]]
    wanted = [o.name for o, e in zip(op.outputs, case["outputs"]) if e is not None]
    fn = getattr(gradops, case["op"])
    out = [None if e is None else _poisoned(e["tensor"], "torch") for e in case["outputs"]]
    res = fn(*inputs, **case["attributes"], outputs=wanted, out=out if len(out) > 1 else out[0])
    _check(case, (res,) if len(op.outputs) == 1 else res)
