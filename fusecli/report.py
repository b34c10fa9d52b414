"""The JSON document (the machine contract) and the rich tables people read."""

from __future__ import annotations

from . import __version__
from .fusion.match import Match
from .ir import gc_paused
from .liveness import Saved
from .pipeline import Analysis
from .units import format_bytes, format_shape


def to_json(a: Analysis) -> dict:
    """The contract documented in the README; parts a pass has not filled are present and empty."""
    with gc_paused():  # a big model's document is millions of small objects: no garbage among them
        return _document(a)


def _document(a: Analysis) -> dict:
    g, live = a.graph, a.liveness
    return {
        "fusecli": __version__,
        "model": a.path,
        "format": g.format,
        "batch": a.options.batch,
        "forward": {"nodes": len(g.nodes), "tensors": len(g.tensors)},
        "backward": {"nodes": len(a.joint.backward_nodes())},
        "autodiff": {"profile": a.profile.name if a.profile else "ops", "reason": a.profile_reason,
                     "composites": len(a.joint.meta.get("composites", ()))},
        "saved": [saved_entry(s) for s in live.saved],
        "memory": {"saved_bytes": live.saved_bytes,
                   "saved_activation_bytes": live.saved_activation_bytes,
                   "peak_bytes": live.peak_bytes},
        "patterns": [pattern_entry(m) for m in a.matches],
        "unsupported": [{"op": op, "count": c}
                        for op, c in sorted(a.unsupported().items(), key=lambda kv: (-kv[1], kv[0]))],
    }


def saved_entry(s: Saved) -> dict:
    t = s.tensor
    return {"name": t.name, "producer": t.producer.name if t.producer else t.name,
            "op": t.producer.op_type if t.producer else t.kind, "kind": t.kind, "bytes": s.bytes,
            "needed_by": [n.name for n in s.needed_by], "reads": s.reads}


def pattern_entry(m: Match) -> dict:
    v = m.verdict
    return {"pattern": m.pattern.name, "nodes": [n.name for n in m.nodes],
            "inference_safe": v.inference_safe, "training_safe": v.training_safe,
            "blocking": [{"tensor": b.tensor.name, "needed_by": b.needed_by, "bytes": b.bytes}
                         for b in v.blocking],
            "reason": v.reason, "phase": m.pattern.phase, "kernel": m.pattern.kernel,
            "traffic_bytes": v.traffic_bytes, "frameworks": v.frameworks}


def pattern_summary(a: Analysis) -> list[dict]:
    """Per pattern: matches, how many are safe for inference and for training, traffic saved."""
    rows: dict[str, dict] = {}
    for m in a.matches:
        r = rows.setdefault(m.pattern.name, {"pattern": m.pattern.name, "matches": 0, "inference_safe": 0,
                                             "training_safe": 0, "traffic_bytes": 0})
        r["matches"] += 1
        r["inference_safe"] += m.verdict.inference_safe
        r["training_safe"] += m.verdict.training_safe
        r["traffic_bytes"] += m.verdict.traffic_bytes
    return list(rows.values())


def print_report(a: Analysis, console) -> None:
    """Human output: graph summary now; saved tensors, memory and patterns as passes fill them."""
    from rich.table import Table

    g = a.graph
    console.print(f"[bold]{a.path}[/] ({g.format})")
    if a.profile is not None:
        from rich.markup import escape

        console.print(f"autodiff: [bold]{a.profile.name}[/] ({escape(a.profile_reason)})")
    summary = Table(show_header=False)
    summary.add_column(style="bold")
    summary.add_column()
    kinds: dict[str, int] = {}
    for t in g.tensors.values():
        kinds[t.kind] = kinds.get(t.kind, 0) + 1
    summary.add_row("forward nodes", str(len(g.nodes)))
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
    print_saved(a, console)
    print_patterns(a, console)
    unsupported = a.unsupported()
    if unsupported:
        console.print("[yellow]unsupported ops (treated conservatively):[/] "
                      + ", ".join(f"{op} x{c}" for op, c in sorted(unsupported.items(),
                                                                     key=lambda kv: (-kv[1], kv[0]))))


