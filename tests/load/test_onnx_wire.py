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
