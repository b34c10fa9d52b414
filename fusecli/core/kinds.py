"""Canonical op kinds: one vocabulary for ONNX and TensorFlow, so rules and patterns are written once.

Each format's op types map to a kind here; loaders refine a few by attributes or operands
(a per-channel constant ``Add`` is a ``bias_add``, ``Clip(0, 6)`` is ``relu6``).
An op type missing from its map gets kind ``unknown`` and is reported as unsupported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .ir import Graph, Node, T, Tensor

# Ops that compute nothing differentiable from float activations: shapes, indices, constants.
SHAPE_KINDS = frozenset({"shape", "constant", "constant_of_shape", "range", "size", "nonzero",
                         "random", "argmax", "compare", "logical", "eye", "one_hot"})

# Kinds whose output size depends on the values of their inputs, not only on their shapes: no --dim
# sizes them or what follows them (NonZero and TensorFlow's one-input Where list where a mask holds;
# Compress keeps where it holds). TopK is one too when its k is computed from values (kinds.data_dependent).
DATA_DEPENDENT_KINDS = frozenset({"nonzero", "compress"})
GRADIENT_SUM = "AddN"  # the backward's sum of a tensor's partial gradients (accumulated in place by autograd)

ONNX_KINDS: dict[str, str] = {
    # convolution, matmul, normalisation
    "Conv": "conv", "ConvTranspose": "conv_transpose", "Gemm": "gemm", "MatMul": "matmul",
    "BatchNormalization": "batch_norm", "LayerNormalization": "layer_norm",
    "InstanceNormalization": "instance_norm", "GroupNormalization": "group_norm",
    "LRN": "lrn",
    # elementwise arithmetic
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Sum": "sum", "Neg": "neg",
    "Reciprocal": "reciprocal", "Abs": "abs", "Sqrt": "sqrt", "Pow": "pow", "Exp": "exp",
    "Log": "log", "Erf": "erf", "Max": "maximum", "Min": "minimum", "Mean": "mean",
    "Where": "where", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos",
    "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh",
    "Mod": "mod", "Einsum": "einsum", "CumSum": "cumsum",
    "Sign": "step", "Ceil": "step", "Floor": "step", "Round": "step", "Hardmax": "step",
    # activations
    "Relu": "relu", "Clip": "clip", "LeakyRelu": "leaky_relu", "Elu": "elu", "Selu": "selu",
    "Sigmoid": "sigmoid", "HardSigmoid": "hard_sigmoid", "HardSwish": "hard_swish",
    "Tanh": "tanh", "Gelu": "gelu", "Softplus": "softplus", "PRelu": "prelu",
    "Softmax": "softmax", "LogSoftmax": "log_softmax", "Softsign": "softsign", "Celu": "celu",
    "Mish": "mish", "ThresholdedRelu": "thresholded_relu", "Shrink": "shrink",
    # pooling and reductions
    "MaxPool": "max_pool", "AveragePool": "avg_pool", "GlobalAveragePool": "global_avg_pool",
    "GlobalMaxPool": "global_max_pool", "ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum",
    "ReduceMax": "reduce_max", "ReduceMin": "reduce_min", "ReduceProd": "reduce_prod",
    "ReduceL2": "reduce_l2", "ReduceSumSquare": "reduce_sum_square",
    "ReduceLogSumExp": "reduce_log_sum_exp", "TopK": "top_k",
    # data movement
    "Reshape": "reshape", "Transpose": "transpose", "Squeeze": "squeeze",
    "Unsqueeze": "unsqueeze", "Flatten": "flatten", "Concat": "concat", "Split": "split",
    "Slice": "slice", "Gather": "gather", "Pad": "pad", "Expand": "expand", "Tile": "tile",
    "Identity": "identity", "Dropout": "dropout", "Cast": "cast", "Resize": "resize",
    "CastLike": "cast",  # CastLike(x, like) = Cast(x, to=like's type): like's values are never read
    "Upsample": "resize", "DepthToSpace": "depth_to_space", "SpaceToDepth": "space_to_depth",
    "GatherElements": "gather_elements", "GatherND": "gather_nd", "ScatterND": "scatter_nd",
    "ScatterElements": "scatter_elements", "Scatter": "scatter_elements", "Trilu": "trilu",
    "Compress": "compress", "GridSample": "grid_sample",
    # shapes, indices and constants
    "Shape": "shape", "Size": "size", "Constant": "constant", "ConstantOfShape": "constant_of_shape",
    "Range": "range", "NonZero": "nonzero", "ArgMax": "argmax", "ArgMin": "argmax",
    "Equal": "compare", "Less": "compare", "Greater": "compare", "LessOrEqual": "compare",
    "GreaterOrEqual": "compare", "IsNaN": "compare", "IsInf": "compare", "Not": "logical",
    "And": "logical", "Or": "logical",
    "Xor": "logical", "BitShift": "logical", "BitwiseAnd": "logical", "BitwiseOr": "logical",
    "BitwiseXor": "logical", "BitwiseNot": "logical", "RandomNormal": "random", "RandomUniform": "random",
    "RandomNormalLike": "random", "RandomUniformLike": "random", "Bernoulli": "random",
    "Multinomial": "random", "EyeLike": "eye", "OneHot": "one_hot",
}

# com.microsoft contrib ops that exported and optimised models contain.
ONNX_MS_KINDS: dict[str, str] = {
    "FusedConv": "fused_conv", "FusedGemm": "fused_gemm", "FusedMatMul": "matmul",
    "Gelu": "gelu", "FastGelu": "gelu", "BiasGelu": "bias_gelu",
    "SkipLayerNormalization": "skip_layer_norm", "LayerNormalization": "layer_norm",
}

# TensorFlow op types (SavedModel function bodies). Inputs keep TensorFlow's order, except ``Split``
# (axis, value), whose loader puts the value first as ``split`` rules expect. ``ReadVariableOp`` has no
# kind: the SavedModel loader turns a variable read into a parameter (see fusecli/load/savedmodel.py).
TF_KINDS: dict[str, str] = {
    # convolution, matmul, normalisation
    "Conv2D": "conv", "Conv3D": "conv", "DepthwiseConv2dNative": "conv",
    "Conv2DBackpropInput": "conv_backprop_input", "Conv2DBackpropInputV2": "conv_backprop_input",
    "Conv3DBackpropInputV2": "conv_backprop_input",
    "MatMul": "matmul", "BatchMatMul": "matmul", "BatchMatMulV2": "matmul", "BatchMatMulV3": "matmul",
    "Einsum": "einsum", "BiasAdd": "bias_add", "BiasAddV1": "bias_add",
    "FusedBatchNorm": "batch_norm", "FusedBatchNormV2": "batch_norm", "FusedBatchNormV3": "batch_norm",
    "LRN": "lrn",
    # elementwise arithmetic
    "AddV2": "add", "Add": "add", "AddN": "sum", "Sub": "sub", "Mul": "mul", "RealDiv": "div",
    "Div": "div", "Neg": "neg", "Reciprocal": "reciprocal", "Inv": "reciprocal", "Abs": "abs",
    "Sqrt": "sqrt", "Rsqrt": "rsqrt", "Square": "square", "SquaredDifference": "squared_difference",
    "Pow": "pow", "Exp": "exp", "Log": "log", "Erf": "erf", "Erfc": "erfc", "Sin": "sin",
    "Cos": "cos", "Maximum": "maximum", "Minimum": "minimum", "Select": "where", "SelectV2": "where",
    "Floor": "step", "Ceil": "step", "Round": "step", "Sign": "step", "FloorDiv": "step",
    "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh",
    "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh", "FloorMod": "mod", "Cumsum": "cumsum",
    "Log1p": "log1p", "Expm1": "expm1",
    # activations
    "Relu": "relu", "Relu6": "relu6", "LeakyRelu": "leaky_relu", "Elu": "elu", "Selu": "selu",
    "ClipByValue": "clip", "Sigmoid": "sigmoid", "Tanh": "tanh", "Softplus": "softplus", "Softmax": "softmax",
    "LogSoftmax": "log_softmax", "Softsign": "softsign",
    # pooling and reductions
    "MaxPool": "max_pool", "MaxPoolV2": "max_pool", "MaxPool3D": "max_pool", "AvgPool": "avg_pool",
    "AvgPool3D": "avg_pool", "Mean": "reduce_mean", "Sum": "reduce_sum", "Max": "reduce_max",
    "Min": "reduce_min", "Prod": "reduce_prod", "TopKV2": "top_k",
    # data movement
    "Reshape": "reshape", "Transpose": "transpose", "Squeeze": "squeeze", "ExpandDims": "unsqueeze",
    "ConcatV2": "concat", "Pack": "pack", "Unpack": "unpack", "Split": "split", "SplitV": "split",
    "StridedSlice": "slice", "Slice": "slice", "GatherV2": "gather", "ResourceGather": "gather",
    "Pad": "pad", "PadV2": "pad", "MirrorPad": "pad", "BroadcastTo": "expand", "Tile": "tile",
    "Identity": "identity", "IdentityN": "identity", "Snapshot": "identity", "EnsureShape": "identity",
    "CheckNumerics": "identity", "StopGradient": "stop_gradient", "PreventGradient": "stop_gradient",
    "Cast": "cast", "ResizeBilinear": "resize", "ResizeNearestNeighbor": "resize",
    "DepthToSpace": "depth_to_space", "SpaceToDepth": "space_to_depth", "GatherNd": "gather_nd",
    "TensorScatterUpdate": "scatter_nd", "TensorScatterAdd": "scatter_nd", "MatrixBandPart": "trilu",
    # shapes, indices and constants
    "Shape": "shape", "ShapeN": "shape", "Rank": "shape", "BroadcastArgs": "shape", "Size": "size",
    "Const": "constant",
    "Fill": "constant_of_shape", "ZerosLike": "constant_of_shape", "OnesLike": "constant_of_shape",
    "Range": "range", "Where": "nonzero", "ArgMax": "argmax", "ArgMin": "argmax",
    "Equal": "compare", "NotEqual": "compare", "Less": "compare", "LessEqual": "compare",
    "Greater": "compare", "GreaterEqual": "compare", "LogicalNot": "logical", "LogicalAnd": "logical",
    "LogicalOr": "logical", "IsNan": "compare", "IsInf": "compare", "IsFinite": "compare",
    "LeftShift": "logical", "RightShift": "logical", "BitwiseAnd": "logical", "BitwiseOr": "logical",
    "BitwiseXor": "logical", "Invert": "logical", "OneHot": "one_hot", "RandomUniform": "random",
    "RandomStandardNormal": "random",
    "TruncatedNormal": "random", "StatelessRandomUniformV2": "random",
    "StatelessRandomNormalV2": "random",
}


# inputs an op reads for their element type only (CastLike's target): a constant through them stays one
TYPE_ONLY_INPUTS = {"CastLike": frozenset({1})}


def value_inputs(op_type: str, inputs: Sequence[T]) -> list[T]:
    """The inputs whose values an op reads (all but TYPE_ONLY_INPUTS' positions)."""
    skip = TYPE_ONLY_INPUTS.get(op_type)
    if skip is None:
        return list(inputs)
    return [x for k, x in enumerate(inputs) if k not in skip]


def reads_type_only(node, t: Tensor) -> bool:
    """``node`` reads ``t`` for its element type only (a fused kernel need not write it out for that)."""
    positions = TYPE_ONLY_INPUTS.get(node.op_type)
    return bool(positions) and all(k in positions for k, x in enumerate(node.inputs) if x is t)


def is_channel_vector(bias: Tensor, x: Tensor, axis: int | None = None) -> bool:
    """True when ``bias`` broadcasts over ``x`` along exactly one axis (``axis`` of x, when given)."""
    if bias.shape is None or x.shape is None or not bias.is_static or len(bias.shape) > len(x.shape):
        return False
    aligned = zip(reversed(bias.shape), reversed(x.shape), strict=False)
    sized = [(len(x.shape) - 1 - k, b, d) for k, (b, d) in enumerate(aligned) if b != 1]
    if len(sized) != 1:
        return False
    x_axis, b, d = sized[0]
    return (axis is None or x_axis == axis) and (d == b or not isinstance(d, int))


def reads_values(t: Tensor | None) -> bool:
    """``t`` is computed from the values of the graph inputs (not only from their shapes, parameters and
    constants): a TopK's k so computed cannot be known before the model runs."""
    stack, seen = [t], set()
    while stack:
        u = stack.pop()
        if u is None or id(u) in seen or u.kind in ("parameter", "constant"):
            continue
        seen.add(id(u))
        node = u.producer
        if node is None:
            return True  # a graph input's values
        if node.kind in ("shape", "size"):
            continue  # reads the shape only
        if node.kind in DATA_DEPENDENT_KINDS:
            return True
        stack.extend(value_inputs(node.op_type, node.inputs))
    return False


def data_dependent(node: Node) -> bool:
    """The size of ``node``'s output depends on its inputs' values (DATA_DEPENDENT_KINDS, or a TopK
    whose k is computed from values)."""
    return node.kind in DATA_DEPENDENT_KINDS or (node.kind == "top_k" and reads_values(node.input(1)))


def data_dependent_origins(graph: Graph, unsized: Callable[[Tensor], bool]) -> dict[str, Node]:
    """Tensor name -> the data-dependent node its size (or, for integer tensors, its values) comes
    from; a tensor is reached through inputs that are ``unsized`` or integer (shapes, indices)."""
    origin: dict[str, Node] = {}
    for node in graph.nodes:  # topological order: one pass carries it downstream
        if data_dependent(node):
            source = node
        else:
            source = next((origin[t.name] for t in node.inputs if t is not None and t.name in origin
                           and (not t.is_float or unsized(t))), None)
        if source is not None:
            origin.update((t.name, source) for t in node.outputs if t is not None)
    return origin
