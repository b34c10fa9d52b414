"""tf2onnx's output fixed before analysis: its generated dim names renamed to the loader's, Erfc written with
Erf (checked against math.erfc through onnxruntime), rank-3 GlobalAveragePool as ReduceMean, and any
other TensorFlow op left unconverted refused in one line."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusecli.core.errors import FuseError
from fusecli.rewrite.graph.converted import (
    fix_conversion,
    global_pools_as_means,
    rename_input_dims,
    replace_erfc,
)
from tests.rewrite.helpers import ops


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _run(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _scalar(name: str, v: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(v, np.float32), name)


def _erfc(z: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erfc)(z.astype(np.float64))


X = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["unk__3", "unk__4", 8])
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["unk__5", "unk__6", 8])


def test_tensorflow_gelu_erfc_becomes_one_plus_erf_of_the_positive_argument():
    """0.5 x erfc(-x / sqrt 2) (TensorFlow's exact GELU) -> 0.5 x (1 + erf(x / sqrt 2))."""
    c = 1 / math.sqrt(2)
    nodes = [helper.make_node("Neg", ["x"], ["neg"]), helper.make_node("Mul", ["neg", "c"], ["arg"]),
             helper.make_node("Erfc", ["arg"], ["e"]), helper.make_node("Mul", ["x", "half"], ["hx"]),
             helper.make_node("Mul", ["hx", "e"], ["y"])]
    model = _model(nodes, [X], [Y], [_scalar("c", c), _scalar("half", 0.5)])
    assert replace_erfc(model) == 1
    assert ops(model) == {"Mul": 3, "Erf": 1, "Add": 1}  # the Neg and the old Mul are gone
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32) * 3
    want = 0.5 * x * _erfc(-x * c)
    np.testing.assert_allclose(_run(model, {"x": x}), want, rtol=1e-5, atol=1e-6)


def test_any_other_erfc_is_one_minus_erf():
    nodes = [helper.make_node("Exp", ["x"], ["ex"]), helper.make_node("Erfc", ["ex"], ["y"])]
    model = _model(nodes, [X], [Y])
    assert replace_erfc(model) == 1 and ops(model) == {"Exp": 1, "Erf": 1, "Sub": 1}
    x = np.random.default_rng(1).standard_normal((2, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(model, {"x": x}), _erfc(np.exp(x)), rtol=1e-5, atol=1e-6)


def test_generated_dims_take_the_loader_names():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    model = _model(nodes, [X], [Y], [])
    model.graph.value_info.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["unk__4", "unk__9"]))
    mapping = rename_input_dims(model, {"x": ("batch", "x_dim1", 8)})
    assert mapping == {"unk__3": "batch", "unk__4": "x_dim1"}
    dims = [[d.dim_param if d.HasField("dim_param") else d.dim_value if d.HasField("dim_value") else None
             for d in v.type.tensor_type.shape.dim]
            for v in (model.graph.input[0], model.graph.output[0], model.graph.value_info[0])]
    # the input named as analyze names it; other generated names cleared for shape inference to derive
    assert dims == [["batch", "x_dim1", 8], [None, None, 8], ["x_dim1", None]]


def test_inputs_matched_by_position_when_the_names_differ():
    model = _model([helper.make_node("Relu", ["x:0"], ["y"])],
                   [helper.make_tensor_value_info("x:0", TensorProto.FLOAT, ["unk__1", 4])], [Y])
    assert rename_input_dims(model, {"images": ("batch", 4)}) == {"unk__1": "batch"}


def test_rank_three_global_average_pool_is_a_mean_over_the_last_axis():
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 1])])
    x = np.random.default_rng(2).standard_normal((2, 3, 8)).astype(np.float32)
    want = _run(model, {"x": x})
    assert global_pools_as_means(model) == 1 and ops(model) == {"ReduceMean": 1}
    np.testing.assert_allclose(_run(model, {"x": x}), want, rtol=1e-6)
    np.testing.assert_allclose(want, x.mean(axis=-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_image_global_average_pool_stays():
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 1, 1])])
    assert global_pools_as_means(model) == 0 and ops(model) == {"GlobalAveragePool": 1}


def test_an_unconverted_tensorflow_op_is_one_line():
    nodes = [helper.make_node("Erfinv", ["x"], ["y"])]  # no ONNX schema: onnxruntime cannot load it
    model = _model(nodes, [X], [Y])
    with pytest.raises(FuseError) as e:
        fix_conversion(model, {"x": ("batch", "x_dim1", 8)}, "saved")
    line = str(e.value)
    assert "\n" not in line and "Erfinv x1" in line and "tf2onnx" in line
