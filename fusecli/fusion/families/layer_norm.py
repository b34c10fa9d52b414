"""LayerNorm written out, the residual Add before a LayerNorm (SkipLayerNormalization), and BERT's embedding
sum before one (EmbedLayerNormalization)."""

from __future__ import annotations

from ...core.trees import Var, op
from ...spellings.common import ADD
from ...spellings.norms import embedding_sum
from ..match import Match
from ..notes_kit import verdict
from ..pattern_kit import (
    LAYER_NORM,
    RESIDUAL_X,
    SKIP_LAYOUT,
    Pattern,
    Z,
)

EMBED_PARTS = ("embed_0", "embed_1", "embed_2", "embed_sum")  # bound by _embedding_sum: the match holds them


def _embedding_sum(roles, bound) -> bool:
    """The norm reads BERT's embedding sum (spellings.norms.embedding_sum); its Gathers and inner Add are
    bound so that the match holds them."""
    parts = embedding_sum(bound["x"])
    if parts is None:
        return False
    gathers, adds = parts
    bound.update({f"embed_{i}": g.outputs[0] for i, g in enumerate(gathers)})
    if len(adds) > 1:  # three tables: the inner sum
        bound["embed_sum"] = adds[1].outputs[0]
    return True


PATTERNS: tuple[Pattern, ...] = (
    Pattern("embed_layer_norm", (op("layer_norm", op(ADD, Var(), Var(), role="add", name="x"),
                                    role="layer_norm", more=True),) + LAYER_NORM,
            "EmbedLayerNormalization", "y = layer_norm(word[ids] + position[pos] (+ segment[seg])): BERT's "
            "embeddings, the table rows gathered inside the kernel", fused_kind="layer_norm",
            include_producers=("x", *EMBED_PARTS), require=_embedding_sum),
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
)

KERNELS = {"layer_norm": "layer_norm", "skip_layer_norm": "skip_layer_norm",
           "embed_layer_norm": "embed_layer_norm"}



def _sum_read_again(m: Match) -> bool:
    """The residual sum of a skip norm is read outside the match (pre-LN blocks)."""
    t = m.bound.get("x")
    inside = {id(n) for n in m.nodes}
    return t is not None and any(id(c) not in inside for c in t.consumers)


def _ort_skip_layer_norm(m: Match) -> dict:
    """SkipLayerNormFusion, unless the residual sum is read again."""
    if _sum_read_again(m):
        return verdict(False, False, "SkipLayerNormFusion leaves a residual sum that is read again (pre-LN "
                       "blocks); SkipLayerNormalization's 4th output can write it (fusecli rewrite does)")
    return verdict(True, True, "SkipLayerNormalization (SkipLayerNormalizationFusion at ORT_ENABLE_EXTENDED)")


NOTES = {
    "embed_layer_norm": {"onnxruntime": (True, True, "EmbedLayerNormalization (EmbedLayerNormFusion in "
                                         "onnxruntime.transformers.optimizer, BERT-style models)")},
    "skip_layer_norm": {"onnxruntime": _ort_skip_layer_norm},
    "layer_norm": {"tensorflow": (None, False, "remapped only in oneDNN CPU builds"),
                   "onnxruntime": (True, True, "LayerNormalization (LayerNormalizationFusion at "
                                   "ORT_ENABLE_EXTENDED)")},
}
