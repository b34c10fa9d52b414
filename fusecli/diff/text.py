"""The ``fusecli diff`` report people read: the verdict first, then fusions, memory, saved tensors,
ops and pairing, laid out in the terminal's width (80 columns when not a terminal)."""

from __future__ import annotations

from ..core.names import ELLIPSIS, cut
from ..core.terminal import Style
from ..core.units import format_bytes
from ..report.text import Column, table, terminal_width, wrap

MAX_ROWS = 12  # rows per section; the JSON has them all
LABEL = {"fusion_lost": "lost", "fusion_gained": "gained", "verdict_worse": "worse",
         "verdict_better": "better", "attention_kernel": "kernel"}
SHORT = {"training-safe": "training", "training-safe if recomputed": "if recomputed",
         "inference only": "inference", "not fusable": "not fusable"}  # verdicts in a narrow column


def _short(verdict: str | None) -> str:
    return SHORT.get(verdict, str(verdict))


def _dims(side: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in side["dims"].items()) or "fixed sizes"


def _change(d: dict) -> str:
    c = d["change"]
    if c is None:
        return "n/a"
    return f"{c * 100:+.1f}%" if abs(c) >= 0.001 else f"{c * 100:+.1g}%"


class Scopes:
    """Scopes for the tables: the prefix most of them share printed once, as '…/'."""

    def __init__(self, diffs: list[dict]) -> None:
        scopes = [d["scope"].split("/") for d in diffs if d.get("scope")]
        k = min((len(x) for x in scopes), default=0) - 1  # every scope keeps its last segment,
        if all(x == scopes[0] for x in scopes):
            k -= 1  # its last two when they are all one
        for x in scopes:
            while k > 0 and x[:k] != scopes[0][:k]:
                k -= 1
        self.prefix = "/".join(scopes[0][:k]) + "/" if k > 0 else ""

    def __call__(self, scope: str) -> str:
        if not scope:
            return "(top)"
        if self.prefix and (scope + "/").startswith(self.prefix):
            return ELLIPSIS + "/" + scope[len(self.prefix):]
        return scope


def summary_lines(doc: dict, width: int, style: Style) -> list[str]:
    s, old, new = doc["summary"], doc["old"], doc["new"]
    lines = [cut(f"OLD {old['model']}", width), cut(f"NEW {new['model']}", width)]
    if s["regression"]:
        verdict = style(f"REGRESSION ({', '.join(s['failing'])}): exit 1", fg="red", bold=True)
    else:
        verdict = style("no regression: exit 0", fg="green", bold=True)
    lines.append(verdict)
    counts = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in s["counts"].items()) or "no differences"
    lines += wrap(f"differences: {counts}", width, "")
    tol = f"{s['tolerance'] * 100:g}%"
    lines += wrap(f"fail on: {', '.join(s['fail_on'])} (memory tolerance {tol}); sizes: OLD at "
                  f"{_dims(old)}; NEW at {_dims(new)}", width, "")
    lines.append(f"ops: {old['forward_nodes']} -> {new['forward_nodes']} forward, "
                 f"{old['backward_nodes']} -> {new['backward_nodes']} backward")
    return lines


def fusion_lines(diffs: list[dict], width: int, scope: Scopes) -> list[str]:
    rows = []
    for d in diffs:
        if d["kind"] in ("fusion_lost", "fusion_gained"):
            note = _short(d["verdict"]) + (f", within {d['within']}" if d["within"] else "")
            rows.append([LABEL[d["kind"]] + ("!" if d["regression"] else ""), d["pattern"],
                         scope(d["scope"]), f"x{d['count']}", note])
        elif d["kind"] in ("verdict_worse", "verdict_better", "attention_kernel"):
            rows.append([LABEL[d["kind"]] + ("!" if d["regression"] else ""), d["pattern"],
                         scope(d["scope"]), f"x{d['count']}", f"{_short(d['old'])} -> {_short(d['new'])}"])
    if not rows:
        return []
    cols = [Column("change"), Column("pattern"), Column("scope", flex=1, names=True),
            Column("n", right=True), Column("verdict / note", flex=1)]
    title = "fusions ('!' = regression)"
    return ["", title, *table(cols, rows[:MAX_ROWS], width),
            *([f"  ... {len(rows) - MAX_ROWS} more (--json)"] if len(rows) > MAX_ROWS else [])]


