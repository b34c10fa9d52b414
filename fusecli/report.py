"""The JSON document (the machine contract) and the rich tables people read."""

from __future__ import annotations

from . import __version__
from .pipeline import Analysis


def to_json(a: Analysis) -> dict:
    """The contract documented in the README; parts a pass has not filled are present and empty."""
    g = a.graph
    forward = g.forward_nodes()
    return {
        "fusecli": __version__,
        "model": a.path,
        "format": g.format,
        "batch": a.options.batch,
        "forward": {"nodes": len(forward),
                    "tensors": sum(1 for t in g.tensors.values() if t.meta.get("phase") != "backward")},
        "backward": {"nodes": 0},
        "saved": [],
        "memory": {"saved_bytes": 0, "saved_activation_bytes": 0, "peak_bytes": 0},
        "patterns": [],
        "unsupported": unsupported_ops(a),
    }


def unsupported_ops(a: Analysis) -> list[dict]:
    """Op types with no canonical kind, most frequent first."""
    counts: dict[str, int] = {}
    for n in a.graph.forward_nodes():
        if n.kind == "unknown":
            key = n.op_type if not n.domain or n.domain == "ai.onnx" else f"{n.domain}.{n.op_type}"
            counts[key] = counts.get(key, 0) + 1
    return [{"op": op, "count": c} for op, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def format_shape(shape) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def print_report(a: Analysis, console) -> None:
    """Human output: graph summary now; saved tensors, memory and patterns as passes fill them."""
    from rich.table import Table

    g = a.graph
    doc = to_json(a)
    summary = Table(title=f"{a.path} ({g.format})", show_header=False, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    kinds: dict[str, int] = {}
    for t in g.tensors.values():
        kinds[t.kind] = kinds.get(t.kind, 0) + 1
    summary.add_row("forward nodes", str(doc["forward"]["nodes"]))
    summary.add_row("tensors", ", ".join(f"{kinds[k]} {k}" for k in sorted(kinds)))
    summary.add_row("batch", str(a.options.batch))
    for t in g.inputs:
        summary.add_row("input", f"{t.name} {t.dtype} {format_shape(t.shape)}")
    for t in g.outputs:
        summary.add_row("output", f"{t.name} {t.dtype} {format_shape(t.shape)}")
    console.print(summary)

    ops = Table(title="ops", title_justify="left")
    ops.add_column("op")
    ops.add_column("kind")
    ops.add_column("count", justify="right")
    counts: dict[tuple[str, str], int] = {}
    for n in g.forward_nodes():
        counts[n.op_type, n.kind] = counts.get((n.op_type, n.kind), 0) + 1
    for (op, kind), c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        ops.add_row(op, kind, str(c))
    console.print(ops)
    if doc["unsupported"]:
        console.print("[yellow]unsupported ops (treated conservatively):[/] "
                      + ", ".join(f"{u['op']} x{u['count']}" for u in doc["unsupported"]))
