"""Canonical op kinds: one vocabulary for ONNX and TensorFlow, so rules and patterns are written once.

Each format's op types map to a kind here; loaders refine a few by attributes or operands
(a per-channel constant ``Add`` is a ``bias_add``, ``Clip(0, 6)`` is ``relu6``).
An op type missing from its map gets kind ``unknown`` and is reported as unsupported.
"""

# Ops that compute nothing differentiable from float activations: shapes, indices, constants.
SHAPE_KINDS = frozenset({"shape", "constant", "constant_of_shape", "range", "size", "nonzero",
                         "random", "argmax", "compare", "logical", "eye"})

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
    "Where": "where", "Sin": "sin", "Cos": "cos",
    # activations
    "Relu": "relu", "Clip": "clip", "LeakyRelu": "leaky_relu", "Elu": "elu", "Selu": "selu",
    "Sigmoid": "sigmoid", "HardSigmoid": "hard_sigmoid", "HardSwish": "hard_swish",
    "Tanh": "tanh", "Gelu": "gelu", "Softplus": "softplus", "PRelu": "prelu",
    "Softmax": "softmax", "LogSoftmax": "log_softmax",
    # pooling and reductions
    "MaxPool": "max_pool", "AveragePool": "avg_pool", "GlobalAveragePool": "global_avg_pool",
    "GlobalMaxPool": "global_max_pool", "ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum",
    "ReduceMax": "reduce_max", "ReduceMin": "reduce_min", "ReduceProd": "reduce_prod",
    "ReduceL2": "reduce_l2", "ReduceSumSquare": "reduce_sum_square",
    # data movement
    "Reshape": "reshape", "Transpose": "transpose", "Squeeze": "squeeze",
    "Unsqueeze": "unsqueeze", "Flatten": "flatten", "Concat": "concat", "Split": "split",
    "Slice": "slice", "Gather": "gather", "Pad": "pad", "Expand": "expand", "Tile": "tile",
    "Identity": "identity", "Dropout": "dropout", "Cast": "cast", "Resize": "resize",
    "Upsample": "resize", "DepthToSpace": "depth_to_space", "SpaceToDepth": "space_to_depth",
    # shapes, indices and constants
    "Shape": "shape", "Size": "size", "Constant": "constant", "ConstantOfShape": "constant_of_shape",
    "Range": "range", "NonZero": "nonzero", "ArgMax": "argmax", "ArgMin": "argmax",
    "Equal": "compare", "Less": "compare", "Greater": "compare", "LessOrEqual": "compare",
    "GreaterOrEqual": "compare", "Not": "logical", "And": "logical", "Or": "logical",
    "Xor": "logical", "RandomNormal": "random", "RandomUniform": "random",
    "RandomNormalLike": "random", "RandomUniformLike": "random", "EyeLike": "eye",
}

# com.microsoft contrib ops that exported and optimised models contain.
ONNX_MS_KINDS: dict[str, str] = {
    "FusedConv": "fused_conv", "FusedGemm": "fused_gemm", "FusedMatMul": "matmul",
    "Gelu": "gelu", "FastGelu": "gelu", "BiasGelu": "bias_gelu",
    "SkipLayerNormalization": "skip_layer_norm", "LayerNormalization": "layer_norm",
}