def memory_lines(doc: dict, width: int) -> list[str]:
    diffs = doc["differences"]
    old, new = doc["old"]["memory"], doc["new"]["memory"]
    by_total = {d["total"]: d for d in diffs if d["kind"] == "memory"}
    rows = []
    for total in ("saved_bytes", "saved_activation_bytes", "peak_bytes"):
        d = by_total.get(total)
        change = "same" if d is None else _change(d) + ("!" if d["regression"] else "")
        rows.append([total.removesuffix("_bytes").replace("_", " "), format_bytes(old[total]),
                     format_bytes(new[total]), change])
    lines = ["", "memory at the sizes above ('!' = over the tolerance)",
             *table([Column("total"), Column("OLD", right=True), Column("NEW", right=True),
                     Column("change", right=True)], rows, width)]
    for total, label in (("saved_bytes", "saved formula"), ("peak_bytes", "peak formula (the peak step)")):
        terms = [d for d in diffs if d["kind"] == "formula_term" and d["total"] == total]
        if terms:
            parts = [f"{'constant' if d['term'] == '1' else d['term']} {d['change']} ({d['old']} -> "
                     f"{d['new']})" for d in terms]
            lines += wrap(f"{label}: " + "; ".join(parts), width, "  ")
    return lines


def saved_lines(diffs: list[dict], width: int, scope: Scopes) -> list[str]:
    rows = [["appeared" if d["kind"] == "saved_appeared" else "vanished", d["op"], scope(d["scope"]),
             f"x{d['count']}", format_bytes(d["bytes"]), d["bytes_formula"] or "?"]
            for d in diffs if d["kind"] in ("saved_appeared", "saved_vanished")]
    if not rows:
        return []
    cols = [Column("saved"), Column("op"), Column("scope", flex=1, names=True), Column("n", right=True),
            Column("each", right=True), Column("formula", flex=1)]
    return ["", "saved tensors that appeared or vanished (largest)", *table(cols, rows, width)]


def other_lines(doc: dict, width: int) -> list[str]:
    lines = []
    for d in doc["differences"]:
        if d["kind"] in ("near_miss_gained", "near_miss_lost"):
            what = "attention not matched" if d["kind"] == "near_miss_gained" else "near miss gone"
            lines += wrap(f"{what} x{d['count']} at {d['scope'] or '(top)'}: {d['op']} ({d['reason']})",
                          width, "  ")
        if d["kind"] in ("unsupported_gained", "unsupported_lost"):
            lines += wrap(f"{d['kind'].replace('_', ' ')}: {d['op']} {d['old']} -> {d['new']}", width, "  ")
    p = doc["pairing"]
    unpaired = [f"OLD {s}" for s in p["unpaired_old"]] + [f"NEW {s}" for s in p["unpaired_new"]]
    text = (f"scopes with ops: {p['paired']} of NEW's {p['scopes_new']} paired with OLD's "
            f"(OLD has {p['scopes_old']})")
    if unpaired:
        shown = ", ".join(unpaired[:6]) + (f", ... {len(unpaired) - 6} more" if len(unpaired) > 6 else "")
        text += f"; not paired: {shown}"
    lines += wrap(text, width, "  ")
    for note in doc["notes"]:
        lines += wrap(f"note: {note}", width, "  ")
    return ["", "ops, pairing, notes", *lines]


def report_lines(doc: dict, width: int | None = None, color: bool = False,
                 style: Style | None = None) -> list[str]:
    width = width or terminal_width()
    style = style or Style(color)
    diffs = doc["differences"]
    scope = Scopes(diffs)
    names = [cut(f"scopes: {ELLIPSIS}/ stands for {scope.prefix}", width)] if scope.prefix else []
    return [*summary_lines(doc, width, style), *names, *fusion_lines(diffs, width, scope),
            *memory_lines(doc, width), *saved_lines(diffs, width, scope), *other_lines(doc, width)]
