"""``fusecli rewrite`` through click: exit codes, refusing to overwrite the input, nothing written when
verification fails or the input is bad, external data, SavedModels."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import fusecli.rewrite.graph.save as save
import fusecli.rewrite.kernels.conv as conv_kernel
import fusecli.rewrite.verify.outputs as verify
from fusecli.cli import main
from tests.rewrite.helpers import assert_same_outputs, ops


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _one_error_line(r) -> str:
    assert r.exit_code == 1, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.output
    return lines[0]


def _left_over(folder) -> list[str]:
    return [f for f in os.listdir(folder) if f.startswith(".fusecli-")]


def test_rewrite_writes_the_fused_model(sample, tmp_path):
    out = tmp_path / "out.onnx"
    r = run("rewrite", sample("conv_bn_relu"), "-o", out, "--batch", "2")
    assert r.exit_code == 0, r.output
    assert ops(onnx.load(out)) == {"com.microsoft.FusedConv": 1}
    assert "nodes: 3 -> 1" in r.stdout and "FusedConv" in r.stdout and "verified" in r.stdout
    assert_same_outputs(sample("conv_bn_relu"), onnx.load(out))
    assert not _left_over(tmp_path)


def test_json_summary(sample, tmp_path):
    r = run("rewrite", sample("matmul_bias_relu"), "-o", tmp_path / "o.onnx", "--json", "--target", "cuda")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["target"] == "cuda" and doc["nodes"] == {"before": 3, "after": 2}
    assert doc["kernels"] == {"Gemm": 1} and doc["verification"]["ok"] is True
    assert set(doc["verification"]["levels"]) == {"disabled", "default"}
    assert "com.microsoft.FusedGemm" not in ops(onnx.load(tmp_path / "o.onnx"))


def test_no_verify_and_bench(sample, tmp_path):
    r = run("rewrite", sample("conv_bias_relu"), "-o", tmp_path / "o.onnx", "--no-verify")
    assert r.exit_code == 0 and "not verified" in r.stdout
    r = run("rewrite", sample("conv_bias_relu"), "-o", tmp_path / "o.onnx", "--bench", "--threads", "1",
            "--batch", "1", "--force")
    assert r.exit_code == 0, r.output
    assert "bench (50 interleaved runs" in r.stdout and r.stdout.count(" ms") == 4
    assert r.stdout.count("rewritten: ") + r.stdout.count("rewritten, ORT default opts: ") == 2


def test_bench_refuses_a_measured_slowdown(sample, tmp_path, monkeypatch):
    """A rewritten model that really does more work (a side output of 30 chained 256x256 MatMuls) is
    measured slower: exit 1, one error line, nothing written; --force writes it."""
    import fusecli.rewrite.run as run_mod

    real = run_mod._session_source

    def heavier(model, work, base_dir=None):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        w = onnx.numpy_helper.from_array(np.full((256, 256), 1e-3, np.float32), "heavy_w")
        x = onnx.numpy_helper.from_array(np.ones((256, 256), np.float32), "heavy_x")
        m.graph.initializer.extend([w, x])
        prev = "heavy_x"
        for i in range(30):
            m.graph.node.append(onnx.helper.make_node("MatMul", [prev, "heavy_w"], [f"heavy_{i}"]))
            prev = f"heavy_{i}"
        m.graph.output.append(onnx.helper.make_tensor_value_info(prev, onnx.TensorProto.FLOAT, [256, 256]))
        return real(m, work, base_dir)

    monkeypatch.setattr(run_mod, "_session_source", heavier)
    out = tmp_path / "o.onnx"
    r = run("rewrite", sample("conv_bias_relu"), "-o", out, "--bench", "--threads", "1", "--batch", "1")
    assert "measurably slower" in _one_error_line(r) and not out.exists()
    assert "slower: " in r.stdout and "nothing written" in r.stdout
    r = run("rewrite", sample("conv_bias_relu"), "-o", out, "--bench", "--threads", "1", "--batch", "1",
            "--force")
    assert r.exit_code == 0 and out.exists()


@pytest.mark.parametrize("how", ["same path", "symlink"])
def test_output_onto_the_input_is_refused(sample, tmp_path, how):
    model = tmp_path / "m.onnx"
    shutil.copy(sample("conv_bias_relu"), model)
    before = model.read_bytes()
    out = model
    if how == "symlink":
        out = tmp_path / "link.onnx"
        out.symlink_to(model)
    line = _one_error_line(run("rewrite", model, "-o", out))
    assert "refusing to overwrite the input" in line
    assert model.read_bytes() == before and not _left_over(tmp_path)


def test_verification_failure_writes_nothing(sample, tmp_path, monkeypatch):
    monkeypatch.setitem(verify.TOLERANCE, "float32", -1.0)  # nothing can pass
    out = tmp_path / "o.onnx"
    line = _one_error_line(run("rewrite", sample("conv_bias_relu"), "-o", out))
    assert "verification failed" in line and "nothing written" in line
    assert not out.exists() and not _left_over(tmp_path)


def test_a_corrupted_fold_is_caught(sample, tmp_path, monkeypatch):
    """A wrong BatchNorm fold (weights doubled) must fail verification; the output is not written."""
    real = conv_kernel.fold_batch_norm
    monkeypatch.setattr(conv_kernel, "fold_batch_norm", lambda *a: (real(*a)[0] * 2, real(*a)[1]))
    out = tmp_path / "o.onnx"
    line = _one_error_line(run("rewrite", sample("conv_bn_relu"), "-o", out))
    assert "verification failed" in line and "'y'" in line
    assert not out.exists() and not _left_over(tmp_path)


def test_bad_inputs(sample, tmp_path):
    out = tmp_path / "o.onnx"
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    truncated = tmp_path / "truncated.onnx"
    data = open(sample("conv_bn_relu"), "rb").read()
    truncated.write_bytes(data[: len(data) // 2])
    folder = tmp_path / "folder"
    folder.mkdir()
    cases = {tmp_path / "missing.onnx": "no such file", empty: "empty file", truncated: "not an ONNX model",
             folder: "not a SavedModel"}
    for path, words in cases.items():
        assert words in _one_error_line(run("rewrite", path, "-o", out)), path
        assert not out.exists()


def test_usage_errors(sample, tmp_path):
    assert run("rewrite", sample("conv_bias_relu")).exit_code == 2  # -o is required
    r = run("rewrite", sample("conv_bias_relu"), "-o", tmp_path / "o.onnx", "--target", "tpu")
    assert r.exit_code == 2
    r = run("rewrite", sample("conv_bias_relu"), "-o", tmp_path / "o.onnx", "--patterns", "conv_nope")
    assert r.exit_code == 2 and r.stderr.startswith("error: ") and "unknown pattern" in r.stderr
    line = _one_error_line(run("rewrite", sample("conv_bias_relu"), "-o", tmp_path / "o.onnx",
                               "--signature", "serving_default"))
    assert "SavedModel folders only" in line


def test_output_folder_must_exist(sample, tmp_path):
    line = _one_error_line(run("rewrite", sample("conv_bias_relu"), "-o", tmp_path / "nope" / "o.onnx"))
    assert "does not exist" in line


def test_past_two_gigabytes_weights_go_to_a_data_file(sample, tmp_path, monkeypatch):
    """With the limit lowered, the output is OUT.onnx + OUT.onnx.data, and both load and run."""
    monkeypatch.setattr(save, "PROTOBUF_LIMIT", 1000)
    monkeypatch.setattr(save, "EXTERNAL_THRESHOLD", 16)
    out = tmp_path / "o.onnx"
    r = run("rewrite", sample("conv_bn_relu"), "-o", out)
    assert r.exit_code == 0, r.output
    assert (tmp_path / "o.onnx.data").is_file() and "weights written to" in r.stdout
    model = onnx.load(out, load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    assert_same_outputs(sample("conv_bn_relu"), str(out))


def test_external_data_input_is_read_and_protected(sample, tmp_path, monkeypatch):
    """An input with external data: its weights are read; an output whose data file would replace the
    input's is refused."""
    model = onnx.load(sample("conv_bn_relu"))
    src = tmp_path / "in.onnx"
    onnx.save_model(model, src, save_as_external_data=True, location="big.onnx.data", size_threshold=0)
    r = run("rewrite", src, "-o", tmp_path / "o.onnx")
    assert r.exit_code == 0, r.output
    assert_same_outputs(src, onnx.load(tmp_path / "o.onnx"))
    monkeypatch.setattr(save, "PROTOBUF_LIMIT", 1000)
    before = (tmp_path / "big.onnx.data").read_bytes()
    (tmp_path / "big.onnx").write_bytes(b"")  # an existing output name whose data file is the input's
    line = _one_error_line(run("rewrite", src, "-o", tmp_path / "big.onnx"))
    assert "refusing to overwrite" in line and (tmp_path / "big.onnx.data").read_bytes() == before


