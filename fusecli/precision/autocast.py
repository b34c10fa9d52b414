"""PyTorch autocast's cast policies per device, in fusecli's op kinds (aten's ``autocast_mode.cpp`` and
``autocast_mode.h``, PyTorch 2.13; tests/precision/test_autocast_lists.py checks these tables against
the aten op names they stand for).

- lower_precision_fp: the op runs in the lower dtype; every float input is cast to it (a weight once
  per forward, in the autocast cache; any other tensor at each call).
- fp32: the op runs in float32; lower-precision inputs are cast up at each call.
- everything else runs in the widest dtype of its inputs (PyTorch's type promotion; the ``promote``
  list, CPU's cat and stack, asks for that explicitly).
"""

from __future__ import annotations

# aten op -> fusecli kind, for the ops of the lists that ONNX exports spell as one op
ATEN_KINDS: dict[str, str] = {
    "conv1d": "conv", "conv2d": "conv", "conv3d": "conv", "_convolution": "conv", "convolution": "conv",
    "conv_transpose1d": "conv_transpose", "conv_transpose2d": "conv_transpose",
    "conv_transpose3d": "conv_transpose", "mm": "matmul", "bmm": "matmul", "matmul": "matmul",
    "baddbmm": "matmul", "addbmm": "matmul", "addmm": "gemm", "linear": "gemm", "prelu": "prelu",
    "einsum": "einsum", "scaled_dot_product_attention": "attention",
    "acos": "acos", "asin": "asin", "cosh": "cosh", "sinh": "sinh", "tan": "tan", "exp": "exp",
    "log": "log", "reciprocal": "reciprocal", "pow": "pow", "softplus": "softplus",
    "layer_norm": "layer_norm", "native_layer_norm": "layer_norm", "group_norm": "group_norm",
    "softmax": "softmax", "log_softmax": "log_softmax", "cumsum": "cumsum", "sum": "reduce_sum",
    "prod": "reduce_prod", "logsumexp": "reduce_log_sum_exp", "linalg_vector_norm": "reduce_l2",
    "upsample_nearest2d": "resize", "upsample_bilinear2d": "resize", "grid_sampler": "grid_sample",
    "grid_sampler_2d": "grid_sample", "cat": "concat", "stack": "concat",
}

# AutocastCPU's lists (autocast_mode.cpp, TORCH_LIBRARY_IMPL(aten, AutocastCPU)): the ops exports hold
CPU_LOWER = ("conv1d", "conv2d", "conv3d", "bmm", "mm", "baddbmm", "addmm", "addbmm", "linear",
             "_convolution", "matmul", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "prelu",
             "scaled_dot_product_attention")
CPU_FP32 = ("grid_sampler", "grid_sampler_2d", "prod")
CPU_PROMOTE = ("stack", "cat")

# AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32 and AT_FORALL_FP32_SET_OPT_DTYPE (autocast_mode.h): CUDA
CUDA_LOWER = ("_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d", "convolution", "prelu", "addmm", "matmul", "einsum", "mm", "linear",
              "addbmm", "baddbmm", "bmm", "scaled_dot_product_attention")
CUDA_FP32 = ("acos", "asin", "cosh", "exp", "log", "reciprocal", "sinh", "tan", "pow", "softplus",
             "layer_norm", "native_layer_norm", "group_norm", "logsumexp", "upsample_nearest2d",
             "upsample_bilinear2d", "prod", "softmax", "log_softmax", "cumsum", "linalg_vector_norm", "sum")


def _kinds(ops: tuple[str, ...]) -> frozenset[str]:
    return frozenset(ATEN_KINDS[o] for o in ops)


LISTS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "cpu": (_kinds(CPU_LOWER), _kinds(CPU_FP32)),
    "cuda": (_kinds(CUDA_LOWER), _kinds(CUDA_FP32)),
}
