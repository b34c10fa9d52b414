from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from fusecli.load import load_model
from fusecli.load.onnx_wire import KEEP_BYTES, WireError, read_structure
from tests.conftest import ZOO_MODELS, make_model, vi


def _without_big_data(model: onnx.ModelProto) -> onnx.ModelProto:
    """What read_structure should give: the same model with large initializer payloads cleared."""
    slim = onnx.ModelProto()
    slim.CopyFrom(model)
    for t in slim.graph.initializer:
        if len(t.raw_data) + 4 * len(t.float_data) > KEEP_BYTES:
            for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
                          "uint64_data", "string_data"):
                t.ClearField(field)
    return slim


def _big_model(n: int = 512) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.ones((n,), np.float32), "b")
    shape = numpy_helper.from_array(np.array([-1, n], np.int64), "shape")
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    return make_model(nodes, [vi("x", "N", n)], [vi("y", "N", n)], [w, b, shape])


def test_structure_is_the_model_without_large_payloads(save_model):
    model = _big_model()
    path = save_model(model)
    slim, omitted = read_structure(path)
    assert omitted == {"w"}  # 1 MiB of floats; the 2 KiB bias and the shape constant are kept
    assert slim.SerializeToString() == _without_big_data(model).SerializeToString()
    assert slim.ByteSize() < 10_000 < model.ByteSize()


@pytest.mark.parametrize("path", ZOO_MODELS[:3], ids=lambda p: p.stem)
def test_small_models_read_back_byte_identical(path):
    slim, omitted = read_structure(str(path))
    assert omitted == set()
    assert slim.SerializeToString() == onnx.load(str(path)).SerializeToString()


def test_loader_keeps_shapes_and_marks_weights_unread(save_model):
    g = load_model(save_model(_big_model()))
    assert g.tensors["w"].shape == (512, 512) and g.tensors["w"].meta.get("data_omitted")
    assert g.tensors["r"].shape[1] == 512  # the Reshape's shape constant was kept for inference
    assert "value" in g.tensors["shape"].meta


def test_truncated_bytes_raise_wire_error(tmp_path):
    data = _big_model(64).SerializeToString()
    for cut in (1, len(data) // 3, len(data) - 1):
        p = tmp_path / f"cut{cut}.onnx"
        p.write_bytes(data[:cut])
        with pytest.raises((WireError, Exception)):
            read_structure(str(p))


# -- weights held in Constant nodes ---------------------------------------------------------------------
def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"make_{name}",
                            value=numpy_helper.from_array(value, name))


def _constant_model() -> onnx.ModelProto:
    """Weights in Constant nodes: in the main graph, inside an If branch, and in a local function."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.ones(2000, np.float32), "v"),
                                       numpy_helper.from_array(np.arange(2000, dtype=np.int64), "i"),
                                       [64, 64])
    branch = helper.make_graph([_constant("w_then", w), helper.make_node("MatMul", ["x", "w_then"], ["t"])],
                               "then", [], [vi("t", "N", 64)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [vi("e", "N", 64)])
    fn = helper.make_function("local", "Proj", ["a"], ["b"],
                              [_constant("w_fn", w), helper.make_node("MatMul", ["a", "w_fn"], ["b"])],
                              [helper.make_opsetid("", 17)])
    nodes = [_constant("w", w), _constant("eps", np.array(1e-5, np.float32)),
             _constant("shape", np.array([-1, 64], np.int64)),
             helper.make_node("Constant", [], ["s"], sparse_value=sparse),
             helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "eps"], ["a"]),
             helper.make_node("Reshape", ["a", "shape"], ["r"]),
             helper.make_node("MatMul", ["r", "s"], ["q"]),
             helper.make_node("Proj", ["q"], ["p"], domain="local"),
             helper.make_node("ReduceSum", ["p"], ["sum"], keepdims=0),
             helper.make_node("Greater", ["sum", "eps"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=other)]
    model = make_model(nodes, [vi("x", "N", 64)], [vi("y", "N", 64)])
    model.functions.append(fn)
    model.opset_import.append(helper.make_opsetid("local", 1))
    return model


def _tensors(model: onnx.ModelProto):
    """Every Constant's value tensor (sparse: its values), by output name, in graphs and functions."""
    found = {}

    def walk(nodes):
        for n in nodes:
            for a in n.attribute:
                if a.name == "value":
                    found[n.output[0]] = a.t
                elif a.name == "sparse_value":
                    found[n.output[0]] = a.sparse_tensor.values
                for g in [a.g] if a.HasField("g") else []:
                    walk(g.node)

    walk(model.graph.node)
    for f in model.functions:
        walk(f.node)
    return found


def test_constant_payloads_are_skipped_in_graphs_subgraphs_and_functions(save_model):
    model = _constant_model()
    slim, omitted = read_structure(save_model(model))
    assert omitted == {"w", "s"}  # the main graph's Constant weights (a 16 KiB dense, an 8 KiB sparse one)
    full, light = _tensors(model), _tensors(slim)
    for name in ("w", "w_then", "w_fn", "s"):
        t = light[name]
        assert not t.raw_data and t.data_type == full[name].data_type
        assert list(t.dims) == list(full[name].dims)
    for name in ("eps", "shape"):  # small constants stay readable
        assert light[name].SerializeToString() == full[name].SerializeToString()
    assert slim.ByteSize() < 4000 < 3 * 16384 < model.ByteSize()


def test_external_references_read_back_the_same_weights(save_model, tmp_path):
    model = _constant_model()
    path = save_model(model)
    refs, _ = read_structure(path, external=True)
    light = _tensors(refs)
    assert light["w"].data_location == onnx.TensorProto.EXTERNAL and light["w_fn"].HasField("data_location")
    assert numpy_helper.to_array(light["w_then"], str(tmp_path)).tobytes() == \
        numpy_helper.to_array(_tensors(model)["w_then"]).tobytes()
    onnx.external_data_helper.load_external_data_for_model(refs, str(tmp_path))
    for name, t in _tensors(model).items():
        np.testing.assert_array_equal(numpy_helper.to_array(_tensors(refs)[name]), numpy_helper.to_array(t))


def test_constant_weights_keep_shapes_and_are_marked_unread(save_model):
    g = load_model(save_model(_constant_model()))
    assert g.tensors["w"].shape == (64, 64) and g.tensors["w"].meta.get("data_omitted")
    assert g.tensors["w"].kind == "parameter"  # the MatMul's weight operand
    assert "value" in g.tensors["eps"].meta and "value" in g.tensors["shape"].meta
    assert g.tensors["r"].shape[1] == 64  # the Reshape's shape constant was read
