from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusecli.core.errors import FuseError
from fusecli.load import load_model
from tests.conftest import ZOO_MODELS, make_model, vi


@pytest.mark.parametrize("name", ["conv_bias_relu", "conv_bn_relu", "bn_add_relu",
                                  "conv_squeeze_bias", "matmul_bias_relu"])
def test_samples_load_with_kinds_and_shapes(sample, name):
    path = sample(name)
    g = load_model(path)
    g.lint()
    assert len(g.nodes) == len(onnx.load(path).graph.node)
    assert all(t.shape_known for t in g.tensors.values())
    assert [t.kind for t in g.inputs] == ["input"]


def test_conv_bias_relu_kinds(sample):
    g = load_model(sample("conv_bias_relu"))
    assert [n.kind for n in g.nodes] == ["conv", "bias_add", "relu"]
    assert g.tensors["w"].kind == "parameter"
    assert g.tensors["conv_out"].shape == ("N", 8, 16, 16)
    assert g.tensors["y"].nbytes({"N": 2}) == 2 * 8 * 16 * 16 * 4


def test_zoo_set_is_complete():
    assert len(ZOO_MODELS) == 9


@pytest.mark.parametrize("path", ZOO_MODELS, ids=lambda p: p.stem)
def test_zoo_graphs_load_fully_shaped_with_weights_as_parameters(path):
    model = onnx.load(str(path))
    g = load_model(str(path))
    g.lint()
    assert len(g.nodes) == len(model.graph.node)
    unknown = [t.name for t in g.tensors.values() if not t.shape_known]
    assert unknown == []
    convs = [n for n in g.nodes if n.kind == "conv"]
    assert convs and all(n.inputs[1].kind == "parameter" for n in convs)
    # ConstantOfShape subgraphs make weights, never activations
    assert all(t.kind in ("parameter", "constant") for n in g.nodes if n.op_type == "ConstantOfShape"
               for t in n.outputs)
    assert [t.kind for t in g.inputs] == ["input"]
    real_inputs = {i.name for i in model.graph.input} - {i.name for i in model.graph.initializer}
    assert {t.name for t in g.inputs} == real_inputs


def test_unnamed_nodes_get_stable_names(save_model):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["y"])]
    path = save_model(make_model(nodes, [vi("x", 2, 3)], [vi("y", 2, 3)]))
    assert [n.name for n in load_model(path).nodes] == ["Relu_0", "Sigmoid_1"]


def test_clip_and_bias_refinement(save_model):
    lo = numpy_helper.from_array(np.array(0, np.float32), "lo")
    hi = numpy_helper.from_array(np.array(6, np.float32), "hi")
    b = numpy_helper.from_array(np.zeros((4,), np.float32), "b")
    s = numpy_helper.from_array(np.zeros((2, 4), np.float32), "s")
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], "bias"),
             helper.make_node("Add", ["a", "s"], ["c"], "full_add"),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"], "clip")]
    g = load_model(save_model(make_model(nodes, [vi("x", 2, 4)], [vi("y", 2, 4)], [lo, hi, b, s])))
    assert [n.kind for n in g.nodes] == ["bias_add", "add", "relu6"]


def test_external_data_outside_folder_is_refused(tmp_path):
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="../secret.bin")
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", 1, 4)],
                       [vi("y", 1, 4)], [w])
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64)
    sub = tmp_path / "m"
    sub.mkdir()
    path = sub / "model.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(FuseError, match="outside the model's folder"):
        load_model(str(path))
    w.external_data[0].value = "weights.bin"
    path.write_bytes(make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", 1, 4)],
                                [vi("y", 1, 4)], [w]).SerializeToString())
    with pytest.raises(FuseError, match="missing"):
        load_model(str(path))
    (sub / "weights.bin").write_bytes(b"\0" * 64)
    g = load_model(str(path))  # present and inside: loads, data never read
    assert g.tensors["w"].shape == (4, 4) and "value" not in g.tensors["w"].meta


@pytest.mark.parametrize("case,match", [
    ("undefined", "which no node, input or initializer defines"),
    ("duplicate", "defined more than once"),
    ("cycle", "cycle"),
])
def test_broken_graphs_raise_one_clear_error(save_model, case, match):
    if case == "undefined":
        nodes = [helper.make_node("Relu", ["ghost"], ["y"])]
    elif case == "duplicate":
        nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Sigmoid", ["x"], ["y"])]
    elif case == "cycle":
        nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                 helper.make_node("Relu", ["a"], ["y"])]
    model = make_model(nodes, [vi("x", 2)], [vi("y", 2)])
    with pytest.raises(FuseError, match=match):
        load_model(save_model(model))


def test_old_opsets_load_with_a_warning(save_model):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", 2)], [vi("y", 2)], opset=6)
    g = load_model(save_model(model))
    assert [n.kind for n in g.nodes] == ["relu"]
    assert any("opset 6 is older" in w for w in g.meta["warnings"])


def test_unknown_ops_load_as_unknown_kind(save_model):
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Frobnicate", ["a"], ["y"], domain="example.custom")]
    model = make_model(nodes, [vi("x", 2)], [vi("y", 2)])
    model.opset_import.append(helper.make_opsetid("example.custom", 1))
    g = load_model(save_model(model))
    assert [n.kind for n in g.nodes] == ["relu", "unknown"]


def test_folder_is_not_an_onnx_file(tmp_path):
    with pytest.raises(FuseError, match="without saved_model.pb"):
        load_model(str(tmp_path))
    assert os.path.isdir(tmp_path)


def test_bias_after_a_conv_must_lie_on_the_channel_axis(save_model):
    w = numpy_helper.from_array(np.ones((4, 3, 1, 1), np.float32), "w")
    along_width = numpy_helper.from_array(np.ones((8,), np.float32), "b_w")
    along_channel = numpy_helper.from_array(np.ones((4, 1, 1), np.float32), "b_c")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], "conv"),
             helper.make_node("Add", ["c", "b_w"], ["a"], "add_width"),
             helper.make_node("Conv", ["x", "w"], ["c2"], "conv2"),
             helper.make_node("Add", ["c2", "b_c"], ["y2"], "add_channel")]
    path = save_model(make_model(nodes, [vi("x", 2, 3, 8, 8)], [vi("a", 2, 4, 8, 8), vi("y2", 2, 4, 8, 8)],
                                 [w, along_width, along_channel]))
    kinds = {n.name: n.kind for n in load_model(path).nodes}
    assert kinds["add_width"] == "add" and kinds["add_channel"] == "bias_add"
