"""Every ``error:`` and ``warning:`` line fusecli prints is one line, whatever newlines the message holds:
onnxruntime quotes node names whole, and a node name may carry a newline."""

from __future__ import annotations

import numpy as np
import onnx
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import fusecli.rewrite.kernels.conv as conv_kernel
from fusecli.cli import main

NAME = "ln(x - mean) / sqrt(var +\neps)"  # what onnxruntime's message then carries


def _layer_norm_ort_refuses(path: str) -> str:
    """Conv -> Relu -> LayerNormalization with an axis out of range, the last node named over two lines:
    onnxruntime refuses to load it, its message quoting the name."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), "w")
    g = numpy_helper.from_array(np.ones(2, np.float32), "g")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], "conv"),
             helper.make_node("Relu", ["c"], ["r"], "relu"),
             helper.make_node("LayerNormalization", ["r", "g"], ["y"], NAME, axis=7)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 2, 2])
    graph = helper.make_graph(nodes, "g", [x], [y], [w, g])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def _lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip()]


def test_an_onnxruntime_error_with_a_newline_is_one_whole_line(tmp_path):
    """The message past onnxruntime's newline ('eps)) Op (LayerNormalization) ...') was lost or printed
    as a line of its own."""
    src = _layer_norm_ort_refuses(str(tmp_path / "m.onnx"))
    r = CliRunner().invoke(main, ["rewrite", src, "-o", str(tmp_path / "out.onnx")])
    lines = _lines(r.stderr)
    assert r.exit_code == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: onnxruntime cannot load the original model: "), lines[0]
    assert "sqrt(var + eps)) Op (LayerNormalization)" in lines[0], lines[0]
    assert not (tmp_path / "out.onnx").exists()


def test_a_warning_naming_a_node_over_two_lines_is_one_line(tmp_path, sample, monkeypatch):
    """A match an emitter cannot rewrite is said in a warning naming its node as the file names it."""
    model = onnx.load(sample("conv_bn_relu"))
    for n in model.graph.node:
        n.name = f"{n.name}\nsecond line"
    src = str(tmp_path / "m.onnx")
    onnx.save(model, src)

    def fails(*args):
        raise ValueError("weights it cannot take\n(a second line)")

    monkeypatch.setattr(conv_kernel, "fold_batch_norm", fails)
    r = CliRunner().invoke(main, ["rewrite", src, "-o", str(tmp_path / "out.onnx"), "--batch", "2"])
    assert r.exit_code == 0, r.output
    lines = _lines(r.stderr)
    assert lines and all(ln.startswith("warning: ") for ln in lines), r.stderr
    assert any("second line" in ln and "not rewritten" in ln for ln in lines), r.stderr
