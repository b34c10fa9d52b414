"""Would TensorFlow's Grappler remapper or ONNX Runtime fuse this match, on CPU and on GPU, and why not.

Facts from Grappler's remapper (seed post "Fused Operations in Tensorflow": Conv2D+BiasAdd+act on
GPU through cuDNN's cudnnConvolutionBiasActivationForward, Relu only, float32, not for 1x1 filters;
Conv2D+FusedBatchNorm(+act) on CPU in inference only; Conv2D+Squeeze+BiasAdd on CPU only) and
from ONNX Runtime's graph transformers (ConvActivationFusion: FusedConv with Relu/Sigmoid/Tanh/
LeakyRelu/Clip/HardSigmoid on CPU, Relu only in the CUDA FusedConv kernel; FusedGemm CPU only;
MatMulScaleFusion, GeluFusion, BiasGeluFusion, LayerNormFusion, SkipLayerNormFusion).
"""

from __future__ import annotations

from ..spellings.acts import gate_act_kind
from .emitted import attention_kernel
from .match import Match

TF_CPU_ACTS = frozenset({"relu", "relu6", "elu", "leaky_relu"})
ORT_CPU_CONV_ACTS = frozenset({"relu", "sigmoid", "tanh", "leaky_relu", "relu6", "clip", "hard_sigmoid"})


def _verdict(cpu: bool | None, gpu: bool | None, note: str) -> dict:
    return {"cpu": cpu, "gpu": gpu, "note": note}


def _act(m: Match) -> str | None:
    return gate_act_kind(m.roles)  # relu, ..., or silu / swish / quick_gelu / hard_swish


def _is_1x1(m: Match) -> bool:
    conv = m.roles.get("conv")
    w = conv.input(1) if conv is not None else None
    return bool(w is not None and w.shape and len(w.shape) >= 3 and all(d == 1 for d in _spatial(m, w)))


def _spatial(m: Match, w) -> tuple:
    """Spatial dims of a filter: ONNX OIHW -> dims 2+, TensorFlow HWIO -> dims :-2."""
    conv = m.roles["conv"]
    return tuple(w.shape[:-2]) if conv.op_type in ("Conv2D", "Conv3D", "DepthwiseConv2dNative") \
        else tuple(w.shape[2:])


def _has_bias(m: Match) -> bool:
    conv = m.roles.get("conv")
    return "bias" in m.roles or (conv is not None and conv.input(2) is not None)


def _tensorflow(m: Match) -> dict:
    name, act = m.pattern.name, _act(m)
    dtype = m.root.outputs[0].dtype if m.root.outputs and m.root.outputs[0] is not None else "float32"
    if name == "conv_bias_act":
        if not _has_bias(m):
            return _verdict(False, False, "the remapper needs a BiasAdd between the conv and the activation")
        cpu = act in TF_CPU_ACTS
        gpu = act == "relu" and dtype == "float32" and not _is_1x1(m)
        why = [] if gpu else [r for r, bad in (
            (f"GPU fuses only Relu (not {act})", act != "relu"),
            (f"GPU fuses float32 only (not {dtype})", dtype != "float32"),
            ("GPU skips 1x1 filters", _is_1x1(m))) if bad]
        return _verdict(cpu, gpu, "_FusedConv2D" + (f"; {'; '.join(why)}" if why else "")
                        + ("" if cpu else f"; CPU fuses {', '.join(sorted(TF_CPU_ACTS))} only"))
    if name == "conv_bias":
        return _verdict(True, False, "_FusedConv2D on CPU; on GPU the remapper needs an activation")
    if name == "conv_mul":
        return _verdict(False, False, "not a Grappler remapper pattern (a Mul is no FusedBatchNorm)")
    if name in ("conv_bias_bn_act", "conv_bias_bn"):
        return _verdict(False, False, "the remapper folds BatchNorm only when it reads the Conv2D directly; "
                        "here a BiasAdd sits between (Conv2D + BiasAdd alone become _FusedConv2D)")
    if name in ("conv_bn_act", "conv_bn"):
        if m.roles["bn"].kind != "batch_norm":
            return _verdict(False, False, "a decomposed BatchNorm (Mul/Add) is not a remapper pattern")
        if act is not None and act not in TF_CPU_ACTS:
            return _verdict(False, False, f"the CPU remap takes {', '.join(sorted(TF_CPU_ACTS))}, not {act}")
        return _verdict(True, False, "CPU only, in inference only (FusedBatchNorm with is_training=False): "
                        "BatchNorm's backward needs the conv output")
    if name == "conv_squeeze_bias":
        return _verdict(True, False, "_FusedConv2D with Squeeze, CPU only")
    if name in ("bn_act", "bn_add_act"):
        if m.roles["bn"].kind != "batch_norm":
            return _verdict(False, False, "a decomposed BatchNorm (Mul/Add) is not a remapper pattern")
        return _verdict(False, act == "relu", "_FusedBatchNormEx on GPU only (cuDNN, NHWC), Relu only"
                        + ("" if act == "relu" else f", not {act}"))
    if name == "matmul_transpose":
        return _verdict(True, True, "the arithmetic optimizer folds the Transpose into MatMul's transpose_b")
    if name in ("matmul_bias_act", "matmul_bias"):
        return _verdict(act is None or act in TF_CPU_ACTS | {"tanh", "sigmoid", "gelu"}, None,
                        "_FusedMatMul on CPU; on GPU it depends on the TensorFlow build's cuBLASLt epilogues")
    if name in ("gelu", "bias_gelu", "layer_norm"):
        return _verdict(None, False, "remapped only in oneDNN CPU builds")
    if name == "bn_grad_relu_grad":
        return _verdict(False, True, "_FusedBatchNormGradEx on GPU (the backward of _FusedBatchNormEx)")
    if name == "attention":
        return _verdict(False, None, "not a Grappler remapper pattern; on GPU the model must call a fused "
                        "kernel itself (Keras 3 dot_product_attention(flash_attention=True): cuDNN fused "
                        "attention, which keeps the row statistics and recomputes P in backward)")
    if name == "silu":
        return _verdict(None, False, "Sigmoid + Mul becomes _MklSwish only in oneDNN CPU builds")
    return _verdict(False, False, "not a Grappler remapper pattern")


