"""Write the seed posts' graphs as small ONNX files: ``python samples/make_samples.py [OUT_DIR]``.

Weights are seeded random numbers, so the files are the same on every run. Batch is symbolic (``N``).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
_rng = np.random.default_rng(0)


def _weight(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((_rng.standard_normal(shape) * 0.1).astype(np.float32), name)


def _bn_params(prefix: str, c: int) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(v.astype(np.float32), f"{prefix}_{k}") for k, v in (
        ("scale", 1 + 0.1 * _rng.standard_normal(c)), ("bias", 0.1 * _rng.standard_normal(c)),
        ("mean", 0.1 * _rng.standard_normal(c)), ("var", 1 + 0.1 * _rng.random(c)))]


def _model(name: str, nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="fusecli-samples", ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def _io(name: str, *shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def conv_bias_relu() -> onnx.ModelProto:
    """y = relu(conv(x, w) + b): the first seed post's training-safe fusion (bias as its own Add)."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv_out"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["conv_out", "b"], ["bias_out"], "bias_add"),
             helper.make_node("Relu", ["bias_out"], ["y"], "relu")]
    return _model("conv_bias_relu", nodes, [_io("x", "N", 3, 16, 16)], [_io("y", "N", 8, 16, 16)],
                  [_weight("w", 8, 3, 3, 3), _weight("b", 8, 1, 1)])


def conv_bn_relu() -> onnx.ModelProto:
    """y = relu(bn(conv(x, w))): inference-only, BatchNorm's backward reads the conv output."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv_out"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["conv_out", "bn_scale", "bn_bias", "bn_mean",
                                                     "bn_var"], ["bn_out"], "bn"),
             helper.make_node("Relu", ["bn_out"], ["y"], "relu")]
    return _model("conv_bn_relu", nodes, [_io("x", "N", 3, 16, 16)], [_io("y", "N", 8, 16, 16)],
                  [_weight("w", 8, 3, 3, 3), *_bn_params("bn", 8)])


def bn_add_relu() -> onnx.ModelProto:
    """y = relu(bn(conv_a(x)) + conv_b(x)): the second seed post's BatchNorm-Add-ReLU, side input z."""
    nodes = [helper.make_node("Conv", ["x", "w_a"], ["conv_a_out"], "conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["conv_a_out", "bn_scale", "bn_bias", "bn_mean",
                                                     "bn_var"], ["bn_out"], "bn"),
             helper.make_node("Conv", ["x", "w_b"], ["z"], "conv_b"),
             helper.make_node("Add", ["bn_out", "z"], ["add_out"], "add"),
             helper.make_node("Relu", ["add_out"], ["y"], "relu")]
    return _model("bn_add_relu", nodes, [_io("x", "N", 8, 16, 16)], [_io("y", "N", 8, 16, 16)],
                  [_weight("w_a", 8, 8, 3, 3), _weight("w_b", 8, 8, 1, 1), *_bn_params("bn", 8)])


def conv_squeeze_bias() -> onnx.ModelProto:
    """y = squeeze(conv(x, w)) + b: Grappler's Conv2D + Squeeze + BiasAdd (a 1-D conv as 2-D)."""
    axes = numpy_helper.from_array(np.array([2], dtype=np.int64), "squeeze_axes")
    nodes = [helper.make_node("Conv", ["x", "w"], ["conv_out"], "conv", pads=[0, 1, 0, 1]),
             helper.make_node("Squeeze", ["conv_out", "squeeze_axes"], ["squeezed"], "squeeze"),
             helper.make_node("Add", ["squeezed", "b"], ["y"], "bias_add")]
    return _model("conv_squeeze_bias", nodes, [_io("x", "N", 4, 1, 32)], [_io("y", "N", 8, 32)],
                  [_weight("w", 8, 4, 1, 3), _weight("b", 8, 1), axes])


def matmul_bias_relu() -> onnx.ModelProto:
    """y = relu(x @ w + b): a dense layer, training-safe like Conv-Bias-ReLU."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["matmul_out"], "matmul"),
             helper.make_node("Add", ["matmul_out", "b"], ["bias_out"], "bias_add"),
             helper.make_node("Relu", ["bias_out"], ["y"], "relu")]
    return _model("matmul_bias_relu", nodes, [_io("x", "N", 64)], [_io("y", "N", 32)],
                  [_weight("w", 64, 32), _weight("b", 32)])


SAMPLES = {"conv_bias_relu": conv_bias_relu, "conv_bn_relu": conv_bn_relu,
           "bn_add_relu": bn_add_relu, "conv_squeeze_bias": conv_squeeze_bias,
           "matmul_bias_relu": matmul_bias_relu}


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    for name, make in SAMPLES.items():
        onnx.save(make(), os.path.join(out_dir, f"{name}.onnx"))
        print(os.path.join(out_dir, f"{name}.onnx"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
