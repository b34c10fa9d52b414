"""Fusion: the pattern catalogue, the root-anchored matcher, and a verdict per match."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..core.errors import FuseError
from ..core.ir import Graph
from ..memory.liveness import Liveness
from .match import Match, find_matches
from .patterns import BY_NAME, CATALOGUE
from .verdict import Lookups, judge, suppress_dominated


def select_patterns(names: Iterable[str] | None):
    """The catalogue, or the named entries of it (FuseError naming the unknown ones)."""
    if not names:
        return CATALOGUE
    names = list(names)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise FuseError(f"unknown pattern {unknown[0]!r}; known: {', '.join(BY_NAME)}")
    return tuple(p for p in CATALOGUE if p.name in names)


def find_fusions(graph: Graph, joint: Graph, live: Liveness, sizes: Mapping[str, int] | None = None,
                 names: Iterable[str] | None = None) -> list[Match]:
    """Forward matches on the model's graph and backward matches on the joint graph, each judged."""
    patterns = select_patterns(names)
    matches = find_matches(graph, patterns, "forward")
    outputs = {t.name for t in graph.outputs}
    lookups = Lookups(live, sizes)  # per-tensor facts, shared by the matches that read the same tensors
    for m in matches:
        m.verdict = judge(m, graph, live, sizes, outputs, lookups)
    back = find_matches(joint, patterns, "backward")
    for m in back:
        m.verdict = judge(m, joint, live, sizes, lookups=lookups)
    return suppress_dominated(matches) + back
