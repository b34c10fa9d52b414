"""Attention softmax(q k^T s + bias) v, read by its form (fusion/attention.py) rather than by trees."""

from __future__ import annotations

from ...rewrite import emit_gqa
from ..attention import attention_match
from ..pattern_kit import (
    Pattern,
)

PATTERNS: tuple[Pattern, ...] = (
    Pattern("attention", (), "Attention / MultiHeadAttention; FlashAttention in training",
            "y = softmax(q k^T s + bias) v, read by its form (fusion/attention.py): eager backward reads P "
            "(b h s^2); FlashAttention keeps the softmax row statistics (b h s) and recomputes P",
            find=attention_match, roots=frozenset({"matmul", "einsum"})),
)

EMITTERS = {"attention": emit_gqa.attention}
