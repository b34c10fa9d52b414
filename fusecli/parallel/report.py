"""Per-rank memory for people (lines at 80 columns) and for programs (the JSON's ``layout`` and ``ranks``)."""

from __future__ import annotations

import textwrap

from ..core.units import format_bytes
from .layout import DEVICES, INTERLEAVED, Layout
from .plan import RankPlan
from .ranks import RankMemory

NOT_COUNTED = ["the collective library's own buffers (NCCL's channels, gloo's pairs)", "the CUDA context",
               "cuBLAS and cuDNN workspaces", "the caching allocator's fragmentation and reserve"]


PHASES = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}  # where the peak is


def ranks_text(ids: list[int]) -> str:
    """0-3,6 for [0, 1, 2, 3, 6]."""
    out, start = [], None
    for i, r in enumerate(ids):
        if start is None:
            start = r
        if i + 1 == len(ids) or ids[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ",".join(out)


def layout_json(layout: Layout, device: str, batch: int | None) -> dict:
    return {"name": layout.name, "world": layout.size, "dp_replicate": layout.dp_replicate,
            "dp_shard": layout.dp_shard, "zero": layout.zero,
            "reshard_after_forward": layout.reshard_after_forward, "tp": layout.tp, "sp": layout.sp,
            "pp": layout.pp, "microbatches": layout.microbatches, "pp_schedule": layout.pp_schedule,
            "virtual_stages": layout.virtual if layout.pp_schedule == INTERLEAVED else None,
            "device": device,
            "backend": DEVICES.get(device), "batch_per_rank": batch,
            "global_batch": batch * layout.data_parallel if batch is not None else None,
            "not_counted": NOT_COUNTED}


def ranks_json(entries: list[RankMemory], budget: int | None) -> list[dict]:
    return [{"ranks": e.ranks, "parameter_bytes": e.parameter_bytes, "gradient_bytes": e.gradient_bytes,
             "optimizer_bytes": e.optimizer_bytes, "saved_activation_bytes": e.saved_activation_bytes,
             "buffer_bytes": e.buffer_bytes, "peak_bytes": e.peak_bytes, "peak_phase": e.peak_phase,
             "peak_step": e.peak_step, **({"fits": e.peak_bytes <= budget} if budget is not None else {}),
             **({"microbatches_in_flight": e.in_flight} if e.in_flight is not None else {})}
            for e in entries]


def ranks_lines(entries: list[RankMemory], layout: Layout, device: str, batch: int | None,
                budget: int | None = None, largest: str | None = None, title: bool = True) -> list[str]:
    """The table: one row per distinct rank (``title``: under the layout's line)."""
    where = "through the pipeline" if layout.pp > 1 else "per rank"
    per = f"batch {batch} {where}, global {batch * layout.data_parallel}" if batch is not None else \
        "no batch dim"
    head = textwrap.wrap(f"per rank: {layout.name} on {layout.size} ranks ({DEVICES.get(device, device)}), "
                         f"{per}", 80, subsequent_indent="  ")
    out = [*(head if title else []),
           f"  {'ranks':<7}" + "".join(f"{h:>10}" for h in ("params", "grads", "optimizer", "saved",
                                                             "buffers", "peak"))
           + "  at" + ("  fits" if budget is not None else "")]
    for e in entries:
        fits = ("  yes" if e.peak_bytes <= budget else "   NO") if budget is not None else ""
        out.append(f"  {ranks_text(e.ranks):<7}" + "".join(
            f"{format_bytes(v):>10}" for v in (e.parameter_bytes, e.gradient_bytes, e.optimizer_bytes,
                                                e.saved_activation_bytes, e.buffer_bytes, e.peak_bytes))
            + f"  {PHASES[e.peak_phase]}{fits}")
    if layout.pp > 1:
        flight = ", ".join(f"{ranks_text(e.ranks)}: {e.in_flight}" for e in entries)
        out.append(f"microbatches in flight by rank ({layout.pp_schedule.upper()}, {layout.chunks} of "
                   f"batch {batch // layout.chunks if batch else '?'}): {flight}")
    if largest is not None:
        out.append(f"largest that fits every rank: {largest}")
    out.append("not counted (--json: layout.not_counted): collective libraries' own buffers,")
    out.append("  the CUDA context, cuBLAS/cuDNN workspaces, allocator fragmentation")
    return out


def _solved(dim: str | None, value: int | None) -> str:
    if value is None or dim is None:
        return "no dim to solve for"
    return f"{dim}={value:,}" if value else f"none (not even {dim}=1)"


def rank_plan_json(rp: RankPlan) -> dict:
    """The plan's JSON fields for a layout."""
    return {"layout": layout_json(rp.layout, rp.device, rp.batch), "ranks": ranks_json(rp.ranks, rp.budget),
            "ranks_largest": rp.largest, "ranks_fit": rp.fits, "ranks_note": rp.note,
            "ranks_plan": None if rp.planned is None else {
                "recompute": rp.names, "ranks": ranks_json(rp.planned, rp.budget),
                "largest": rp.planned_largest}}


def rank_plan_lines(rp: RankPlan, dim: str | None) -> list[str]:
    out = ranks_lines(rp.ranks, rp.layout, rp.device, rp.batch, rp.budget,
                      _solved(dim, rp.largest))
    if rp.note:
        out[-2:-2] = textwrap.wrap(f"note: {rp.note}", 80, subsequent_indent="  ")
    if rp.planned is None:
        return out
    head = "every rank fits recomputing" if rp.fits else "not every rank fits even recomputing"
    out += ["", *textwrap.wrap(f"{head} the first {rp.chosen} of the plan's steps: {', '.join(rp.names)}",
                               80, subsequent_indent="  "),
            *ranks_lines(rp.planned, rp.layout, rp.device, rp.batch, rp.budget,
                         _solved(dim, rp.planned_largest), title=False)[:-2]]
    return out
