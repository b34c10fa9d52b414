"""Rewrite of models with Constant-node weights: values read lazily, weights written back as Constants."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from fusecli.rewrite import RewriteOptions, rewrite
from fusecli.rewrite.graph.splice import write_spliced
from fusecli.rewrite.graph.values import Weights
from fusecli.rewrite.source import load_weights
from tests.conftest import make_model, vi
from tests.load.onnxscript_models import save
from tests.rewrite.helpers import assert_same_outputs, ops


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"make_{name}",
                            value=numpy_helper.from_array(value.astype(np.float32), name))


def _conv_bn_relu() -> onnx.ModelProto:
    """Conv (weight and bias) + BatchNormalization + Relu, every weight a Constant node."""
    rng = np.random.default_rng(0)
    consts = [_constant("w", rng.standard_normal((16, 8, 3, 3)) * 0.2),
              _constant("b", rng.standard_normal(16)),
              _constant("gamma", 1 + 0.1 * rng.standard_normal(16)),
              _constant("beta", rng.standard_normal(16)),
              _constant("mean", rng.standard_normal(16)), _constant("var", 1 + rng.random(16))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["y"], name="relu")]
    return make_model(consts + nodes, [vi("x", "N", 8, 6, 6)], [vi("y", "N", 16, 6, 6)])


def test_folded_weights_are_written_back_as_constant_nodes(save_model, tmp_path):
    path = save_model(_conv_bn_relu())
    out = str(tmp_path / "out.onnx")
    r = rewrite(path, RewriteOptions(batch=2), out)
    assert r.verification.ok and ops(r.model)["com.microsoft.FusedConv"] == 1
    written = onnx.load(out)
    assert not written.graph.initializer  # as the input holds them: in Constant nodes
    fused = next(n for n in written.graph.node if n.op_type == "FusedConv")
    made = {n.output[0]: n for n in written.graph.node if n.op_type == "Constant"}
    assert set(fused.input[1:]) <= set(made) and "w" not in fused.input  # the BatchNorm-folded W and B
    assert_same_outputs(path, out)
    assert written.SerializeToString() == r.model.SerializeToString()  # the result holds the weights too


def test_weights_are_read_only_where_asked(save_model):
    path = save_model(_conv_bn_relu())
    model, files = load_weights(path)
    assert files == []  # its own payloads are references to the model file, not other files

    def external():
        return {n.output[0] for n in model.graph.node if n.op_type == "Constant"
                and n.attribute[0].t.data_location == onnx.TensorProto.EXTERNAL}

    assert external() == {"w"}  # the 4.5 KiB conv weight; the 64-byte vectors were read with the graph
    weights = Weights(model, os.path.dirname(path))
    expected = numpy_helper.to_array(_conv_bn_relu().graph.node[0].attribute[0].t)
    np.testing.assert_array_equal(weights.value("w"), expected)
    assert external() == {"w"}  # read into the cache, the model still refers to the file


def test_spliced_writing_equals_the_loaded_model(save_model, tmp_path):
    """Initializers and Constant nodes, inline and in an external data file: written self-contained."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    nodes = [_constant("v", rng.standard_normal((64, 64))), helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("MatMul", ["m", "v"], ["y"])]
    model = make_model(nodes, [vi("x", "N", 64)], [vi("y", "N", 64)], [w])
    src = tmp_path / "ext.onnx"
    onnx.save_model(model, src, save_as_external_data=True, location="ext.data", size_threshold=1024)
    light, _ = load_weights(str(src))
    out = tmp_path / "out" / "o.onnx"
    out.parent.mkdir()
    write_spliced(light, str(out), str(tmp_path))
    written = onnx.load(out)  # no data file beside it: everything inline
    assert written.graph.initializer[0].raw_data == w.raw_data
    assert written.graph.node[0].attribute[0].t.raw_data == model.graph.node[0].attribute[0].t.raw_data


@pytest.fixture(scope="module")
def bart(tmp_path_factory) -> tuple[str, str]:
    return tuple(str(p) for p in save("bart_encoder", tmp_path_factory.mktemp("bart")))


def test_bart_encoder_rewrites_as_with_initializers(bart, tmp_path):
    constants, initializers = bart
    rc = rewrite(constants, RewriteOptions(), str(tmp_path / "c.onnx"))
    ri = rewrite(initializers, RewriteOptions(), str(tmp_path / "i.onnx"))
    assert rc.verification.ok and ri.verification.ok
    assert rc.kernel_counts() == ri.kernel_counts() and rc.applied
    assert not onnx.load(tmp_path / "c.onnx").graph.initializer
    assert_same_outputs(constants, str(tmp_path / "c.onnx"), batch=1)
