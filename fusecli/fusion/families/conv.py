"""Conv epilogues: bias, BatchNorm (folded in inference), a residual add, an activation,
tf2onnx's per-channel scale, and the BatchNorm + add + activation of ResNet blocks."""

from __future__ import annotations

from ...core.trees import op
from ..match import Match
from ..notes_kit import ORT_CPU_CONV_ACTS, TF_CPU_ACTS, act, float32_out, verdict
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

# through tf2onnx's layout Transpose or not (rewrite/kernels/layout.py hands the plain ones to conv.py)
KERNELS = {name: "conv_through_layout"
           for name in ("conv_bias_add_act", "conv_bias_act", "conv_bias", "conv_bias_bn_act",
                         "conv_bias_bn", "conv_bn_act", "conv_bn", "conv_squeeze_bias")}

# FusedConv activations (CPU; rewrite/kernels/conv.conv_activation)
FUSED_CONV_ACTS = frozenset({"relu", "relu6", "clip", "leaky_relu", "sigmoid", "tanh", "hard_sigmoid"})


def conv_label(m: Match, mode: str) -> str | None:
    """The after view's kernel: FusedConv for its activations, else the Conv with what it folds in."""
    if "layout" in m.roles or "act_gate" in m.roles:
        return None  # through tf2onnx's layout Transpose, or a silu-family act: no FusedConv form
    if act(m) in FUSED_CONV_ACTS and float32_out(m):
        return "FusedConv"
    folded = [name for role, name in (("bn", "BatchNorm"), ("bias", "bias")) if role in m.roles]
    if "bn" in m.roles and mode != "inference":
        return None  # BatchNorm is never folded for training
    return f"Conv ({' + '.join(folded)} folded)" if folded else None


LABELS = {name: conv_label for name in ("conv_bias_add_act", "conv_bias_act", "conv_bias", "conv_bn_act",
                                        "conv_bn", "conv_squeeze_bias")}


# -- framework notes (Grappler's remapper, ONNX Runtime's ConvActivationFusion, PyTorch) -------------------
def _spatial(m: Match, w) -> tuple:
    """Spatial dims of a filter: ONNX OIHW -> dims 2+, TensorFlow HWIO -> dims :-2."""
    conv = m.roles["conv"]
    return tuple(w.shape[:-2]) if conv.op_type in ("Conv2D", "Conv3D", "DepthwiseConv2dNative") \
        else tuple(w.shape[2:])


def _is_1x1(m: Match) -> bool:
    conv = m.roles.get("conv")
    w = conv.input(1) if conv is not None else None
    return bool(w is not None and w.shape and len(w.shape) >= 3 and all(d == 1 for d in _spatial(m, w)))


def _has_bias(m: Match) -> bool:
    conv = m.roles.get("conv")
    return "bias" in m.roles or (conv is not None and conv.input(2) is not None)


def _tf_conv_bias_act(m: Match) -> dict:
    """Conv2D + BiasAdd + act: _FusedConv2D on CPU; cuDNN's fused conv on GPU for Relu, float32, not 1x1."""
    a = act(m)
    dtype = m.root.outputs[0].dtype if m.root.outputs and m.root.outputs[0] is not None else "float32"
    if not _has_bias(m):
        return verdict(False, False, "the remapper needs a BiasAdd between the conv and the activation")
    cpu = a in TF_CPU_ACTS
    gpu = a == "relu" and dtype == "float32" and not _is_1x1(m)
    why = [] if gpu else [r for r, bad in (
        (f"GPU fuses only Relu (not {a})", a != "relu"),
        (f"GPU fuses float32 only (not {dtype})", dtype != "float32"),
        ("GPU skips 1x1 filters", _is_1x1(m))) if bad]
    return verdict(cpu, gpu, "_FusedConv2D" + (f"; {'; '.join(why)}" if why else "")
                   + ("" if cpu else f"; CPU fuses {', '.join(sorted(TF_CPU_ACTS))} only"))


def _tf_conv_bn(m: Match) -> dict:
    """Conv2D + FusedBatchNorm (+ act): CPU only, inference only."""
    a = act(m)
    if m.roles["bn"].kind != "batch_norm":
        return verdict(False, False, "a decomposed BatchNorm (Mul/Add) is not a remapper pattern")
    if a is not None and a not in TF_CPU_ACTS:
        return verdict(False, False, f"the CPU remap takes {', '.join(sorted(TF_CPU_ACTS))}, not {a}")
    return verdict(True, False, "CPU only, in inference only (FusedBatchNorm with is_training=False): "
                   "BatchNorm's backward needs the conv output")