def test_savedmodel_without_tf2onnx_says_which_extra(tmp_path, monkeypatch):
    pytest.importorskip("tensorflow")
    from tests.load.test_savedmodel import saved_models

    folder = saved_models()["conv_bias_relu"]  # a valid SavedModel: only the converter is missing
    monkeypatch.setitem(sys.modules, "tf2onnx", None)
    line = _one_error_line(run("rewrite", folder, "-o", tmp_path / "o.onnx"))
    assert "tf2onnx" in line and "fusecli[tf]" in line


def test_bad_savedmodel_fails_before_tensorflow_is_imported(tmp_path):
    """fusecli's own reader checks the folder first: one line, and no TensorFlow start-up logs."""
    folder = tmp_path / "sm"
    folder.mkdir()
    (folder / "saved_model.pb").write_bytes(b"garbage")
    args = ["rewrite", str(folder), "-o", str(tmp_path / "o.onnx")]
    code = ("import sys; from click.testing import CliRunner; from fusecli.cli import main; "
            f"r = CliRunner().invoke(main, {args!r}); "
            "print(r.exit_code, 'tensorflow' in sys.modules); print(r.stderr, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["1", "False"]
    assert done.stderr.strip().startswith("error: ") and "not a SavedModel" in done.stderr
    assert not (tmp_path / "o.onnx").exists()


def test_savedmodel_is_converted_and_rewritten(tmp_path, capfd):
    """Converted and rewritten, and no TensorFlow, absl or tf2onnx log line reaches the terminal."""
    pytest.importorskip("tf2onnx")
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(0)

    class ConvBiasRelu(tf.Module):
        def __init__(self):
            self.w = tf.Variable(rng.standard_normal((3, 3, 3, 4)).astype("float32"))
            self.b = tf.Variable(rng.standard_normal(4).astype("float32"))

        @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 3], tf.float32)])
        def __call__(self, x):
            return {"y": tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, self.w, 1, "SAME"), self.b))}

    module = ConvBiasRelu()
    tf.saved_model.save(module, str(tmp_path / "sm"), signatures=module.__call__)
    out = tmp_path / "o.onnx"
    capfd.readouterr()
    r = run("rewrite", tmp_path / "sm", "-o", out, "--batch", "2")
    assert r.exit_code == 0, r.output
    leaked = capfd.readouterr()
    assert r.stderr == "" and leaked.out == "" and leaked.err == "", (r.stderr, leaked)
    model = onnx.load(out)
    assert ops(model)["com.microsoft.FusedConv"] == 1 and "Relu" not in ops(model)
    x = rng.standard_normal((2, 8, 8, 3)).astype("float32")
    from tests.rewrite.helpers import ort_run

    _, got = ort_run(model, {"x": x})
    np.testing.assert_allclose(got["y"], module(tf.constant(x))["y"].numpy(), rtol=1e-4, atol=1e-5)
