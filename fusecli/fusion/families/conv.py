"""Conv epilogues: bias, BatchNorm (folded in inference), a residual add, an activation,
tf2onnx's per-channel scale, and the BatchNorm + add + activation of ResNet blocks."""

from __future__ import annotations

from ...rewrite import emit_layout
from ..match import op
from ..pattern_kit import (
    Pattern,
    X,
    acts,
    bias,
    bn_forms,
    channel_scale,
    conv,
    residual_add,
)

PATTERNS: tuple[Pattern, ...] = (
    Pattern("conv_bias_add_act", (*acts(residual_add(bias(conv()))), *acts(residual_add(conv()))),
            "FusedConv with Z / cudnnConvolutionBiasActivationForward",
            "y = act(conv(x, w) + b + z): cuDNN's fused conv with a side input"),
    Pattern("conv_bias_act", (*acts(bias(conv())), *acts(conv())),
            "FusedConv / _FusedConv2D / cudnnConvolutionBiasActivationForward",
            "y = act(conv(x, w) + b): backward reads x, w and y only [seed post 1]"),
    Pattern("conv_bias", (bias(conv()),), "Conv with bias / _FusedConv2D",
            "y = conv(x, w) + b: the bias joins the conv's epilogue"),
    Pattern("conv_bias_bn_act", tuple(a for f in bn_forms(bias(conv())) for a in acts(f)),
            "Conv with bias and folded BatchNorm + act",
            "y = act(bn(conv(x, w) + b)), as Keras writes Conv2D(use_bias=True) -> BN: BN reads the "
            "biased conv output, so inference only [seed post 1]"),
    Pattern("conv_bias_bn", bn_forms(bias(conv())), "Conv with bias and folded BatchNorm",
            "y = bn(conv(x, w) + b) = conv(x, w * s) + (b s + t) in inference"),
    Pattern("conv_bn_act", tuple(a for f in bn_forms(conv()) for a in acts(f)),
            "Conv with folded BatchNorm + act",
            "y = act(bn(conv(x, w))): BN's backward reads conv(x, w), so inference only [seed post 1]"),
    Pattern("conv_bn", bn_forms(conv()), "Conv with folded BatchNorm",
            "y = bn(conv(x, w)) = conv(x, w * s) + t in inference"),
    Pattern("bn_add_act", tuple(a for f in bn_forms(X) for a in acts(residual_add(f))),
            "_FusedBatchNormEx (side input)",
            "y = relu(bn(x) + z): BN reads x, Add reads nothing, ReLU reads y [seed post 2]"),
    Pattern("bn_act", tuple(a for f in bn_forms(X) for a in acts(f)), "_FusedBatchNormEx",
            "y = act(bn(x)): BN reads x and its statistics, ReLU reads y"),
    Pattern("conv_mul", (*acts(channel_scale(conv())), channel_scale(conv())),
            "Conv with the scale folded into W (+ act)",
            "y = act(conv(x, w) * s), s per channel (tf2onnx leaves BN's scale after the conv): Mul's "
            "backward reads the conv output for ds, so inference only; Mul+Add is conv_bn's Keras form"),
    Pattern("conv_squeeze_bias", (bias(op("squeeze", conv(), role="squeeze", more=True)),),
            "_FusedConv2D (Squeeze + BiasAdd)", "y = squeeze(conv(x, w)) + b: Grappler's CPU-only remap"),
)

# through tf2onnx's layout Transpose or not (emit_layout hands the plain ones to emit_conv)
EMITTERS = {name: emit_layout.through_layout
            for name in ("conv_bias_add_act", "conv_bias_act", "conv_bias", "conv_bias_bn_act",
                         "conv_bias_bn", "conv_bn_act", "conv_bn", "conv_squeeze_bias")}
