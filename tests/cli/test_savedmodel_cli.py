"""analyze and render accept a SavedModel folder exactly as they accept an .onnx file."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fusecli.cli import main

tf = pytest.importorskip("tensorflow")
from tests.load.test_savedmodel import saved_models  # noqa: E402


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_analyze_json_of_a_savedmodel():
    path = saved_models()["conv_bias_relu"]
    r = run("analyze", path, "--json", "--batch", "2")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["format"] == "savedmodel" and doc["backward"]["nodes"] > 0
    assert [p["pattern"] for p in doc["patterns"] if p["phase"] == "forward"] == ["conv_bias_act"]
    assert any(s["op"] == "Relu" for s in doc["saved"])


def test_signature_choice_and_errors(tmp_path):
    path = saved_models()["conv_bias_relu"]
    assert run("analyze", path, "--json", "--signature", "serving_default").exit_code == 0
    r = run("analyze", path, "--signature", "nope")
    assert r.exit_code == 1 and "available: serving_default" in r.stderr
    (tmp_path / "saved_model.pb").write_bytes(b"\x08\x01garbage\xff\xff")
    r = run("analyze", str(tmp_path))
    assert r.exit_code == 1 and r.stderr.startswith("error: ") and len(r.stderr.splitlines()) == 1


def test_render_a_savedmodel(tmp_path):
    r = run("render", saved_models()["bn_add_relu"], "--view", "backward", "--dot", "--batch", "2")
    assert r.exit_code == 0 and r.stdout.startswith("digraph") and "BatchNormGrad" in r.stdout
