"""The fusion families, one module each: its catalogue entries (PATTERNS) and its kernel emitters (EMITTERS,
pattern name -> emitter). The catalogue and the emitter registry are their unions, in this order (the
catalogue's order: the most complete conv and matmul forms first)."""

from __future__ import annotations

from . import attention, backward, conv, epilogues, gate_acts, gelu, layer_norm, matmul, rms_norm, rotary

FAMILIES = (conv, matmul, gelu, layer_norm, attention, rotary, rms_norm, gate_acts, epilogues, backward)
CATALOGUE = tuple(p for family in FAMILIES for p in family.PATTERNS)
EMITTERS = {name: fn for family in FAMILIES for name, fn in family.EMITTERS.items()}
