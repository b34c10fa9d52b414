"""The fusion catalogue: one short declarative entry per pattern (forms are alternative op trees).

Adding a pattern is one ``Pattern(...)`` entry here plus its tests in tests/fusion/.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..ir import Tensor
from ..spellings import gelu, norms
from ..spellings.acts import HARD_SWISH, SILU, gate_acts
from ..spellings.common import ADD, SUM, is_activation, is_param, optional, scalar, select, swaps_last_two
from ..spellings.rotary import ROTARY
from .attention import attention_match
from .match import Op, Var, op, through_noops


@dataclass(frozen=True)
class Pattern:
    name: str
    forms: tuple[Op, ...]  # alternatives, most complete first
    kernel: str  # what the match becomes
    doc: str  # one-line math or seed comment
    phase: str = "forward"
    fused_kind: str | None = None  # becomes an op with its own gradient rule (judge training by it)
    include_producers: tuple[str, ...] = ()  # bound tensors whose producers join the match
    require: Callable | None = None  # (roles, bound) -> bool
    side_outputs: tuple[str, ...] = ()  # bound tensors the kernel writes out as extra outputs
    anchor: Callable | None = None  # (root node) -> bool: a cheap test before any form is tried
    find: Callable | None = None  # (root node) -> (nodes, roles, bound) | None: read by form, not trees
    roots: frozenset[str] = frozenset()  # the root kinds of a ``find`` pattern

    @property
    def root(self) -> Op:
        return Op(frozenset().union(self.roots, *(f.kinds for f in self.forms)))


# -- tensor checks ----------------------------------------------------------------------------------
def is_channel_param(t: Tensor) -> bool:
    """A per-channel weight: a parameter with exactly one dim larger than 1."""
    return is_param(t) and t.shape is not None and sum(1 for d in t.shape if d != 1) == 1


def made_by(*kinds: str) -> Callable[[Tensor], bool]:
    return lambda t: t.producer is not None and t.producer.kind in kinds


_PROJECTION = made_by("matmul", "gemm", "bias_add")


def transposed_weight(t: Tensor) -> bool:
    """A weight made at run time by a Transpose of a weight that swaps its last two axes only (what a
    GEMM's transB reads in place); the Transpose is a view of the parameter, not part of the match."""
    p = t.producer
    if not is_param(t) or p is None or p.kind != "transpose" or not p.inputs or not is_param(p.inputs[0]):
        return False
    return swaps_last_two(p)


def _activation(t: Tensor) -> bool:
    return not is_param(t)


def projected(t: Tensor) -> bool:
    """A projection's output, or a part of one (Phi-3's and Mixtral's fused gate_up_proj, split in two by
    Split, Slice or chunk's Gather)."""
    p = t.producer
    return _PROJECTION(t) or (p is not None and p.kind in ("split", "slice", "gather") and bool(p.inputs)
                              and p.inputs[0] is not None and _PROJECTION(p.inputs[0]))


ACTIVATIONS = frozenset({"relu", "relu6", "clip", "leaky_relu", "elu", "sigmoid", "tanh", "gelu",
                         "hard_sigmoid"})
X, W = Var(), Var()
BIAS = Var(check=is_param)
Z = Var(check=is_activation)  # a residual side input: an activation, not a constant


def act(arg: Op) -> Op:
    return op(ACTIVATIONS, arg, role="act", more=True)  # Clip's min and max are inputs from opset 11


def acts(arg: Op) -> tuple[Op, ...]:
    """One-op activations, then the gate family (silu / swish / quick_gelu / hard_swish) over ``arg``."""
    return (act(arg), *gate_acts(arg))


def conv(*, role: str = "conv") -> Op:
    """A conv (its own bias B, if any, is its third input), seen through the layout Transpose that tf2onnx
    writes after an NHWC conv (elementwise epilogues commute with it)."""
    return optional("transpose", op("conv", X, W, role=role, more=True), role="layout")


def bias(arg: Op) -> Op:
    return op("bias_add", arg, BIAS, role="bias", commutative=True)


def bn_forms(arg: Op) -> tuple[Op, ...]:
    """BatchNorm as one op, or decomposed as Keras 3 exports it: x * (gamma rsqrt(var + eps)) + shift."""
    scale = op("mul", arg, Var(check=is_channel_param), role="bn_scale", commutative=True)
    return (op("batch_norm", arg, role="bn", more=True),
            op("bias_add", scale, BIAS, role="bn", commutative=True),
            op("sub", scale, Var(check=is_channel_param), role="bn"))


def channel_scale(arg: Op) -> Op:
    """arg * s for a per-channel constant s (BatchNorm's scale that tf2onnx leaves after a conv)."""
    return op("mul", arg, Var(check=is_channel_param), role="scale", commutative=True)


def scaled(arg: Op | Var) -> tuple[Op, Op]:
    """arg * alpha (either order) or arg / alpha, for a scalar constant alpha (alpha / arg is no scale)."""
    alpha = Var(check=scalar())
    return (op("mul", arg, alpha, role="scale", commutative=True), op("div", arg, alpha, role="scale"))


def residual_add(arg: Op) -> Op:
    return op(SUM, arg, Z, role="add", commutative=True)


GELU = gelu.ALL_ERF + gelu.ALL_ERFC + gelu.ALL_TANH  # written out (the Gelu op: bias_gelu only)
LAYER_NORM, RMS_NORM = norms.ALL_LAYER_NORM, norms.ALL_RMS_NORM
SKIP_LAYOUT = frozenset({"reshape", "flatten", "squeeze", "unsqueeze"})  # between a residual sum and its norm
RESIDUAL_X = Var("x", check=lambda t: made_by("add", "sum")(through_noops(t))
                 and all(is_activation(i) for i in through_noops(t).producer.inputs if i is not None))

# -- the catalogue ----------------------------------------------------------------------------------------
CATALOGUE: tuple[Pattern, ...] = (
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
    Pattern("matmul_bias_act", (*acts(bias(op("matmul", X, W, role="matmul"))),
                                *acts(op("gemm", X, W, role="matmul", more=True))),
            "FusedGemm / _FusedMatMul", "y = act(x @ w + b): backward reads x, w and y"),
    Pattern("matmul_bias", (bias(op("matmul", X, W, role="matmul")),), "Gemm / _FusedMatMul",
            "y = x @ w + b: the bias joins the GEMM's epilogue"),
    Pattern("matmul_scale", (*scaled(op("matmul", X, W, role="matmul")),
                             *(op("matmul", s, W, role="matmul") for s in scaled(X)),
                             *(op("matmul", X, s, role="matmul") for s in scaled(W))),
        "FusedMatMul (alpha)", "y = alpha (a @ b): attention's Q K^T / sqrt(d) [ORT MatMulScaleFusion]"),
    Pattern("matmul_transpose", (op("matmul", X, Var(check=transposed_weight), role="matmul"),
                                 op("matmul", X, op("transpose", Var(check=_activation), role="transpose",
                                                    check=swaps_last_two), role="matmul")),
            "FusedMatMul (transB)", "y = x @ w^T for w transposed at run time (a MoE expert's w[e], "
            "DeBERTa's position keys): the GEMM reads w in place [ORT MatMulTransposeFusion]"),
    Pattern("bias_gelu", select(gelu.OP) + GELU, "BiasGelu / FastGelu with bias",
            "y = gelu(x + b)", fused_kind="bias_gelu", include_producers=("x",),
            require=lambda roles, bound: made_by("bias_add")(bound["x"])),
    Pattern("gelu", GELU, "Gelu / FastGelu",
            "y = x Phi(x): erf form, or the tanh approximation", fused_kind="gelu"),
    Pattern("skip_layer_norm", (op("layer_norm", op("add", Z, Z, role="add", name="x"), role="layer_norm",
                                   more=True),
                                # OPT: Add -> Reshape (b s, h) -> LayerNorm; values kept, rows flattened
                                op("layer_norm", op(SKIP_LAYOUT, op("add", Z, Z, role="add", name="x"),
                                                    more=True, role="skip_layout", name="x_view"),
                                   role="layer_norm", more=True)) + LAYER_NORM, "SkipLayerNormalization",
            "y = layer_norm(x + skip); pre-LN blocks read the sum again: the kernel's optional 4th output",
            fused_kind="layer_norm", include_producers=("x",), side_outputs=("x", "x_view"),
            require=lambda roles, bound: "add" in roles or RESIDUAL_X.check(bound["x"])),
    Pattern("layer_norm", LAYER_NORM, "LayerNormalization",
            "y = (x - mean) / sqrt(var + eps) * gamma + beta", fused_kind="layer_norm"),
    # transformer-era patterns (fusecli/spellings holds the exporters' spellings)
    Pattern("attention", (), "Attention / MultiHeadAttention; FlashAttention in training",
            "y = softmax(q k^T s + bias) v, read by its form (fusion/attention.py): eager backward reads P "
            "(b h s^2); FlashAttention keeps the softmax row statistics (b h s) and recomputes P",
            find=attention_match, roots=frozenset({"matmul", "einsum"})),
    Pattern("rotary", ROTARY, "RotaryEmbedding", "y = x cos + rotate_half(x) sin: backward rotates dy back",
            fused_kind="rotary"),
    Pattern("skip_rms_norm", RMS_NORM, "SkipSimplifiedLayerNormalization",
            "y = rms_norm(x + skip), the sum written out as the kernel's extra output", fused_kind="rms_norm",
            include_producers=("x",), side_outputs=("x",),
            require=lambda roles, bound: RESIDUAL_X.check(bound["x"])),
    Pattern("rms_norm", RMS_NORM, "SimplifiedLayerNormalization (RMSNorm)",
            "y = x rsqrt(mean(x^2) + eps) g: backward reads x, g and the row rsqrt", fused_kind="rms_norm"),
    Pattern("swiglu", tuple(op("mul", s, Var("up", check=is_activation), commutative=True, role="swiglu")
                            for s in SILU),
            "SwiGLU (silu(a) * b in one pass, as Liger-Kernel)",
            "y = silu(x W1) * (x W3) (W1 and W3 apart, or one projection split in two): backward reads "
            "a = x W1 and b = x W3, silu(a) is recomputed",
            require=lambda roles, bound: "act_beta" not in roles
            and projected(bound["act_in"]) and projected(bound["up"])),
    Pattern("silu", SILU, "SiLU / Swish / QuickGelu (one elementwise kernel)",
            "y = x sigmoid(beta x): backward reads x and recomputes sigmoid (PyTorch's silu saves x only)"),
    Pattern("hard_swish", HARD_SWISH[1:], "HardSwish",
            "y = x relu6(x + 3) / 6: one op whose backward reads x"),
    Pattern("bias_softmax", (op("softmax", op(ADD, Var(check=is_activation), Var(),
                                              commutative=True, role="bias"), role="softmax", more=True),),
            "BiasSoftmax", "y = softmax(x + b): softmax's backward reads y, Add's nothing"),
    Pattern("bias_dropout", (op(SUM, op("dropout", bias(X), role="dropout", more=True), Z, role="add",
                                commutative=True),
                             op("dropout", bias(X), role="dropout", more=True)),
            "BiasDropout", "y = dropout(x + b) (+ residual): backward reads only the dropout mask"),
    # backward (joint graph): the second seed post's fused backward
    Pattern("relu_grad_bias_grad", (op("BiasAddGrad", op("ReluGrad", Var(), Var(), role="relu_grad"),
                                       role="bias_grad"),),
            "ReluGrad + BiasAddGrad in one pass", "db = sum(dy * (y > 0)): one read of dy",
            phase="backward"),
    Pattern("bn_grad_relu_grad", (op("BatchNormGrad", op("ReluGrad", Var(), Var(), role="relu_grad"),
                                     role="bn_grad", more=True),),
            "cudnnBatchNormalizationBackwardEx (BN_ADD_ACTIVATION)",
            "dx, dgamma, dbeta, dz from dy and y in one kernel [seed post 2]", phase="backward"),
)

BY_NAME = {p.name: p for p in CATALOGUE}
