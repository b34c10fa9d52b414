"""ONE table of gradient rules: canonical op kind -> per-input backward op and the forward values it reads.

In the spirit of PyTorch's derivatives.yaml. A read is ``x<i>`` (forward input i), ``y<i>`` (forward
output i), ``x<i>.shape`` (only its shape: never blocks a fusion, free when static), or ``stats`` (the
normalisation statistics the node's loader names in ``node.meta["stats"]``, default ``x3 x4``, the
running mean and variance). Entries of one node that name the same backward op become one backward
node (BatchNorm's dx, dscale and dbias come from one BatchNormGrad). ``"*"`` covers every input of a
variadic op. A kind missing from the table has no rule: it is reported as unsupported and its
backward is assumed to read every input and output.

Where TensorFlow and PyTorch read different values, the table follows TensorFlow's gradient functions
(fusecli's first users), and tests/grad/test_rules_oracles.py states each difference.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Grad:
    """The backward of one differentiable input."""

    op: str | None  # backward op type; None = the gradient passes through unchanged
    reads: tuple[str, ...] = ()
    broadcast_only: bool = False  # op runs only when the input was broadcast, else pass-through


def G(op: str | None, *reads: str, broadcast_only: bool = False) -> Grad:
    return Grad(op, tuple(reads), broadcast_only)


_SHAPE0 = G("ReshapeToInput", "x0.shape")  # d/dx squeeze(x) = reshape(dy, shape(x))
_REDUCE = G("ReduceGrad", "x0.shape")  # d/dx sum(x) = broadcast(dy, shape(x))


# LayerNorm's backward reads x, gamma, and its Mean and InvStdDev (made where unnamed: grad/kept_outputs.py)
_LAYER_NORM = G("LayerNormGrad", "x0", "x1", "y1", "y2")


def _sum_to_shape(i: int) -> Grad:
    """d/da (a + b) = sum of dy over a's broadcast axes: needs a's shape only."""
    return G("SumToShape", f"x{i}.shape", broadcast_only=True)


RULES: dict[str, dict[int | str, Grad]] = {
    # conv / matmul: d/dx = dy (*) w, d/dw = x (*) dy, d/db = sum(dy)            [seed post 1]
    "conv": {0: G("ConvBackpropInput", "x1", "x0.shape"), 1: G("ConvBackpropFilter", "x0", "x1.shape"),
             2: G("BiasAddGrad")},
    "conv_transpose": {0: G("ConvTransposeBackpropInput", "x1"),
                       1: G("ConvTransposeBackpropFilter", "x0"), 2: G("BiasAddGrad")},
    "gemm": {0: G("MatMulGradA", "x1"), 1: G("MatMulGradB", "x0"), 2: _sum_to_shape(2)},
    "matmul": {0: G("MatMulGradA", "x1", "x0.shape"), 1: G("MatMulGradB", "x0", "x1.shape")},
    # bias: d/dx = dy, d/db = sum of dy over all but the channel axis: reads nothing   [seed post 1]
    "bias_add": {0: G(None), 1: G("BiasAddGrad", "x1.shape")},
    # elementwise arithmetic (broadcasting reads shapes only)
    "add": {0: _sum_to_shape(0), 1: _sum_to_shape(1)},
    "sum": {"*": G(None)},  # Sum/AddN of equal shapes: dy to every input
    "sub": {0: _sum_to_shape(0), 1: G("NegGrad", "x1.shape")},
    "mul": {0: G("MulGrad", "x1", "x0.shape"), 1: G("MulGrad", "x0", "x1.shape")},  # d(ab) = b da + a db
    "div": {0: G("DivGradA", "x1", "x0.shape"), 1: G("DivGradB", "x0", "x1", "x1.shape")},  # -a/b^2
    "neg": {0: G("Neg")},
    "reciprocal": {0: G("ReciprocalGrad", "y0")},  # d(1/x) = -y^2 dy
    "abs": {0: G("AbsGrad", "x0")},  # sign(x) dy
    "sqrt": {0: G("SqrtGrad", "y0")},  # dy / (2 y)
    "rsqrt": {0: G("RsqrtGrad", "y0")},  # -y^3 / 2 dy
    "square": {0: G("SquareGrad", "x0")},  # 2 x dy
    "pow": {0: G("PowGradBase", "x0", "x1", "x0.shape"), 1: G("PowGradExponent", "x0", "y0")},
    "exp": {0: G("ExpGrad", "y0")},  # y dy
    "log": {0: G("LogGrad", "x0")},  # dy / x
    "erf": {0: G("ErfGrad", "x0")},  # 2/sqrt(pi) exp(-x^2) dy
    "sin": {0: G("SinGrad", "x0")},  # cos(x) dy
    "cos": {0: G("CosGrad", "x0")},  # -sin(x) dy
    "tan": {0: G("TanGrad", "x0")},  # TF: dy / cos(x)^2 (PyTorch's (1 + y^2) dy reads y)
    "asin": {0: G("AsinGrad", "x0")},  # dy / sqrt(1 - x^2)
    "acos": {0: G("AcosGrad", "x0")},  # -dy / sqrt(1 - x^2)
    "atan": {0: G("AtanGrad", "x0")},  # dy / (1 + x^2)
    "sinh": {0: G("SinhGrad", "x0")},  # cosh(x) dy
    "cosh": {0: G("CoshGrad", "x0")},  # sinh(x) dy
    "asinh": {0: G("AsinhGrad", "y0")},  # TF: dy / cosh(y) (PyTorch's dy / sqrt(x^2 + 1) reads x)
    "acosh": {0: G("AcoshGrad", "y0")},  # TF: dy / sinh(y) (PyTorch's dy / sqrt(x^2 - 1) reads x)
    "atanh": {0: G("AtanhGrad", "x0")},  # dy / (1 - x^2)
    "mod": {0: _sum_to_shape(0), 1: G("ModGradB", "x0", "x1", "x1.shape")},  # da = dy, db = -floor(a/b) dy
    "cumsum": {0: G("CumSumGrad")},  # reverse cumulative sum of dy along the (constant) axis
    "maximum": {0: G("MaximumGrad", "x0", "x1"), 1: G("MaximumGrad", "x0", "x1")},
    "minimum": {0: G("MinimumGrad", "x0", "x1"), 1: G("MinimumGrad", "x0", "x1")},
    "mean": {"*": G("MeanGrad")},
    "where": {1: G("SelectGrad", "x0"), 2: G("SelectGrad", "x0")},
    # activations: ReLU reads its output y, the seed's fusion-friendly choice          [seed post 1]
    "relu": {0: G("ReluGrad", "y0")},
    "relu6": {0: G("Relu6Grad", "y0")},  # TF reads y (PyTorch's hardtanh reads x)
    "clip": {0: G("ClipGrad", "x0")},
    "leaky_relu": {0: G("LeakyReluGrad", "x0")},
    "elu": {0: G("EluGrad", "y0")},  # TF reads y (PyTorch's elu reads x)
    "selu": {0: G("SeluGrad", "y0")},
    "sigmoid": {0: G("SigmoidGrad", "y0")},  # y (1 - y) dy
    "tanh": {0: G("TanhGrad", "y0")},  # (1 - y^2) dy
    "gelu": {0: G("GeluGrad", "x0")},
    "softplus": {0: G("SoftplusGrad", "x0")},
    "hard_sigmoid": {0: G("HardSigmoidGrad", "x0")},
    "hard_swish": {0: G("HardSwishGrad", "x0")},
    "prelu": {0: G("PReluGrad", "x0", "x1"), 1: G("PReluGrad", "x0", "x1")},
    "softmax": {0: G("SoftmaxGrad", "y0")},  # y (dy - sum(dy y))
    "log_softmax": {0: G("LogSoftmaxGrad", "y0")},  # dy - exp(y) sum(dy)
    "bias_gelu": {0: G("BiasGeluGrad", "x0", "x1"), 1: G("BiasGeluGrad", "x0", "x1")},
    "softsign": {0: G("SoftsignGrad", "x0")},  # dy / (1 + |x|)^2
    "celu": {0: G("CeluGrad", "x0")},  # dy where x > 0, else exp(x / alpha) dy
    "mish": {0: G("MishGrad", "x0")},  # d(x tanh(softplus(x))) from x
    "thresholded_relu": {0: G("ThresholdedReluGrad", "x0")},  # dy where x > alpha
    "shrink": {0: G("ShrinkGrad", "x0")},  # dy where |x| > lambd
    # normalisation: BatchNorm's backward reads x, gamma and the statistics         [seed post 2]
    "batch_norm": {0: G("BatchNormGrad", "x0", "x1", "stats"), 1: G("BatchNormGrad", "x0", "x1", "stats"),
                   2: G("BatchNormGrad", "x0", "x1", "stats")},
    "layer_norm": {0: _LAYER_NORM, 1: _LAYER_NORM, 2: _LAYER_NORM},
    "instance_norm": {0: G("InstanceNormGrad", "x0", "x1"), 1: G("InstanceNormGrad", "x0", "x1"),
                      2: G("InstanceNormGrad", "x0", "x1")},
    "group_norm": {0: G("GroupNormGrad", "x0", "x1"), 1: G("GroupNormGrad", "x0", "x1"),
                   2: G("GroupNormGrad", "x0", "x1")},
    "lrn": {0: G("LRNGrad", "x0", "y0")},
    # pooling and reductions
    "max_pool": {0: G("MaxPoolGrad", "x0", "y0")},  # TF reads input and output (PyTorch: indices)
    "global_max_pool": {0: G("MaxPoolGrad", "x0", "y0")},
    "avg_pool": {0: G("AvgPoolGrad", "x0.shape")},
    "global_avg_pool": {0: G("AvgPoolGrad", "x0.shape")},
    "reduce_mean": {0: _REDUCE},
    "reduce_sum": {0: _REDUCE},
    "reduce_max": {0: G("ReduceMaxGrad", "x0", "y0")},
    "reduce_min": {0: G("ReduceMinGrad", "x0", "y0")},
    "reduce_prod": {0: G("ReduceProdGrad", "x0", "y0")},
    "reduce_l2": {0: G("ReduceL2Grad", "x0", "y0")},
    "reduce_sum_square": {0: G("ReduceSumSquareGrad", "x0")},
    "reduce_log_sum_exp": {0: G("ReduceLogSumExpGrad", "x0", "y0")},  # exp(x - y) dy
    "top_k": {0: G("TopKGrad", "y1", "x0.shape")},  # scatter dy into zeros(shape(x)) at the indices y1
    # data movement: gradients move dy back, reading shapes or indices only
    "reshape": {0: G("ReshapeGrad", "x0.shape")},  # TF: a -1 wildcard where one dim is unknown
    "flatten": {0: _SHAPE0},
    "squeeze": {0: _SHAPE0},
    "unsqueeze": {0: _SHAPE0},
    "expand": {0: _REDUCE},
    "tile": {0: _REDUCE},
    "resize": {0: G("ResizeGrad", "x0.shape")},
    "transpose": {0: G("Transpose")},
    "depth_to_space": {0: G("SpaceToDepth")},
    "space_to_depth": {0: G("DepthToSpace")},
    "concat": {"*": G("ConcatGrad", "*.shape")},
    "split": {0: G("ConcatGrad")},
    "slice": {0: G("SliceGrad", "x0.shape")},
    "gather": {0: G("GatherGrad", "x1", "x0.shape")},
    "gather_elements": {0: G("GatherElementsGrad", "x1", "x0.shape")},  # scatter-add dy into zeros(shape(x))
    "gather_nd": {0: G("GatherNDGrad", "x1", "x0.shape")},  # scatter_nd(index, dy, shape(x))
    "scatter_nd": {0: G("ScatterNDGrad", "x1"), 2: G("GatherND", "x1")},  # dx: dy, 0 at index; du: dy[index]
    "scatter_elements": {0: G("ScatterElementsGrad", "x1"), 2: G("GatherElements", "x1")},  # along an axis
    "compress": {0: G("CompressGrad", "x1", "x0.shape")},  # scatter dy back where the condition holds
    "trilu": {0: G("Trilu")},  # the same triangle of dy
    "grid_sample": {0: G("GridSampleGrad", "x0", "x1"),  # dx: dy by the grid's weights; dgrid: from x
                    1: G("GridSampleGrad", "x0", "x1")},
    "pad": {0: G("PadGrad", "x0.shape")},  # slice dy back to shape(x)
    "identity": {0: G(None)},
    "cast": {0: G("Cast")},
    "dropout": {0: G("DropoutGrad", "y1")},  # dy * mask / (1 - p)
    # TensorFlow kinds (TF_KINDS) that the ONNX vocabulary lacks, read as TensorFlow's gradient functions do
    "conv_backprop_input": {1: G("Conv2DBackpropFilter", "x2", "x1.shape"), 2: G("Conv2D", "x1")},  # TF
    # einsum: each operand's gradient is an einsum of dy with the other operands (TF's Einsum has two)
    "einsum": {0: G("EinsumGrad", "x1", "x0.shape"), 1: G("EinsumGrad", "x0", "x1.shape"),
               "*": G("EinsumGrad", "*")},
    "squared_difference": {0: G("SquaredDifferenceGrad", "x0", "x1", "x0.shape"),
                           1: G("SquaredDifferenceGrad", "x0", "x1", "x1.shape")},  # TF: 2 (x - y) dy
    "pack": {"*": G("Unpack")},  # TF Pack (tf.stack): unstack dy, reads nothing
    "unpack": {0: G("Pack")},  # TF Unpack (tf.unstack): stack the dys, reads nothing
    "erfc": {0: G("ErfcGrad", "x0")},  # TF Erfc (Keras 3's exact GELU): -2/sqrt(pi) exp(-x^2) dy
    "log1p": {0: G("Log1pGrad", "x0")},  # TF Log1p: dy / (1 + x)
    "expm1": {0: G("Expm1Grad", "x0")},  # TF Expm1: exp(x) dy, from x (PyTorch's expm1 reads y)
    "stop_gradient": {},  # TF StopGradient/PreventGradient: no gradient flows
    "step": {},  # Floor, Ceil, Round, Sign, FloorDiv, Hardmax: zero or no gradient
    # no gradient flows through shapes, indices, constants or comparisons
    **{kind: {} for kind in ("shape", "size", "constant", "constant_of_shape", "range", "nonzero",
                             "random", "argmax", "compare", "logical", "eye", "one_hot")},
}


def rule_for(kind: str) -> dict[int | str, Grad] | None:
    """The rule of a kind, or None when fusecli has none (the op is unsupported)."""
    return RULES.get(kind)


def grad_for_input(rule: dict[int | str, Grad], index: int) -> Grad | None:
    """The entry for input ``index`` (a variadic ``*`` entry covers every input)."""
    return rule.get(index, rule.get("*"))
