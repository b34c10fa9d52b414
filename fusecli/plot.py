"""``--plot``: live bytes along the schedule, the forward/backward boundary marked (matplotlib)."""

from __future__ import annotations

from .liveness import Liveness
from .output import atomic_write


def plot_timeline(live: Liveness, path: str, title: str) -> None:
    """Draw the live-bytes timeline to ``path`` (any format matplotlib writes: .png, .svg, .pdf)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    steps = range(len(live.timeline))
    mib = [b / 2**20 for b in live.timeline]
    ax.plot(steps, mib, color="#1f77b4", lw=1.2)
    ax.fill_between(steps, mib, alpha=0.15, color="#1f77b4")
    if live.boundary < len(live.timeline):
        ax.axvline(live.boundary - 0.5, color="#d62728", ls="--", lw=1)
        ax.text(live.boundary, max(mib) * 0.98, " backward", color="#d62728", va="top")
        ax.text(live.boundary - 1, max(mib) * 0.98, "forward ", color="#555", va="top", ha="right")
    if live.peak_step >= 0:
        ax.plot([live.peak_step], [mib[live.peak_step]], "o", color="#d62728")
        ax.annotate(f"peak {mib[live.peak_step]:.1f} MiB", (live.peak_step, mib[live.peak_step]),
                    textcoords="offset points", xytext=(6, -12))
    ax.set_xlabel("schedule step (op)")
    ax.set_ylabel("live MiB")
    ax.set_title(title)
    ax.margins(x=0.01)
    fig.tight_layout()
    fmt = path.rsplit(".", 1)[-1].lower() if "." in path else "png"
    with atomic_write(path) as f:
        fig.savefig(f, format=fmt, dpi=120)
    plt.close(fig)
