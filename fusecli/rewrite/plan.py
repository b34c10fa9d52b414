"""Which matches to rewrite: safe for the mode, emittable on the target, none sharing a node (the choice
is fusion.select's, which the after pictures share)."""

from __future__ import annotations

from ..fusion.match import Match
from ..fusion.select import select
from .graph.kit import Context, Emission
from .kernels.registry import emit

NO_KERNEL = "no kernel takes it"  # the 'not rewritten' line of a match its emitter refused


def is_safe(m: Match, mode: str) -> bool:
    """Forward matches safe for ``mode`` (training: the verdict's training_safe, else inference_safe)."""
    v = m.verdict
    if m.pattern.phase != "forward" or v is None:
        return False
    return bool(v.training_safe if mode == "training" else v.inference_safe)


def plan(matches: list[Match], ctx: Context) -> list[Emission]:
    """fusion.select's choice among the safe matches, each taken where a kernel fits: a match no kernel
    fits is passed over, and the smaller matches inside it (the report's dominated ones: attention's scaled
    Q K^T) are tried instead. Every match passed over so gets a line in ``ctx.skipped`` saying why (the
    emitter's reason, or that no kernel takes it as written), unless its emitter said one already."""
    chosen: list[Emission] = []
    refused: list[tuple[Match, str | None]] = []
    ctx.by_root = {m.root.name: m for m in matches}  # an emitter may take a neighbour match in (rotary)

    def take(m: Match) -> list[str] | None:
        e = _emission(m, ctx)
        if isinstance(e, str) or e is None:
            refused.append((m, e))
            return None
        if any(name in ctx.claimed for name in e.remove):
            return None
        e.at = m.root.name
        chosen.append(e)
        return e.remove

    def usable(m: Match) -> bool:
        return is_safe(m, ctx.mode) and f"{m.pattern.name} at {m.root.name}" not in ctx.excluded

    select(matches, usable, take, ctx.claimed)
    for m, why in refused:
        at = f"{m.pattern.name} at {m.root.name}"
        if not any(s == at or s.startswith((f"{at}:", f"{at} (")) for s in ctx.skipped):
            ctx.skipped.append(f"{at}: {NO_KERNEL} ({why})" if why else
                               f"{at}: {NO_KERNEL} as written ({m.pattern.kernel}, target {ctx.target})")
    return chosen


def _emission(m: Match, ctx: Context) -> Emission | str | None:
    try:
        return emit(m, ctx)
    except (ValueError, IndexError, KeyError, TypeError, NotImplementedError, ArithmeticError) as err:
        # weights or attributes the kernel cannot take (a damaged file, an unusual export): the match
        # stays unfused and the run says so
        ctx.skipped.append(f"{m.pattern.name} at {m.root.name} ({type(err).__name__}: "
                           f"{' '.join(str(err).split())[:160]})")
        return None
