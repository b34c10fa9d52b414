"""Attention softmax(q k^T s + bias) v, read by its form (spellings/attention.py) rather than by trees."""

from __future__ import annotations

from ...spellings.attention import AttentionForm, attention_match, read_attention, terms_refusal
from ..match import Match
from ..notes_kit import float32_out, verdict
from ..pattern_kit import (
    Pattern,
)

PATTERNS: tuple[Pattern, ...] = (
    Pattern("attention", (), "Attention / MultiHeadAttention; FlashAttention in training",
            "y = softmax(q k^T s + bias) v, read by its form (spellings/attention.py): eager backward "
            "reads P (b h s^2); FlashAttention keeps the softmax row statistics (b h s) and recomputes P",
            find=attention_match, roots=frozenset({"matmul", "einsum"}), recompute="flash"),
)

KERNELS = {"attention": "attention"}


def attention_kernel(m: Match, mode: str = "inference") -> str | None:
    """MultiHeadAttention (GroupQueryAttention for repeated K/V) where the form is one the emitter takes:
    float32, MatMul or Einsum scores and output, no soft-cap, the score terms its bias takes
    (spellings.attention.terms_refusal)."""
    if not float32_out(m) or m.roles["qk"].kind not in ("matmul", "einsum") \
            or m.roles["pv"].kind not in ("matmul", "einsum"):
        return None
    form = read_attention(m.roles["pv"])
    if not isinstance(form, AttentionForm) or form.softcap is not None:
        return None
    if terms_refusal(form, merged=False) is not None:
        return None
    return "GroupQueryAttention" if "repeat_k" in m.roles else "MultiHeadAttention"


LABELS = {"attention": attention_kernel}


def _ort_attention(m: Match) -> dict:
    """What fusecli rewrite emits, else ONNX Runtime's optimizers by model type."""
    kernel = attention_kernel(m)
    if kernel is not None:
        return verdict(True, True, f"com.microsoft {kernel} (CPU float32, CUDA), as fusecli rewrite emits "
                       "it; ORT's own AttentionFusion fuses BERT-style graphs only, and "
                       "onnxruntime.transformers.optimizer others by model type; inference kernels, no "
                       "backward")
    note = ("Attention / MultiHeadAttention: AttentionFusion (BERT-style graphs) or "
            "onnxruntime.transformers.optimizer for the model type; inference kernels, no backward")
    if "repeat_k" in m.roles:
        note = ("grouped-query (K/V repeated): GroupQueryAttention from onnxruntime.transformers.optimizer; "
                + note)
    return verdict(None, None, note)


NOTES = {"attention": {
    "tensorflow": (False, None, "not a Grappler remapper pattern; on GPU the model must call a fused "
                   "kernel itself (Keras 3 dot_product_attention(flash_attention=True): cuDNN fused "
                   "attention, which keeps the row statistics and recomputes P in backward)"),
    "onnxruntime": _ort_attention,
    "pytorch": (True, True, "F.scaled_dot_product_attention: the flash and memory-efficient backends (and "
                "cuDNN fused attention on Hopper) keep the logsumexp per row and recompute P in backward; an "
                "eager softmax(q k^T) v model must call it (or torch.compile rewrites it)"),
}}
