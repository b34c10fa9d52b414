"""MatMul / Gemm epilogues: bias (+ activation), a layer scale per column, a scalar scale, a weight
transposed at run time."""

from __future__ import annotations

from ...core.trees import Var, op
from ..match import Match
from ..notes_kit import TF_CPU_ACTS, act, float32_out, verdict
from ..pattern_kit import (
    Pattern,
    W,
    X,
    acts,
    bias,
    channel_scale,
    not_param,
    scaled,
    swaps_last_two,
    transposed_weight,
)


def _per_column(roles, bound) -> bool:
    """The layer scale's one sized dim is the last (a column of w), not a row of x."""
    sc, y = roles["scale"], roles["bias"].outputs[0]
    g = sc.inputs[1] if sc.inputs[0] is y else sc.inputs[0]
    return bool(g.shape) and g.shape[-1] != 1 and y.shape is not None and len(g.shape) <= len(y.shape)


PATTERNS: tuple[Pattern, ...] = (
    Pattern("matmul_bias_scale", (channel_scale(bias(op("matmul", X, W, role="matmul"))),),
            "MatMul + bias with the layer scale folded into W and b",
            "y = (x @ w + b) * g, g per output column (layer scale: ConvNeXt, BEiT, DINOv2) = "
            "x @ (w g) + b g in inference; Mul's backward reads x @ w + b for dg", require=_per_column),
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
                                 op("matmul", X, op("transpose", Var(check=not_param), role="transpose",
                                                    check=swaps_last_two), role="matmul")),
            "FusedMatMul (transB)", "y = x @ w^T for w transposed at run time (a MoE expert's w[e], "
            "DeBERTa's position keys): the GEMM reads w in place [ORT MatMulTransposeFusion]"),
)



KERNELS = {"matmul_bias_scale": "matmul_bias_scale", "matmul_bias_act": "matmul_family",
           "matmul_bias": "matmul_family", "matmul_scale": "matmul_scale",
           "matmul_transpose": "matmul_transpose"}

# FusedGemm's activations (CPU; rewrite/kernels/matmul.py's gemm_activation)
FUSED_GEMM_ACTS = frozenset({"relu", "sigmoid", "tanh", "leaky_relu", "elu", "hard_sigmoid"})


def _rank(t) -> int | None:
    return None if t is None or t.shape is None else len(t.shape)


def matmul_label(m: Match, mode: str) -> str | None:
    """The after view's kernel: FusedGemm / Gemm for 2-D operands, BiasGelu after a 3-D MatMul."""
    if "act_gate" in m.roles:
        return None
    mm, a = m.roles["matmul"], act(m)
    spec = a in FUSED_GEMM_ACTS and float32_out(m)
    if mm.kind == "gemm":
        return "FusedGemm" if spec else None
    if _rank(mm.input(0)) == 2 and _rank(mm.input(1)) == 2:
        return "FusedGemm" if spec else ("Gemm" if a is None else None)
    if m.roles.get("act") is not None and m.roles["act"].op_type == "Gelu" and float32_out(m):
        return "BiasGelu"  # the MatMul stays; bias + Gelu become one kernel
    return None


LABELS = {"matmul_bias_act": matmul_label, "matmul_bias": matmul_label}



def _tf_fused_matmul(m: Match) -> dict:
    """_FusedMatMul: the CPU remap takes these activations; GPU depends on cuBLASLt's epilogues."""
    a = act(m)
    return verdict(a is None or a in TF_CPU_ACTS | {"tanh", "sigmoid", "gelu"}, None,
                   "_FusedMatMul on CPU; on GPU it depends on the TensorFlow build's cuBLASLt epilogues")


NOTES = {
    "matmul_bias_scale": {"onnxruntime": (False, False, "no ONNX Runtime fusion folds a per-column Mul into "
                                          "MatMul's weights (MatMulScaleFusion takes a scalar only)")},
    "matmul_bias_act": {"tensorflow": _tf_fused_matmul,
                        "onnxruntime": (True, False, "FusedGemm exists on CPU only")},
    "matmul_bias": {"tensorflow": _tf_fused_matmul,
                    "onnxruntime": (True, True, "MatMulAddFusion makes a Gemm (2-D inputs)")},
    "matmul_scale": {"onnxruntime": (True, True, "com.microsoft FusedMatMul with alpha (MatMulScaleFusion)")},
    "matmul_transpose": {
        "tensorflow": (True, True, "the arithmetic optimizer folds the Transpose into MatMul's transpose_b"),
        "onnxruntime": (True, True, "com.microsoft FusedMatMul with transB (MatMulTransposeFusion)"),
        "pytorch": (True, True, "F.linear's GEMM reads w^T in place (a strided view, no copy)")},
}
