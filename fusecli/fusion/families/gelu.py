"""GELU written out (erf, erfc, tanh forms), with or without the bias before it."""

from __future__ import annotations

from ...rewrite import emit_gelu
from ...spellings import gelu
from ...spellings.common import select
from ..match import Match
from ..notes_kit import verdict
from ..pattern_kit import (
    GELU,
    Pattern,
    made_by,
)

PATTERNS: tuple[Pattern, ...] = (
    Pattern("bias_gelu", select(gelu.OP) + GELU, "BiasGelu / FastGelu with bias",
            "y = gelu(x + b)", fused_kind="bias_gelu", include_producers=("x",),
            require=lambda roles, bound: made_by("bias_add")(bound["x"])),
    Pattern("gelu", GELU, "Gelu / FastGelu",
            "y = x Phi(x): erf form, or the tanh approximation", fused_kind="gelu"),
)

EMITTERS = {"gelu": emit_gelu.gelu, "bias_gelu": emit_gelu.gelu}



def _ort_gelu(m: Match) -> dict:
    """GeluFusion / BiasGeluFusion; the tanh approximation becomes FastGelu."""
    op = "Gelu" if m.pattern.name == "gelu" else "BiasGelu"
    if any(n.kind == "tanh" for n in m.nodes):
        op = "FastGelu"  # the tanh approximation
    return verdict(True, True, f"{op} ({op}Fusion at ORT_ENABLE_EXTENDED)")


_ONEDNN = (None, False, "remapped only in oneDNN CPU builds")
NOTES = {"bias_gelu": {"tensorflow": _ONEDNN, "onnxruntime": _ort_gelu},
         "gelu": {"tensorflow": _ONEDNN, "onnxruntime": _ort_gelu}}
