"""tf2onnx's NHWC convs: Transpose -> Conv -> Transpose(0, 2, 3, 1) -> bias Add (last axis) -> Relu becomes
FusedConv(Relu) with the bias folded, then the Transpose; outputs checked by onnxruntime."""

from __future__ import annotations

from fusecli.rewrite import RewriteOptions, rewrite
from tests.builders import Net
from tests.rewrite.helpers import assert_same_outputs, attr, nodes, ops


def _nhwc_conv(act: str | None = "Relu"):
    net = Net(x=("N", 8, 8, 3))
    nchw = net.op("Transpose", "to_nchw", "x", perm=[0, 3, 1, 2])
    y = net.op("Conv", "conv", nchw, net.param("w", 4, 3, 3, 3), net.param("cb", 4), pads=[1, 1, 1, 1])
    y = net.op("Add", "bias", net.op("Transpose", "to_nhwc", y, perm=[0, 2, 3, 1]), net.param("b", 4))
    return net.model(net.op(act, "act", y) if act else y)


def test_conv_bias_relu_behind_layout_transpose_is_fused(save_model):
    path = save_model(_nhwc_conv())
    r = rewrite(path, RewriteOptions(batch=2))
    assert r.verification.ok
    assert_same_outputs(path, r.model)
    assert ops(r.model) == {"Transpose": 2, "com.microsoft.FusedConv": 1}
    (fc,) = nodes(r.model, "FusedConv")
    assert attr(fc, "activation") == "Relu" and len(fc.input) == 3
    assert attr(nodes(r.model, "Transpose")[-1], "perm") == [0, 2, 3, 1]


def test_bias_only_is_folded_into_the_conv(save_model):
    path = save_model(_nhwc_conv(act=None))
    r = rewrite(path, RewriteOptions(batch=2))
    assert_same_outputs(path, r.model)
    assert ops(r.model) == {"Transpose": 2, "Conv": 1}


def test_keras_scale_shift_after_bias_behind_layout_is_folded(save_model):
    """Keras 3 through tf2onnx: Conv -> Transpose -> + b -> * s + t (decomposed BatchNorm) -> Relu."""
    net = Net(x=("N", 8, 8, 3))
    nchw = net.op("Transpose", "to_nchw", "x", perm=[0, 3, 1, 2])
    y = net.op("Conv", "conv", nchw, net.param("w", 4, 3, 3, 3), pads=[1, 1, 1, 1])
    y = net.op("Add", "bias", net.op("Transpose", "to_nhwc", y, perm=[0, 2, 3, 1]), net.param("b", 4))
    y = net.op("Add", "shift", net.op("Mul", "scale", y, net.param("s", 4, positive=True)), net.param("t", 4))
    path = save_model(net.model(net.op("Relu", "act", y)))
    r = rewrite(path, RewriteOptions(batch=2))
    assert_same_outputs(path, r.model)
    assert ops(r.model) == {"Transpose": 2, "com.microsoft.FusedConv": 1}
    assert ops(rewrite(path, RewriteOptions(batch=2, mode="training")).model)["Mul"] == 1  # never folded