def _tf_bn_act(m: Match) -> dict:
    """FusedBatchNorm + Relu (+ side input): _FusedBatchNormEx; on CPU without the side input only (Grappler's
    CPU remapper, asked in tests/fusion/test_frameworks.py, TensorFlow 2.21: inference and training)."""
    a = act(m)
    if m.roles["bn"].kind != "batch_norm":
        return verdict(False, False, "a decomposed BatchNorm (Mul/Add) is not a remapper pattern")
    side = m.pattern.name == "bn_add_act"
    where = "on GPU only (cuDNN, NHWC) with the side input" if side else "on CPU and GPU (cuDNN, NHWC)"
    return verdict(a == "relu" and not side, a == "relu", f"_FusedBatchNormEx {where}, Relu only"
                   + ("" if a == "relu" else f", not {a}"))


def _ort_fused_conv(m: Match) -> dict:
    """ConvActivationFusion: FusedConv with Relu/Sigmoid/Tanh/LeakyRelu/Clip/HardSigmoid on CPU, Relu on
    CUDA."""
    a = act(m)
    prefix = "BatchNorm folds into the Conv (ConvBNFusion); then " if "bn" in m.pattern.name else ""
    cpu = a in ORT_CPU_CONV_ACTS
    return verdict(cpu, a == "relu", prefix + "com.microsoft FusedConv"
                   + ("" if cpu else f"; its CPU kernel has no {a}")
                   + ("; the CUDA FusedConv kernel takes Relu only" if a != "relu" else
                      "; on CUDA recent releases no longer fuse it themselves (fusecli rewrite does)"))


def _ort_conv_mul(m: Match) -> dict:
    """ConvMulFusion folds the per-channel Mul into the weights (then FusedConv for an act)."""
    a = act(m)
    if a is None:
        return verdict(True, True, "ConvMulFusion folds the per-channel Mul into the weights, inference only")
    cpu = a in ORT_CPU_CONV_ACTS
    return verdict(cpu, a == "relu", "ConvMulFusion folds the Mul into the weights, then "
                   "com.microsoft FusedConv" + ("" if cpu else f"; its CPU kernel has no {a}")
                   + ("" if a == "relu" else "; the CUDA FusedConv kernel takes Relu only"))


def _pytorch_bn_act(m: Match) -> dict | None:
    """torch.compile fuses BN + silu (the default note for the others)."""
    if act(m) in ("silu", "swish"):
        return verdict(None, None, "torch.compile fuses BN + act, recomputing the BN output when the min-cut "
                       "partitioner finds it cheaper")
    return None


_FOLDED = (True, True, "folded into the Conv's weights and bias (ConvAddFusion, ConvBNFusion, "
           "ConvMulFusion), inference only")
_BIAS_BETWEEN = (False, False, "the remapper folds BatchNorm only when it reads the Conv2D directly; here a "
                 "BiasAdd sits between (Conv2D + BiasAdd alone become _FusedConv2D)")
NOTES = {
    "conv_bias_add_act": {"onnxruntime": _ort_fused_conv},
    "conv_bias_act": {"tensorflow": _tf_conv_bias_act, "onnxruntime": _ort_fused_conv},
    "conv_bias": {"tensorflow": (True, False, "_FusedConv2D on CPU; on GPU the remapper needs an activation"),
                  "onnxruntime": _FOLDED},
    "conv_bias_bn_act": {"tensorflow": _BIAS_BETWEEN, "onnxruntime": _ort_fused_conv},
    "conv_bias_bn": {"tensorflow": _BIAS_BETWEEN, "onnxruntime": _FOLDED},
    "conv_bn_act": {"tensorflow": _tf_conv_bn, "onnxruntime": _ort_fused_conv},
    "conv_bn": {"tensorflow": _tf_conv_bn, "onnxruntime": _FOLDED},
    "bn_add_act": {"tensorflow": _tf_bn_act},
    "bn_act": {"tensorflow": _tf_bn_act, "pytorch": _pytorch_bn_act},
    "conv_mul": {"tensorflow": (False, False, "not a Grappler remapper pattern (a Mul is no FusedBatchNorm)"),
                 "onnxruntime": _ort_conv_mul},
    "conv_squeeze_bias": {"tensorflow": (True, False, "_FusedConv2D with Squeeze, CPU only")},
}
