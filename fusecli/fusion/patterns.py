"""The fusion catalogue: one short declarative entry per pattern (forms are alternative op trees).

Adding a pattern is one ``Pattern(...)`` entry here plus its tests in tests/fusion/.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..ir import Node, Tensor
from .attention import attention_match
from .forms import (
    HARD_SWISH,
    RMS_NORM,
    ROTARY,
    SILU,
    gate_acts,
    is_activation,
    is_param,
    optional,
    scalar,
)
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


def swaps_last_two(n: Node) -> bool:
    """A Transpose that swaps its last two axes only (what a GEMM's transB reads in place)."""
    perm = n.attrs.get("perm")
    return perm is not None and len(perm) >= 2 and list(perm) == [*range(len(perm) - 2), len(perm) - 1,
                                                                  len(perm) - 2]


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
ADD = frozenset({"add", "sum"})
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
    return op(ADD, arg, Z, role="add", commutative=True)


# -- GELU forms: 0.5 x (1 + erf(x / sqrt 2)) and 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ---------
def _gelu_trees(one_plus: Op) -> tuple[Op, ...]:
    xv, half = Var("x"), Var(check=scalar(0.5))
    return (op("mul", op("mul", xv, half, commutative=True), one_plus, commutative=True, role="gelu"),
            op("mul", op("mul", xv, one_plus, commutative=True), half, commutative=True, role="gelu"),
            op("mul", xv, op("mul", one_plus, half, commutative=True), commutative=True, role="gelu"))


_ERF_ARG = (op("div", Var("x"), Var(check=scalar(math.sqrt(2)))),
            op("mul", Var("x"), Var(check=scalar(1 / math.sqrt(2))), commutative=True))
_ONE = Var(check=scalar(1.0))
GELU_ERF = tuple(t for a in _ERF_ARG
                 for t in _gelu_trees(op(ADD | {"bias_add"}, op("erf", a), _ONE, commutative=True)))
# TensorFlow writes the erf form as 0.5 x erfc(-x / sqrt 2)
_ERFC_ARG = (op("mul", op("neg", Var("x")), Var(check=scalar(1 / math.sqrt(2))), commutative=True),
             op("mul", Var("x"), Var(check=scalar(-1 / math.sqrt(2))), commutative=True))
GELU_ERFC = tuple(op("mul", op("mul", Var("x"), Var(check=scalar(0.5)), commutative=True), op("erfc", a),
                     commutative=True, role="gelu") for a in _ERFC_ARG)
# x^3 as the exporters write it: Pow(x, 3) (dynamo), x * (x * x) (TorchScript's F.gelu), (x * x) * x
CUBES = (op("pow", Var("x"), Var(check=scalar(3.0))),
         op("mul", Var("x"), op("mul", Var("x"), Var("x")), commutative=True),
         op("mul", op("mul", Var("x"), Var("x")), Var("x"), commutative=True))


def tanh_gelu_arg(cube: Op) -> Op:
    """sqrt(2/pi) (x + 0.044715 x^3): the tanh approximation's argument."""
    return op("mul", op(ADD | {"bias_add"}, Var("x"), op("mul", cube, Var(check=scalar(0.044715)),
                                                        commutative=True), commutative=True),
              Var(check=scalar(math.sqrt(2 / math.pi))), commutative=True)


_TANH_ARGS = tuple(tanh_gelu_arg(c) for c in CUBES)
# BLOOM (transformers' bloom_gelu_forward): tanh(0.79788456 x (1 + 0.044715 x x)), both torch exporters
TANH_ARG_BLOOM = op("mul", op("mul", Var("x"), Var(check=scalar(math.sqrt(2 / math.pi))), commutative=True),
                    op(ADD | {"bias_add"}, op("mul", op("mul", Var("x"), Var(check=scalar(0.044715)),
                                                        commutative=True), Var("x"), commutative=True),
                       _ONE, commutative=True), commutative=True)
GELU_OP = (op("gelu", Var("x"), role="gelu", more=True),)  # the Gelu op itself (opset 20, contrib)
GELU_TANH = tuple(t for a in (*_TANH_ARGS, TANH_ARG_BLOOM)
                  for t in _gelu_trees(op(ADD | {"bias_add"}, op("tanh", a), _ONE, commutative=True)))


# -- LayerNorm decomposed: (x - mean(x)) / sqrt(mean((x - mean)^2) + eps) * gamma + beta --------------------
def _layer_norm_trees() -> tuple[Op, ...]:
    d = op("sub", Var("x"), op("reduce_mean", Var("x"), more=True), name="d")
    sq = (op("pow", Var("d"), Var(check=scalar(2.0))), op("mul", Var("d"), Var("d")))
    trees = []
    for s in sq:
        var = op("reduce_mean", s, more=True)
        std = op("sqrt", op(ADD | {"bias_add"}, var, Var(check=scalar()), commutative=True))
        normed = op("div", d, std, role="normalize")
        affine = op(ADD | {"bias_add"}, op("mul", normed, Var(check=is_param), commutative=True),
                    Var(check=is_param), commutative=True, role="layer_norm")
        trees += [affine, normed]
    return tuple(trees)


def _moments_layer_norm_trees() -> tuple[Op, ...]:
    """Keras 3 / TensorFlow: x * inv + (beta - mean * inv), inv = rsqrt(var(x) + eps) * gamma."""
    mean = op("reduce_mean", Var("x"), more=True, name="mean")
    var = op("reduce_mean", op("squared_difference", Var("x"), op("stop_gradient", mean)), more=True)
    rsqrt = op("rsqrt", op(ADD | {"bias_add"}, var, Var(check=scalar()), commutative=True))
    trees = []
    for inv in (op("mul", rsqrt, Var(check=is_param), commutative=True, name="inv"),
                op("rsqrt", rsqrt.args[0], name="inv")):
        neg_mean_inv = op("mul", op("neg", Var("mean")), Var("inv"), commutative=True)
        for shift in (op(ADD | {"bias_add"}, neg_mean_inv, Var(check=is_param), commutative=True),
                      neg_mean_inv):
            trees.append(op(ADD, op("mul", Var("x"), inv, commutative=True), shift, commutative=True,
                            role="layer_norm"))
    return tuple(trees)


def _tf2onnx_moments_trees() -> tuple[Op, ...]:
    """The moments form as tf2onnx writes it: (x - mean)^2 as d * d, rsqrt as Reciprocal(Sqrt)."""
    mean = op("reduce_mean", Var("x"), more=True, name="mean")
    var = op("reduce_mean", op("mul", op("sub", Var("x"), mean, name="d"), Var("d")), more=True)
    rs = op("reciprocal", op("sqrt", op(ADD | {"bias_add"}, var, Var(check=scalar()), commutative=True,
                                        role="ln_eps")))
    trees = []
    for inv in (op("mul", rs, Var(check=is_param), commutative=True, name="inv", role="ln_inv"),
                replace(rs, name="inv", role="ln_inv")):
        neg_mean_inv = op("mul", op("neg", Var("mean")), Var("inv"), commutative=True)
        for shift in (op(ADD | {"bias_add"}, neg_mean_inv, Var(check=is_param), commutative=True,
                         role="ln_shift"), neg_mean_inv):
            trees.append(op(ADD, op("mul", Var("x"), inv, commutative=True), shift, commutative=True,
                            role="layer_norm"))
    return tuple(trees)


LAYER_NORM = _layer_norm_trees() + _moments_layer_norm_trees() + _tf2onnx_moments_trees()
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
    Pattern("bias_gelu", GELU_OP + GELU_ERF + GELU_ERFC + GELU_TANH, "BiasGelu / FastGelu with bias",
            "y = gelu(x + b)", fused_kind="bias_gelu", include_producers=("x",),
            require=lambda roles, bound: made_by("bias_add")(bound["x"])),
    Pattern("gelu", GELU_ERF + GELU_ERFC + GELU_TANH, "Gelu / FastGelu",
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
    # transformer-era patterns (fusion/forms.py holds the exporters' spellings)
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
    Pattern("bias_softmax", (op("softmax", op(ADD | {"bias_add"}, Var(check=is_activation), Var(),
                                              commutative=True, role="bias"), role="softmax", more=True),),
            "BiasSoftmax", "y = softmax(x + b): softmax's backward reads y, Add's nothing"),
    Pattern("bias_dropout", (op(ADD, op("dropout", bias(X), role="dropout", more=True), Z, role="add",
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
