"""A selective-checkpointing policy's step for people (lines at 80 columns) and programs (JSON)."""

from __future__ import annotations

import textwrap

from ..core.units import format_bytes
from .sac import MATMULS, SDPA, SacStep

WIDTH = 80
NO_BLOCKS = "no repeated blocks (layers.N, h.N) to checkpoint: the policy changes nothing"


def sac_json(step: SacStep, base: SacStep, points: list[tuple[str, int, int | None]],
             front: set[str]) -> dict:
    """``memory.sac``: the step under the policy, the step without it, what each block caches, and every
    preset's peak and re-run FLOPs (``points``), those on the Pareto front (``front``) marked."""
    return {"policy": step.preset, "held_at_forward_end": step.held_at_forward_end,
            "saved_activation_bytes": step.saved_activation_bytes, "peak_bytes": step.peak_bytes,
            "recompute_flops": step.recompute_flops,
            "note": NO_BLOCKS if not step.blocks and step.preset != "none" else None,
            "without_policy": {"held_at_forward_end": base.held_at_forward_end,
                               "saved_activation_bytes": base.saved_activation_bytes,
                               "peak_bytes": base.peak_bytes},
            "presets": [{"policy": name, "peak_bytes": peak, "recompute_flops": flops,
                         "pareto": name in front} for name, peak, flops in points],
            "blocks": [{"block": c.name, "recompute_flops": c.flops,
                        "ops": [{"op": call.op, "node": call.node.name, "saved": saved,
                                 "router": call.router}
                                for call, saved in step.calls[c.name]]}
                       for c in step.blocks]}


def sac_lines(step: SacStep, base: SacStep, points: list[tuple[str, int, int | None]] = (),
              front: set[str] = frozenset()) -> list[str]:
    """The policy's figures beside the step without it, the policies on the Pareto front of peak and
    re-run FLOPs (``front`` of ``points``), fewest FLOPs first, and the first block's decisions."""
    flops = "unknown" if step.recompute_flops is None else f"{step.recompute_flops:,}"
    out = [f"selective checkpointing ({step.preset}, every block):",
           f"  held when forward returns {format_bytes(step.held_at_forward_end):>10}"
           f"   (without: {format_bytes(base.held_at_forward_end)})",
           f"  saved activations         {format_bytes(step.saved_activation_bytes):>10}"
           f"   (without: {format_bytes(base.saved_activation_bytes)})",
           f"  step peak                 {format_bytes(step.peak_bytes):>10}"
           f"   (without: {format_bytes(base.peak_bytes)})",
           f"  FLOPs backward re-runs    {flops}"]
    if not step.blocks and step.preset != "none":
        out.append(f"  {NO_BLOCKS}")
    if front:
        names = [n for n, _, f in sorted(points, key=lambda p: (p[2] or 0, p[0])) if n in front]
        out += textwrap.wrap(f"least peak for the re-run FLOPs (Pareto): {', '.join(names)}", WIDTH,
                             initial_indent="  ", subsequent_indent="    ")
    if step.blocks:
        c = step.blocks[0]
        calls = step.calls[c.name]
        saved = [call.label for call, s in calls if s]
        # the recomputed matmuls and attention by name; the elementwise rest as a count
        heavy = [call.label + "(router)" * call.router for call, s in calls
                 if not s and call.op in MATMULS | SDPA]
        others = sum(1 for call, s in calls if not s and call.op not in MATMULS | SDPA)
        rest = ", ".join(heavy) + (f" and {others} other op{'s' * (others != 1)}" if others else "")
        indent = " " * 4
        out += textwrap.wrap(f"{c.name} (of {len(step.blocks)}): saves {', '.join(saved) or 'nothing'}",
                             WIDTH, initial_indent="  ", subsequent_indent=indent)
        out += textwrap.wrap(f"recomputes {rest or 'nothing'}", WIDTH, initial_indent=indent,
                             subsequent_indent=indent)
    return out
