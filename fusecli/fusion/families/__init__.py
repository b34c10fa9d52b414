"""The fusion families, one module each: its catalogue entries (PATTERNS), its kernels (KERNELS, pattern
name -> the key rewrite/kernels/registry.py registers the kernel's emitter under: nothing here imports
rewrite), the after view's label of each kernel (LABELS, pattern name -> (match, mode) -> kernel or None),
and its framework notes (NOTES, pattern name -> {framework: entry}, notes_kit). The catalogue and the
registries are their unions, in this order (the catalogue's order: the most complete conv and matmul forms
first)."""

from __future__ import annotations

from . import attention, backward, conv, epilogues, gate_acts, gelu, layer_norm, matmul, rms_norm, rotary

FAMILIES = (conv, matmul, gelu, layer_norm, attention, rotary, rms_norm, gate_acts, epilogues, backward)
CATALOGUE = tuple(p for family in FAMILIES for p in family.PATTERNS)
KERNELS = {name: key for family in FAMILIES for name, key in family.KERNELS.items()}
LABELS = {name: fn for family in FAMILIES for name, fn in getattr(family, "LABELS", {}).items()}
NOTES = {name: notes for family in FAMILIES for name, notes in family.NOTES.items()}
