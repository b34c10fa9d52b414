"""The framework-notes kit: a verdict line, the shared facts the families' notes and after-view labels read
(a match's activation and output dtype,
the activation sets Grappler's remapper and ONNX Runtime's FusedConv take), and each framework's default
for a pattern no family notes. A family's ``NOTES`` maps a pattern name to {framework: entry}; an entry is
a (cpu, gpu, note) tuple, or a function of the match returning a verdict or None (then the default)."""

from __future__ import annotations

from ..spellings.acts import gate_act_kind
from .match import Match

FRAMEWORKS = ("tensorflow", "onnxruntime", "pytorch")
TF_CPU_ACTS = frozenset({"relu", "relu6", "elu", "leaky_relu"})
ORT_CPU_CONV_ACTS = frozenset({"relu", "sigmoid", "tanh", "leaky_relu", "relu6", "clip", "hard_sigmoid"})


def verdict(cpu: bool | None, gpu: bool | None, note: str) -> dict:
    return {"cpu": cpu, "gpu": gpu, "note": note}


def act(m: Match) -> str | None:
    return gate_act_kind(m.roles)  # relu, ..., or silu / swish / quick_gelu / hard_swish


def float32_out(m: Match) -> bool:
    out = m.root.outputs[0] if m.root.outputs else None
    return out is not None and out.dtype == "float32"


def default(framework: str, m: Match) -> dict:
    """What a framework does with a pattern its family says nothing about."""
    if framework == "tensorflow":
        return verdict(False, False, "not a Grappler remapper pattern")
    if framework == "pytorch":
        return verdict(None, None, "eager PyTorch runs each op; torch.compile (Inductor) may fuse it")
    if m.pattern.phase == "backward":
        return verdict(False, False, "ONNX Runtime inference runs no backward")
    return verdict(False, False, "no ONNX Runtime fusion for this pattern")


def note(entry, framework: str, m: Match) -> dict:
    """One family entry read for ``m``: a tuple, a function (None falls back to the default), or absent."""
    if isinstance(entry, tuple):
        return verdict(*entry)
    got = entry(m) if entry is not None else None
    return got if got is not None else default(framework, m)
