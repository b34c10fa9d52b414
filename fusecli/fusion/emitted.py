"""What `fusecli rewrite` emits for a match, read from the match's structure alone (no weights).

The after view labels each fused box with a kernel; a label the rewrite never writes misleads (a 3-D
``matmul_bias`` is no Gemm, a conv + bias + swish is no FusedConv). These rules mirror the emitters'
structural checks (``rewrite/emit.py``, ``rewrite/emit_attention.py``); a match they cannot vouch for gets
no kernel (None), and the label falls back to the pattern's name. Weights or attributes the emitter reads
may still make it pass a match over, so this is what the rewrite would write when its values allow.
"""

from __future__ import annotations

from ..spellings.acts import gate_act_kind
from .attention import AttentionForm, read_attention
from .match import Match

# FusedConv activations (CPU; rewrite/emit.conv_activation) and FusedGemm's (CPU; emit.gemm_activation)
FUSED_CONV_ACTS = frozenset({"relu", "relu6", "clip", "leaky_relu", "sigmoid", "tanh", "hard_sigmoid"})
FUSED_GEMM_ACTS = frozenset({"relu", "sigmoid", "tanh", "leaky_relu", "elu", "hard_sigmoid"})
CONV = ("conv_bias_add_act", "conv_bias_act", "conv_bias", "conv_bn_act", "conv_bn", "conv_squeeze_bias")
MATMUL = ("matmul_bias_act", "matmul_bias")


def _float32(m: Match) -> bool:
    out = m.root.outputs[0] if m.root.outputs else None
    return out is not None and out.dtype == "float32"


def _rank(t) -> int | None:
    return None if t is None or t.shape is None else len(t.shape)


def _conv(m: Match, mode: str) -> str | None:
    if "layout" in m.roles or "act_gate" in m.roles:
        return None  # through tf2onnx's layout Transpose, or a silu-family act: no FusedConv form
    act = gate_act_kind(m.roles)
    if act in FUSED_CONV_ACTS and _float32(m):
        return "FusedConv"
    folded = [name for role, name in (("bn", "BatchNorm"), ("bias", "bias")) if role in m.roles]
    if "bn" in m.roles and mode != "inference":
        return None  # BatchNorm is never folded for training
    return f"Conv ({' + '.join(folded)} folded)" if folded else None


def _matmul(m: Match) -> str | None:
    if "act_gate" in m.roles:
        return None
    mm, act = m.roles["matmul"], gate_act_kind(m.roles)
    spec = act in FUSED_GEMM_ACTS and _float32(m)
    if mm.kind == "gemm":
        return "FusedGemm" if spec else None
    two_d = _rank(mm.input(0)) == 2 and _rank(mm.input(1)) == 2
    if two_d:
        return "FusedGemm" if spec else ("Gemm" if act is None else None)
    if m.roles.get("act") is not None and m.roles["act"].op_type == "Gelu" and _float32(m):
        return "BiasGelu"  # the MatMul stays; bias + Gelu become one kernel
    return None


def attention_kernel(m: Match) -> str | None:
    """MultiHeadAttention (GroupQueryAttention for repeated K/V) where the form is one the emitter takes:
    float32, MatMul or Einsum scores and output, no soft-cap, a mask and a position bias at most."""
    if not _float32(m) or m.roles["qk"].kind not in ("matmul", "einsum") \
            or m.roles["pv"].kind not in ("matmul", "einsum"):
        return None
    form = read_attention(m.roles["pv"])
    if not isinstance(form, AttentionForm) or form.softcap is not None:
        return None
    terms, wheres = len(form.terms), len(form.bool_masks)
    if not ((wheres == 0 and terms <= 2) or (wheres == 1 and terms == 0)):
        return None
    return "GroupQueryAttention" if "repeat_k" in m.roles else "MultiHeadAttention"


def emitted_kernel(m: Match, mode: str = "inference") -> str | None:
    """The op `fusecli rewrite` writes for ``m`` (CPU), or None when it writes none or this cannot say."""
    name = m.pattern.name
    if name in CONV:
        return _conv(m, mode)
    if name in MATMUL:
        return _matmul(m)
    if name == "attention":
        return attention_kernel(m)
    return m.pattern.kernel.split(" / ")[0]
