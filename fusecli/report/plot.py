"""``--plot``: live bytes along the schedule, the forward/backward boundary marked (matplotlib); the plan's
peak against its recompute, and selective-checkpointing policies' peaks against their re-run FLOPs.

A timeline that leaves out tensors of unknown size says so: the title names how many, in red, and the
peak is labelled as a lower bound (``peak >= ...``), never drawn as if it were the whole.
"""

from __future__ import annotations

from ..core.output import atomic_write
from ..core.units import format_bytes
from ..memory.liveness import Liveness


def axis_unit(peak: int) -> tuple[str, int]:
    """The unit the axis is drawn in: the largest whose peak value is at least 1."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if peak >= size:
            return unit, size
    return "B", 1


def plot_timeline(live: Liveness, path: str, title: str) -> str:
    """Draw the live-bytes timeline to ``path`` (.png, .svg or .pdf); a short note of what was drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = [0 if b is None else b for b in live.timeline]
    peak = max(timeline, default=0)
    missing = missing_note(live)
    at_least = "\u2265 " if missing else ""  # the drawn bytes are a lower bound when tensors are left out
    unit, size = axis_unit(peak)
    fig, ax = plt.subplots(figsize=(10, 4))
    steps = range(len(timeline))
    y = [b / size for b in timeline]
    ax.plot(steps, y, color="#1f77b4", lw=1.2)
    ax.fill_between(steps, y, alpha=0.15, color="#1f77b4")
    top = max(y, default=0) or 1
    ax.set_ylim(0, top * 1.3)  # headroom: the phase names sit above the curve, not on it
    if live.boundary < len(timeline):
        ax.axvline(live.boundary - 0.5, color="#d62728", ls="--", lw=1)
        ax.text(live.boundary, top * 1.27, " backward", color="#d62728", va="top")
        ax.text(live.boundary - 1, top * 1.27, "forward ", color="#555", va="top", ha="right")
    if 0 <= live.peak_step < len(timeline):
        x = live.peak_step
        ax.plot([x], [y[x]], "o", color="#d62728")
        # the label goes to the side with more room, below the phase names
        right = x < len(timeline) / 2
        ax.annotate(f"peak {at_least}{format_bytes(timeline[x])}", (x, y[x]), textcoords="offset points",
                    xytext=(8 if right else -8, 6), ha="left" if right else "right", va="bottom",
                    bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none"})
    ax.set_xlabel("schedule step (op)")
    ax.set_ylabel(f"live {unit}")
    ax.set_title(title if not missing else f"{title}\nincomplete: {missing}",
                 color="black" if not missing else "#d62728")
    ax.margins(x=0.01)
    _save(fig, path)
    note = f"live memory over {len(timeline)} steps, peak {at_least}{format_bytes(peak)}"
    return note if not missing else f"{note}; incomplete: {missing}"


def _save(fig, path: str) -> None:
    """Lay the figure out and write it whole to ``path`` in the format its suffix names, then free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fmt = path.rsplit(".", 1)[-1].lower()
    with atomic_write(path) as f:
        fig.savefig(f, format=fmt, dpi=120)
    plt.close(fig)


def missing_note(live: Liveness) -> str:
    """'3 tensors of unknown size not drawn' when the timeline leaves tensors out, else ''."""
    n = len(live.unknown)
    return f"{n} tensor{'s' if n > 1 else ''} of unknown size not drawn" if n else ""


def plot_plan_curve(points: list[tuple[int, int]], budget: int, chosen: int, path: str, title: str) -> str:
    """``plan --plot``: the step peak against the FLOPs recomputation adds, one point per step of the
    plan's sequence, the budget as a line and the chosen point marked; a short note of what was drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unit, size = axis_unit(max([p for _, p in points] + [budget]))
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [f / 1e9 for f, _ in points]
    ys = [p / size for _, p in points]
    ax.step(xs, ys, where="post", color="#1f77b4", lw=1.2)
    ax.plot(xs, ys, "o", color="#1f77b4", ms=4)
    ax.axhline(budget / size, color="#d62728", ls="--", lw=1)
    ax.text(xs[0], budget / size, " budget", color="#d62728", va="top", ha="left")
    ax.plot([xs[chosen]], [ys[chosen]], "o", color="#d62728", ms=8, mfc="none")
    ax.set_xlabel("FLOPs added to backward (GFLOP)")
    ax.set_ylabel(f"step peak ({unit})")
    ax.set_ylim(0, max(ys + [budget / size]) * 1.15)
    ax.set_title(title)
    _save(fig, path)
    return f"step peak over {len(points)} plan points, {chosen} chosen"


def plot_sac_presets(points: list[tuple[str, int, int | None]], front: set[str], current: str, path: str,
                     title: str) -> str:
    """``analyze --sac --plot``: each selective-checkpointing policy's step peak against the FLOPs its
    re-runs add, the Pareto front joined, the policy asked for circled; a short note of what was drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = [(n, p, f) for n, p, f in points if f is not None]
    unit, size = axis_unit(max((p for _, p, _ in drawn), default=0))
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, peak, flops in drawn:
        on = name in front
        ax.plot([flops / 1e9], [peak / size], "o", color="#1f77b4" if on else "#999", ms=5)
        ax.annotate(name, (flops / 1e9, peak / size), textcoords="offset points", xytext=(5, 4), fontsize=8)
        if name == current:
            ax.plot([flops / 1e9], [peak / size], "o", color="#d62728", ms=11, mfc="none")
    line = sorted((f / 1e9, p / size) for n, p, f in drawn if n in front)
    if len(line) > 1:
        ax.step([x for x, _ in line], [y for _, y in line], where="post", color="#1f77b4", lw=1, alpha=0.6)
    ax.set_xlabel("FLOPs backward re-runs (GFLOP)")
    ax.set_ylabel(f"step peak ({unit})")
    ax.set_ylim(0, max((p / size for _, p, _ in drawn), default=1) * 1.15)
    left_out = len(points) - len(drawn)
    ax.set_title(title if not left_out else f"{title}\n{left_out} with unknown FLOPs not drawn")
    _save(fig, path)
    return (f"{len(drawn)} policies' step peak against re-run FLOPs, {len(front)} on the Pareto front"
            + (f"; {left_out} with unknown FLOPs not drawn" if left_out else ""))
