"""Each family test declares GRAPHS (pattern name -> a builder of a small model that has it) and checks
each with ``assert_matches``; tests/fusion/families/test_registry.py checks their union is the catalogue."""

from __future__ import annotations

import os

import onnx

from fusecli.pipeline import Options, analyze
from tests.fusion.models import analyze_model


def assert_matches(build, name: str, tmp_path, run: bool = True) -> None:
    """The model ``build()`` makes (run in ONNX Runtime first unless ``run`` is False) matches ``name``."""
    model = build()
    if run:
        a = analyze_model(model, tmp_path)
    else:  # inputs ONNX Runtime's random feeds cannot fill (int64 positions)
        path = os.path.join(tmp_path, f"{name}.onnx")
        onnx.save(model, path)
        a = analyze(path, Options(batch=1))
    names = {m.pattern.name for m in a.matches}
    assert name in names, (name, sorted(names))
