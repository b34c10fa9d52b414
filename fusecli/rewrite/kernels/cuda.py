"""The contrib kernels fusecli emits that onnxruntime's CUDA provider registers (float32 and float16), and
the CPU stand-ins verification runs for those the CPU provider lacks.

From onnxruntime's CUDA kernel registrations (contrib_ops/cuda/cuda_contrib_kernels.cc): every op below
has a float CUDA kernel; ``--target cuda`` emits nothing else from the com.microsoft domain (no
FusedGemm, FusedConv with Relu only, no HardSwish). The tests check every rewrite against this table.
"""

CUDA_KERNELS = frozenset({
    "com.microsoft.FusedConv", "com.microsoft.FusedMatMul", "com.microsoft.Gelu", "com.microsoft.BiasGelu",
    "com.microsoft.FastGelu", "com.microsoft.QuickGelu", "com.microsoft.SkipLayerNormalization",
    "com.microsoft.SkipSimplifiedLayerNormalization", "com.microsoft.MultiHeadAttention",
    "com.microsoft.RotaryEmbedding", "com.microsoft.EmbedLayerNormalization", "com.microsoft.GemmFastGelu",
    "LayerNormalization", "SimplifiedLayerNormalization",
})


# kernels fusecli writes for --target cuda that the CPU provider lacks: what runs in their place here
CPU_STAND_INS = {"GemmFastGelu": "MatMul, then FastGelu with the bias"}


def cpu_stand_ins(model):
    """``model``, or a copy with each CUDA-only kernel as the CPU ops computing the same function
    (GemmFastGelu(x, W, b) = FastGelu(MatMul(x, W), b)), for the CPU provider's sessions."""
    if not any(n.op_type in CPU_STAND_INS and n.domain == "com.microsoft" for n in model.graph.node):
        return model
    import onnx
    from onnx import helper

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    nodes = []
    for n in copy.graph.node:
        if n.op_type == "GemmFastGelu" and n.domain == "com.microsoft":
            product = f"{n.output[0]}__stand_in_product"
            nodes.append(helper.make_node("MatMul", list(n.input[:2]), [product], f"{n.name}__matmul"))
            nodes.append(helper.make_node("FastGelu", [product, *n.input[2:3]], list(n.output),
                                          f"{n.name}__fast_gelu", domain="com.microsoft"))
        else:
            nodes.append(n)
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    return copy