def _onnxruntime(m: Match) -> dict:
    name, act = m.pattern.name, _act(m)
    if name in ("conv_bias_act", "conv_bias_add_act", "conv_bn_act", "conv_bias_bn_act"):
        prefix = "BatchNorm folds into the Conv (ConvBNFusion); then " if "bn" in name else ""
        cpu = act in ORT_CPU_CONV_ACTS
        return _verdict(cpu, act == "relu", prefix + "com.microsoft FusedConv"
                        + ("" if cpu else f"; its CPU kernel has no {act}")
                        + ("; the CUDA FusedConv kernel takes Relu only" if act != "relu" else
                           "; on CUDA recent releases no longer fuse it themselves (fusecli rewrite does)"))
    if name == "conv_mul":
        if act is None:
            return _verdict(True, True, "ConvMulFusion folds the per-channel Mul into the weights, "
                            "inference only")
        cpu = act in ORT_CPU_CONV_ACTS
        return _verdict(cpu, act == "relu", "ConvMulFusion folds the Mul into the weights, then "
                        "com.microsoft FusedConv" + ("" if cpu else f"; its CPU kernel has no {act}")
                        + ("" if act == "relu" else "; the CUDA FusedConv kernel takes Relu only"))
    if name in ("conv_bias", "conv_bn", "conv_bias_bn"):
        return _verdict(True, True, "folded into the Conv's weights and bias (ConvAddFusion, ConvBNFusion, "
                        "ConvMulFusion), inference only")
    if name == "matmul_bias":
        return _verdict(True, True, "MatMulAddFusion makes a Gemm (2-D inputs)")
    if name == "matmul_bias_act":
        return _verdict(True, False, "FusedGemm exists on CPU only")
    if name == "matmul_scale":
        return _verdict(True, True, "com.microsoft FusedMatMul with alpha (MatMulScaleFusion)")
    if name == "matmul_transpose":
        return _verdict(True, True, "com.microsoft FusedMatMul with transB (MatMulTransposeFusion)")
    if name == "skip_layer_norm" and _sum_read_again(m):
        return _verdict(False, False, "SkipLayerNormFusion leaves a residual sum that is read again (pre-LN "
                        "blocks); SkipLayerNormalization's 4th output can write it (fusecli rewrite does)")
    if name == "rms_norm" and any(n.kind in ("reciprocal", "rsqrt") for n in m.nodes):
        return _verdict(False, False, "SimplifiedLayerNormFusion matches x / sqrt(...) and "
                        "x * (1 / sqrt(...)), not this Reciprocal / Rsqrt spelling")
    if name in ("gelu", "bias_gelu", "layer_norm", "skip_layer_norm"):
        op = {"gelu": "Gelu", "bias_gelu": "BiasGelu", "layer_norm": "LayerNormalization",
              "skip_layer_norm": "SkipLayerNormalization"}[name]
        if name in ("gelu", "bias_gelu") and any(n.kind == "tanh" for n in m.nodes):
            op = "FastGelu"  # the tanh approximation
        return _verdict(True, True, f"{op} ({op}Fusion at ORT_ENABLE_EXTENDED)")
    if name == "attention" and attention_kernel(m) is not None:
        return _verdict(True, True, f"com.microsoft {attention_kernel(m)} (CPU float32, CUDA), as fusecli "
                        "rewrite emits it; ORT's own AttentionFusion fuses BERT-style graphs only, and "
                        "onnxruntime.transformers.optimizer others by model type; inference kernels, no "
                        "backward")
    if name in ORT_TRANSFORMERS:
        cpu, gpu, note = ORT_TRANSFORMERS[name]
        if name == "attention" and "repeat_k" in m.roles:
            note = ("grouped-query (K/V repeated): GroupQueryAttention from "
                    "onnxruntime.transformers.optimizer; " + note)
        return _verdict(cpu, gpu, note)
    if m.pattern.phase == "backward":
        return _verdict(False, False, "ONNX Runtime inference runs no backward")
    return _verdict(False, False, "no ONNX Runtime fusion for this pattern")


