"""The contrib kernels fusecli emits that onnxruntime's CUDA provider registers (float32 and float16).

From onnxruntime's CUDA kernel registrations (contrib_ops/cuda/cuda_contrib_kernels.cc): every op below
has a float CUDA kernel; ``--target cuda`` emits nothing else from the com.microsoft domain (no
FusedGemm, FusedConv with Relu only, no HardSwish). The tests check every rewrite against this table.
"""

CUDA_KERNELS = frozenset({
    "com.microsoft.FusedConv", "com.microsoft.FusedMatMul", "com.microsoft.Gelu", "com.microsoft.BiasGelu",
    "com.microsoft.FastGelu", "com.microsoft.QuickGelu", "com.microsoft.SkipLayerNormalization",
    "com.microsoft.SkipSimplifiedLayerNormalization", "com.microsoft.MultiHeadAttention",
    "com.microsoft.RotaryEmbedding", "com.microsoft.EmbedLayerNormalization",
    "LayerNormalization", "SimplifiedLayerNormalization",
})
