"""The example trains with torch.nn's and gradops' layers; its two loss curves must agree."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
import gradops  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                       "train_tiny_transformer.py")


@pytest.mark.skipif(not gradops.has_shape_inference, reason="this libgradops has no output-shape inference")
def test_example_loss_curves_agree(tmp_path):
    out = tmp_path / "run.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    r = subprocess.run([sys.executable, EXAMPLE, "--steps", "12", "--json", str(out), "--tolerance", "1e-3"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(out.read_text())
    a, b = rep["losses"]["torch.nn"], rep["losses"]["gradops"]
    assert len(a) == len(b) == 12
    assert b[-1] < b[0]  # it learns
    assert rep["max_relative_loss_difference"] <= 1e-3
