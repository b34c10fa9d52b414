"""Conv -> per-channel Mul (tf2onnx's depthwise convs) folded into the weights, then Conv + Clip as one
FusedConv; a scalar or per-pixel Mul is left alone; training mode never folds."""

from __future__ import annotations

from fusecli.rewrite import RewriteOptions, rewrite
from tests.builders import Net
from tests.rewrite.helpers import assert_same_outputs, ops


def _conv_mul_clip(scale_shape=(1, 6, 1, 1), group=6):
    net = Net(x=("N", 6, 8, 8))
    y = net.op("Conv", "conv", "x", net.param("w", 6, 6 // group, 3, 3), net.param("b", 6), pads=[1, 1, 1, 1],
               group=group)
    y = net.op("Mul", "scale", y, net.param("s", *scale_shape, positive=True))
    return net.model(net.op("Clip", "relu6", y, net.param("lo", value=0.0), net.param("hi", value=6.0)))


def test_depthwise_conv_scale_is_folded_and_fused(save_model):
    path = save_model(_conv_mul_clip())
    r = rewrite(path, RewriteOptions(batch=2))
    assert r.verification.ok
    assert_same_outputs(path, r.model)
    assert ops(r.model) == {"com.microsoft.FusedConv": 1}
    assert [a.kernel for a in r.applied] == ["Conv(scale folded)", "FusedConv(Clip)"]


def test_per_pixel_scale_and_training_mode_are_left_alone(save_model):
    path = save_model(_conv_mul_clip(scale_shape=(1, 1, 8, 8)))
    assert "Mul" in ops(rewrite(path, RewriteOptions(batch=2)).model)
    path = save_model(_conv_mul_clip(group=1), "t.onnx")
    r = rewrite(path, RewriteOptions(batch=2, mode="training"))
    assert "Mul" in ops(r.model) and (r.verification is None if r.unchanged else r.verification.ok)
