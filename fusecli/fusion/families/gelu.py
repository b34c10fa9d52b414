"""GELU written out (erf, erfc, tanh forms), with or without the bias before it, and the tanh form after a
MatMul and its bias (GemmFastGelu)."""

from __future__ import annotations

from ...spellings import gelu
from ...spellings.common import is_param, select
from ..match import Match
from ..notes_kit import verdict
from ..pattern_kit import (
    GELU,
    Pattern,
    made_by,
)


def _after_matmul_bias(roles, bound) -> bool:
    """The tanh GELU (written out, or the Gelu op with approximate='tanh') of x = x' @ W + b, W a 2-D
    weight, the product read by the bias Add alone; the product is bound ('product') so that the match
    holds the MatMul."""
    g = roles.get("gelu")
    if g is not None and g.op_type == "Gelu" and g.attrs.get("approximate", "none") != "tanh":
        return False
    b = bound["x"].producer
    if b is None or b.kind != "bias_add":
        return False
    y = next((t for t in b.inputs if t is not None and not is_param(t)), None)
    mm = y.producer if y is not None else None
    if mm is None or mm.kind != "matmul" or len(y.consumers) != 1 or not is_param(mm.inputs[1]) \
            or mm.inputs[1].shape is None or len(mm.inputs[1].shape) != 2:
        return False
    bound["product"] = y
    return True


PATTERNS: tuple[Pattern, ...] = (
    Pattern("matmul_fast_gelu", select(gelu.OP) + gelu.ALL_TANH, "GemmFastGelu (CUDA)",
            "y = fast_gelu(x @ W + b): the tanh GELU in the GEMM's epilogue; onnxruntime has the kernel on "
            "CUDA and ROCm only (on CPU: the MatMul, then FastGelu with the bias)", fused_kind="bias_gelu",
            include_producers=("x", "product"), require=_after_matmul_bias),
    Pattern("bias_gelu", select(gelu.OP) + GELU, "BiasGelu / FastGelu with bias",
            "y = gelu(x + b)", fused_kind="bias_gelu", include_producers=("x",),
            require=lambda roles, bound: made_by("bias_add")(bound["x"])),
    Pattern("gelu", GELU, "Gelu / FastGelu",
            "y = x Phi(x): erf form, or the tanh approximation", fused_kind="gelu"),
)

# pattern -> the key of its kernel emitter (rewrite/kernels/registry.py maps keys to emitters)
KERNELS = {"gelu": "gelu", "bias_gelu": "gelu", "matmul_fast_gelu": "gemm_fast_gelu"}



def _ort_gelu(m: Match) -> dict:
    """GeluFusion / BiasGeluFusion; the tanh approximation becomes FastGelu."""
    op = "Gelu" if m.pattern.name == "gelu" else "BiasGelu"
    if any(n.kind == "tanh" for n in m.nodes):
        op = "FastGelu"  # the tanh approximation
    return verdict(True, True, f"{op} ({op}Fusion at ORT_ENABLE_EXTENDED)")


_ONEDNN = (None, False, "remapped only in oneDNN CPU builds")
_GEMM_FAST_GELU = (False, True, "GemmFastGelu: CUDA and ROCm kernels only, the CPU provider has none "
                   "(fusecli rewrite writes it for --target cuda; on CPU, FastGelu with the bias)")
NOTES = {"matmul_fast_gelu": {"onnxruntime": _GEMM_FAST_GELU},
         "bias_gelu": {"tensorflow": _ONEDNN, "onnxruntime": _ort_gelu},
         "gelu": {"tensorflow": _ONEDNN, "onnxruntime": _ort_gelu}}