def print_saved(a: Analysis, console, limit: int = 40) -> None:
    """The saved tensors (largest first) and the memory totals."""
    from rich.table import Table

    live = a.liveness
    wrt = "parameters and inputs" if a.options.wrt_inputs else "parameters"
    table = Table(title=f"saved for backward (gradients w.r.t. {wrt}; batch {a.options.batch})",
                  title_justify="left")
    for col, just in (("tensor", "left"), ("kind", "left"), ("made by", "left"), ("bytes", "right"),
                      ("read by", "left")):
        table.add_column(col, justify=just)
    for s in live.saved[:limit]:
        e = saved_entry(s)
        made = e["producer"] if not s.tensor.producer else f"{e['producer']} ({e['op']})"
        shape_note = " (shape only)" if s.reads == "shape" else ""
        table.add_row(e["name"], e["kind"], made, format_bytes(s.bytes),
                      ", ".join(e["needed_by"][:3]) + (" ..." if len(e["needed_by"]) > 3 else "")
                      + shape_note)
    if len(live.saved) > limit:
        table.caption = f"{len(live.saved) - limit} smaller saved tensors not shown (--json lists all)"
    console.print(table)
    by_kind: dict[str, int] = {}
    for s in live.saved:
        by_kind[s.tensor.kind] = by_kind.get(s.tensor.kind, 0) + s.bytes
    peak_node = live.peak_node
    console.print(
        f"saved: [bold]{format_bytes(live.saved_bytes)}[/] ("
        + ", ".join(f"{k} {format_bytes(v)}" for k, v in sorted(by_kind.items())) + ")   "
        f"peak: [bold]{format_bytes(live.peak_bytes)}[/]"
        + (f" at {peak_node.name} ({peak_node.phase})" if peak_node else "")
        + f"   backward ops: {len(a.joint.backward_nodes())}")


def _mark(v: bool | None) -> str:
    return {True: "[green]yes[/]", False: "[red]no[/]", None: "[yellow]?[/]"}[v]


def _framework_line(name: str, f: dict) -> str:
    return f"{name}: CPU {_mark(f['cpu'])}, GPU {_mark(f['gpu'])} ({f['note']})"


def print_patterns(a: Analysis, console, limit: int = 60) -> None:
    """Each match with its verdicts, reason and framework notes, then a summary per pattern."""
    from rich.markup import escape
    from rich.table import Table

    if not a.matches:
        console.print("fusion patterns: none found")
        return
    console.print(f"[bold]fusion patterns[/] ({len(a.matches)} matches)")
    for m in a.matches[:limit]:
        v = m.verdict
        safety = (f"inference {_mark(v.inference_safe)}  " if m.pattern.phase == "forward" else "") \
            + f"training {_mark(v.training_safe)}"
        blocked = "".join(f"  blocked by [bold]{escape(b.tensor.name)}[/] ({format_bytes(b.bytes)})"
                          for b in v.blocking)
        console.print(f"[cyan]{m.pattern.name}[/]  {escape(' > '.join(n.name for n in m.nodes))}  "
                      f"{safety}{blocked}")
        console.print(f"    {escape(v.reason)}", highlight=False)
        console.print("    " + _framework_line("TensorFlow", v.frameworks["tensorflow"]) + "; "
                      + _framework_line("ONNX Runtime", v.frameworks["onnxruntime"]), highlight=False)
    if len(a.matches) > limit:
        console.print(f"... {len(a.matches) - limit} more matches (--json lists all, --patterns filters)")
    summary = Table(title="per pattern", title_justify="left")
    for col, just in (("pattern", "left"), ("matches", "right"), ("inference-safe", "right"),
                      ("training-safe", "right"), ("traffic saved", "right")):
        summary.add_column(col, justify=just)
    for r in pattern_summary(a):
        summary.add_row(r["pattern"], str(r["matches"]), str(r["inference_safe"]), str(r["training_safe"]),
                        format_bytes(r["traffic_bytes"]))
    console.print(summary)
