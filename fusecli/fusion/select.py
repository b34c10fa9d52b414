"""One choice of fused matches, shared by `fusecli rewrite` (rewrite/plan.py) and the after pictures
(render/views.py, render/training_view.py): greedy and non-overlapping, the largest interior traffic
saved first, then the larger match, then graph order; each caller says which matches it may use."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .match import Match


def saving(m: Match) -> tuple:
    """Sort key: the largest interior traffic saved first, then the larger match (stable: graph order)."""
    return (-m.verdict.traffic_bytes, -len(m.nodes))


def select(matches: list[Match], usable: Callable[[Match], bool],
           take: Callable[[Match], Iterable[str] | None] | None = None,
           claimed: set[str] | None = None, first: Callable[[Match], int] | None = None) -> list[Match]:
    """The ``usable`` matches chosen, none sharing a node. ``take(m)`` (rewrite: emit m's kernel) returns
    the further node names m's kernel claims, or None to pass m over and try the smaller matches inside it
    (``m.inner``) instead; ``claimed``: node names already taken, updated as matches are chosen; ``first``:
    a key ranked before the saving (the training picture: matches whose backward is fused too)."""
    claimed = set() if claimed is None else claimed
    chosen: list[Match] = []
    tried: set[int] = set()
    key = saving if first is None else (lambda m: (first(m), *saving(m)))

    def walk(ms: list[Match]) -> None:
        for m in sorted((m for m in ms if usable(m)), key=key):
            if id(m) in tried or any(n.name in claimed for n in m.nodes):
                continue
            tried.add(id(m))
            extra = take(m) if take is not None else ()
            if extra is None:
                walk(m.inner)
                continue
            claimed.update(extra)
            claimed.update(n.name for n in m.nodes)
            chosen.append(m)

    walk(matches)
    return chosen
