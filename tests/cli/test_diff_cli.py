"""``fusecli diff``: exit codes, the JSON document, the text report at 80 columns, bad input."""

from __future__ import annotations

import json

import onnx
import pytest
from click.testing import CliRunner

from fusecli.cli import main
from fusecli.pipeline import Options, analyze
from fusecli.report.document import to_json
from tests.diff.test_compare import mlp

DOC_KEYS = {"fusecli", "old", "new", "summary", "differences", "pairing", "notes"}


def run(*args):
    return CliRunner(env={"COLUMNS": "80"}).invoke(main, ["diff", *args])


@pytest.fixture
def models(tmp_path):
    paths = {}
    for name, kw in {"a": {}, "nobias": {"bias": (True, False)}, "wide": {"hidden": (16, 64)},
                     "gelu": {"acts": ("Relu", "Gelu")}}.items():
        paths[name] = str(tmp_path / f"{name}.onnx")
        onnx.save(mlp(**kw), paths[name])
    return paths


def test_identical_files_exit_0_with_the_json_contract(models):
    r = run(models["a"], models["a"], "--batch", "2", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert set(doc) == DOC_KEYS and doc["differences"] == []
    assert doc["summary"]["exit"] == 0 and doc["summary"]["regression"] is False
    mine = to_json(analyze(models["a"], Options(batch=2)))
    assert doc["old"]["memory"] == {k: mine["memory"][k] for k in doc["old"]["memory"]}
    assert doc["old"]["dims"] == mine["dims"] == {"batch": 2}


def test_lost_fusion_exits_1_and_fail_on_memory_only_exits_0(models):
    r = run(models["a"], models["nobias"], "--batch", "2", "--json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["summary"]["failing"] == ["fusions"]
    assert all(set(d) >= {"kind", "regression"} for d in doc["differences"])
    assert run(models["a"], models["nobias"], "--batch", "2", "--fail-on", "memory").exit_code == 0


def test_memory_growth_and_tolerance(models):
    r = run(models["a"], models["wide"], "--batch", "2", "--json", "--fail-on", "memory")
    assert r.exit_code == 1
    growth = max(d["change"] for d in json.loads(r.stdout)["differences"] if d["kind"] == "memory")
    above = f"{growth * 100 + 1:.0f}%"
    assert run(models["a"], models["wide"], "--batch", "2", "--tolerance", above).exit_code == 0
    assert run(models["a"], models["wide"], "--batch", "2", "--fail-on", "fusions,verdicts").exit_code == 0


def test_text_report_fits_80_columns_summary_first(models):
    r = run(models["a"], models["gelu"], "--batch", "2")
    assert r.exit_code == 1, r.output
    lines = r.stdout.splitlines()
    assert lines[2].startswith("REGRESSION (") and "verdicts" in lines[2]
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert any(line.split()[:2] == ["worse!", "matmul_bias_act"] for line in lines)
    assert "Traceback" not in r.output


@pytest.mark.parametrize("args, message", [
    (("--tolerance", "lots"), "--tolerance"),
    (("--fail-on", "speed"), "--fail-on"),
    (("--dim", "width=3"), "neither model has a dim"),
])
def test_usage_errors_exit_2(models, args, message):
    r = run(models["a"], models["a"], *args)
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output
    assert r.output.startswith("error: ") and r.output.count("\n") == 1


def test_bad_input_is_one_line_and_exit_3(models, tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x08\x07not a model")
    for args in ((models["a"], str(tmp_path / "missing.onnx")), (str(junk), models["a"])):
        r = run(*args)
        assert r.exit_code == 3, r.output
        assert r.output.startswith("error: ") and r.output.count("\n") == 1 and "Traceback" not in r.output


def test_diff_help_imports_no_framework():
    import subprocess
    import sys

    code = ("import sys, fusecli.cli; from click.testing import CliRunner; "
            "r = CliRunner().invoke(fusecli.cli.main, ['diff', '--help']); assert '--fail-on' in r.output; "
            "print([m for m in ('tensorflow', 'torch', 'onnxruntime', 'onnx') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
