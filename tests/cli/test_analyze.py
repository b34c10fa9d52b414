from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from fusecli import __version__
from fusecli.cli import main

CONTRACT_KEYS = {"fusecli", "model", "format", "batch", "forward", "backward", "autodiff", "saved", "memory",
                 "patterns", "unsupported"}


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_json_contract_on_conv_bias_relu(sample):
    path = sample("conv_bias_relu")
    r = run("analyze", path, "--json", "--batch", "4")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert set(doc) == CONTRACT_KEYS
    assert doc["fusecli"] == __version__ and doc["model"] == path and doc["format"] == "onnx"
    assert doc["batch"] == 4
    assert doc["forward"] == {"nodes": 3, "tensors": 6}
    assert set(doc["memory"]) == {"saved_bytes", "saved_activation_bytes", "peak_bytes"}
    assert doc["unsupported"] == []


def test_human_output_has_the_summary(sample):
    r = run("analyze", sample("bn_add_relu"), "--batch", "2")
    assert r.exit_code == 0, r.output
    assert "forward nodes" in r.stdout and "BatchNormalization" in r.stdout


def test_dynamic_batch_without_flag_warns_on_stderr_only(sample):
    r = run("analyze", sample("conv_bias_relu"), "--json")
    assert r.exit_code == 0
    assert "dynamic dims (N)" in r.stderr
    json.loads(r.stdout)  # stdout stays pure JSON


def _bad_inputs(tmp_path, sample):
    good = open(sample("conv_bn_relu"), "rb").read()
    files = {"empty.onnx": b"", "random.onnx": bytes(range(256)) * 7,
             "truncated.onnx": good[: len(good) // 2], "text.onnx": b"hello, this is text\n"}
    paths = {}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        paths[name] = str(tmp_path / name)
    paths["missing"] = str(tmp_path / "nope.onnx")
    paths["folder"] = str(tmp_path)
    return paths


@pytest.mark.parametrize("case", ["empty.onnx", "random.onnx", "truncated.onnx", "text.onnx",
                                  "missing", "folder"])
def test_bad_input_is_one_line_exit_1(tmp_path, sample, case):
    path = _bad_inputs(tmp_path, sample)[case]
    r = run("analyze", path, "--json")
    assert r.exit_code == 1, r.output
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "Traceback" not in r.stderr


def test_usage_errors_exit_2(sample):
    assert run("analyze").exit_code == 2
    assert run("analyze", sample("conv_bias_relu"), "--batch", "0").exit_code == 2
    assert run("analyze", sample("conv_bias_relu"), "--dim", "seq").exit_code == 2


def test_console_script_and_module_entry(sample):
    out = subprocess.run([sys.executable, "-m", "fusecli", "analyze", sample("matmul_bias_relu"),
                          "--json", "--batch", "1"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["forward"]["nodes"] == 3


def test_import_and_help_stay_light():
    code = ("import sys, fusecli, fusecli.cli; from click.testing import CliRunner; "
            "CliRunner().invoke(fusecli.cli.main, ['--help']); "
            "heavy = [m for m in ('tensorflow', 'torch', 'onnxruntime', 'onnx', 'matplotlib') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
