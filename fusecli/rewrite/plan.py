"""Which matches to rewrite: safe for the mode, emittable on the target, none sharing a node."""

from __future__ import annotations

from ..fusion.match import Match
from .emit import emit
from .kit import Context, Emission


def is_safe(m: Match, mode: str) -> bool:
    """Forward matches safe for ``mode`` (training: the verdict's training_safe, else inference_safe)."""
    v = m.verdict
    if m.pattern.phase != "forward" or v is None:
        return False
    return bool(v.training_safe if mode == "training" else v.inference_safe)


def saving(m: Match) -> tuple:
    """Sort key: the largest interior traffic saved first, then the larger match, then graph order."""
    return (-m.verdict.traffic_bytes, -len(m.nodes))


def plan(matches: list[Match], ctx: Context) -> list[Emission]:
    """Greedy non-overlapping choice, largest saving first; a match no kernel fits is passed over, and the
    smaller matches inside it (the report's dominated ones: attention's scaled Q K^T) are tried instead."""
    chosen: list[Emission] = []
    ctx.by_root = {m.root.name: m for m in matches}  # an emitter may take a neighbour match in (rotary)
    tried: set[int] = set()

    def take(ms: list[Match]) -> None:
        for m in sorted((m for m in ms if is_safe(m, ctx.mode)), key=saving):  # stable: graph order
            if id(m) in tried or any(n.name in ctx.claimed for n in m.nodes) \
                    or f"{m.pattern.name} at {m.root.name}" in ctx.excluded:
                continue
            tried.add(id(m))
            e = _emission(m, ctx)
            if e is None or any(name in ctx.claimed for name in e.remove):
                take(m.inner)
                continue
            e.at = m.root.name
            ctx.claimed.update(e.remove)
            ctx.claimed.update(n.name for n in m.nodes)
            chosen.append(e)

    take(matches)
    return chosen


def _emission(m: Match, ctx: Context) -> Emission | None:
    try:
        return emit(m, ctx)
    except (ValueError, IndexError, KeyError, TypeError, NotImplementedError, ArithmeticError) as err:
        # weights or attributes the kernel cannot take (a damaged file, an unusual export): the match
        # stays unfused and the run says so
        ctx.skipped.append(f"{m.pattern.name} at {m.root.name} ({type(err).__name__}: "
                           f"{' '.join(str(err).split())[:160]})")
        return None
