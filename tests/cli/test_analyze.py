from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from fusecli import __version__
from fusecli.cli import main

CONTRACT_KEYS = {"fusecli", "model", "format", "batch", "dims", "resolved_dims", "routing", "tensorflow",
                 "folded_batch_norms",
                 "forward", "backward", "precision", "autodiff", "saved", "memory", "patterns", "near_misses",
                 "unsupported"}


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_json_contract_on_conv_bias_relu(sample):
    path = sample("conv_bias_relu")
    r = run("analyze", path, "--json", "--batch", "4")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert set(doc) == CONTRACT_KEYS
    assert doc["fusecli"] == __version__ and doc["model"] == path and doc["format"] == "onnx"
    assert doc["batch"] == 4 and doc["dims"] == {"N": 4} and doc["resolved_dims"] == {}
    assert doc["routing"] is None  # no --routing: no assumption made
    assert doc["tensorflow"] is None  # an ONNX model: no TensorFlow sizes
    assert doc["forward"] == {"nodes": 3, "tensors": 6, "constant_weights": 0}
    assert set(doc["memory"]) == {"saved_bytes", "saved_activation_bytes", "peak_bytes", "peak", "formula",
                                  "incomplete", "unknown_tensors", "saved_bytes_if_recomputed"}
    assert doc["memory"]["incomplete"] == [] and doc["memory"]["unknown_tensors"] == 0
    peak = doc["memory"]["peak"]
    assert set(peak) == {"step", "steps", "phase", "node", "op", "resident_bytes", "counted", "not_counted",
                         "views", "never_allocated", "alive"}
    assert peak["not_counted"] == []  # the plain profile makes no claim about a framework's allocator
    # no framework profile: every tensor counts; what is alive at the peak adds up to it
    assert peak["views"] == peak["never_allocated"] == 0 and peak["counted"].startswith("every tensor")
    assert peak["resident_bytes"] + sum(e["bytes"] for e in peak["alive"]) == doc["memory"]["peak_bytes"]
    assert [e["bytes"] for e in peak["alive"]] == sorted((e["bytes"] for e in peak["alive"]), reverse=True)
    y = next(s for s in doc["saved"] if s["name"] == "y")
    assert y["bytes"] == 4 * 8 * 16 * 16 * 4 and y["bytes_formula"] == "8192*N"
    assert doc["unsupported"] == [] and doc["near_misses"] == []


def test_human_output_has_the_summary(sample):
    r = run("analyze", sample("bn_add_relu"), "--batch", "2")
    assert r.exit_code == 0, r.output
    assert "5 forward ops" in r.stdout and "BatchNormalization" in r.stdout
    assert "input: x float32 [N, 8, 16, 16]" in r.stdout and "bn_add_act" in r.stdout
    assert "warning: the model has dynamic dims" not in r.stderr  # --batch given


def test_dynamic_batch_without_flag_warns_on_stderr_only(sample):
    r = run("analyze", sample("conv_bias_relu"), "--json")
    assert r.exit_code == 0
    assert "dims not given are taken as 1: N=1 (set --batch N)" in r.stderr
    assert json.loads(r.stdout)["dims"] == {"N": 1}  # stdout stays pure JSON


def test_dim_names_the_batch_dim_too(sample):
    """--dim N=4 sizes the batch dim: "batch" in the JSON is the value used, 4."""
    r = run("analyze", sample("conv_bias_relu"), "--json", "--dim", "N=4")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["batch"] == 4 and doc["dims"] == {"N": 4}
    assert "taken as 1" not in r.stderr


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
    assert run("analyze", sample("conv_bias_relu"), "--dim", "N=2", "--dim", "N=3").exit_code == 2


@pytest.mark.parametrize("args, says", [
    (("--dim", "foo=3"), "--dim foo: the model has no dim of that name (its dims: N)"),
    (("--dim", "n=3"), "--dim n: the model has no dim of that name (its dims: N)"),  # names are exact
    (("--dim", "N=4", "--batch", "8"), "--batch 8 and --dim N=4 disagree"),
])
def test_dims_that_do_not_fit_the_model_are_usage_errors(sample, args, says):
    r = run("analyze", sample("conv_bias_relu"), "--json", *args)
    assert r.exit_code == 2, r.output
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0]


def test_agreeing_batch_and_dim_are_fine(sample):
    r = run("analyze", sample("conv_bias_relu"), "--json", "--dim", "N=4", "--batch", "4")
    assert r.exit_code == 0 and json.loads(r.stdout)["batch"] == 4


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
