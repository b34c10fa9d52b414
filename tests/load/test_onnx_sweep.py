"""Every model the onnx package ships as test data analyzes, or fails with one clean FuseError."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from fusecli.core.errors import FuseError
from fusecli.pipeline import Options, analyze

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
MODELS = sorted(DATA.glob("*/*/model.onnx")) + sorted(DATA.glob("light/*.onnx"))


def test_the_sweep_has_models():
    assert len(MODELS) > 100


@pytest.mark.parametrize("path", MODELS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.stem}")
def test_model_analyzes_or_fails_cleanly(path):
    try:
        a = analyze(str(path), Options(batch=2))
    except FuseError as e:
        assert "\n" not in str(e).strip()
        return
    a.joint.lint()
    assert a.liveness.peak_bytes >= a.liveness.saved_bytes