# ONNX Runtime for the transformer-era patterns: None where it depends on the optimizer that is run
ORT_TRANSFORMERS = {
    "attention": (None, None, "Attention / MultiHeadAttention: AttentionFusion (BERT-style graphs) or "
                  "onnxruntime.transformers.optimizer for the model type; inference kernels, no backward"),
    "rms_norm": (True, True, "SimplifiedLayerNormalization (SimplifiedLayerNormFusion)"),
    "skip_rms_norm": (None, None, "SkipSimplifiedLayerNormalization (onnxruntime.transformers.optimizer), "
                      "the sum as its 4th output"),
    "rotary": (None, None, "com.microsoft RotaryEmbedding (onnxruntime.transformers.optimizer)"),
    "silu": (True, True, "QuickGelu(alpha) (QuickGeluFusion: x * sigmoid(alpha x))"),
    "swiglu": (False, False, "no ONNX Runtime fusion of silu(a) * b"),
    "hard_swish": (False, False, "no fusion of the decomposed form (the HardSwish op itself is one kernel)"),
    "bias_softmax": (False, True, "BiasSoftmax (BiasSoftmaxFusion, CUDA and ROCm only)"),
    "bias_dropout": (False, None, "BiasDropout (BiasDropoutFusion, CUDA; inference removes Dropout)"),
}

# PyTorch: what its fused kernels do for each pattern (None: only when the model or torch.compile asks)
PYTORCH = {
    "attention": (True, True, "F.scaled_dot_product_attention: the flash and memory-efficient backends "
                  "(and cuDNN fused attention on Hopper) keep the logsumexp per row and recompute P in "
                  "backward; an eager softmax(q k^T) v model must call it (or torch.compile rewrites it)"),
    "rms_norm": (True, True, "F.rms_norm (a fused kernel from PyTorch 2.4; torch.compile fuses the eager "
                 "form)"),
    "skip_rms_norm": (None, None, "torch.compile fuses the residual add into the norm"),
    "silu": (True, True, "F.silu is one kernel that saves x and recomputes sigmoid in backward"),
    "swiglu": (None, None, "torch.compile or Liger-Kernel's SwiGLU fuse silu(a) * b, recomputing silu(a)"),
    "hard_swish": (True, True, "F.hardswish is one kernel that saves x"),
    "matmul_transpose": (True, True, "F.linear's GEMM reads w^T in place (a strided view, no copy)"),
    "bn_act": (None, None, "torch.compile fuses BN + act, recomputing the BN output when the min-cut "
               "partitioner finds it cheaper"),
}


def _pytorch(m: Match) -> dict:
    name = m.pattern.name
    if name == "bn_act" and _act(m) in ("silu", "swish"):
        return _verdict(None, None, PYTORCH["bn_act"][2])
    if name in PYTORCH and name != "bn_act":
        return _verdict(*PYTORCH[name])
    return _verdict(None, None, "eager PyTorch runs each op; torch.compile (Inductor) may fuse it")


def _sum_read_again(m: Match) -> bool:
    """The residual sum of a skip norm is read outside the match (pre-LN blocks)."""
    t = m.bound.get("x")
    inside = {id(n) for n in m.nodes}
    return t is not None and any(id(c) not in inside for c in t.consumers)


def framework_notes(m: Match) -> dict:
    return {"tensorflow": _tensorflow(m), "onnxruntime": _onnxruntime(m), "pytorch": _pytorch(m)}


def not_fusable_notes(notes: dict) -> dict:
    """A match that is not fusable here is fused by no framework, whatever the pattern allows elsewhere."""
    return {k: _verdict(False, False, "not fusable here: an interior tensor must be written out; "
                        f"elsewhere: {v['note']}") for k, v in notes.items()}
