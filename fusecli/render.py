"""DOT for the before / after / backward views (the seed posts' figures, for any model).

before: the forward op graph as in the model. after: each chosen fusion match drawn as one fused node,
coloured by verdict. backward: forward and backward ops side by side, each saved tensor an edge from
the op that makes it to the backward ops that read it, labelled with its bytes; tensors that block a
training fusion in red.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass

from .errors import FuseError
from .fusion.match import Match
from .ir import Graph, Node, Tensor
from .pipeline import Analysis
from .units import format_bytes, format_shape

VIEWS = ("before", "after", "backward")
BIG_GRAPH_NODES = 150
PARAMS_DRAWN_UP_TO = 12  # backward view: saved weights are drawn only for graphs this small
COLORS = {"training": "#2ca02c", "inference": "#ff7f0e", "none": "#d62728"}
FORWARD_STYLE = {"shape": "box", "style": "rounded,filled", "fillcolor": "#e8f0fe", "color": "#4a6fa5"}
BACKWARD_STYLE = {"shape": "box", "style": "filled", "fillcolor": "#fdebd0", "color": "#b9770e"}
LEAF_STYLE = {"shape": "ellipse", "style": "filled", "fillcolor": "#f2f2f2", "color": "#888888",
              "fontsize": "10"}


def escape(text: str) -> str:
    """Make text safe inside a quoted DOT label: backslashes doubled, quotes escaped, no raw newlines."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ").replace("\r", " ")


def _label(*lines: str) -> str:
    return "\\n".join(escape(line) for line in lines if line)


@dataclass
class Selection:
    """Which forward nodes to draw (None = all) and the matches drawn fused."""

    nodes: set[int] | None
    fused: list[Match]


def choose_fused(matches: list[Match], mode: str = "inference") -> list[Match]:
    """Non-overlapping forward matches to draw fused: those safe in ``mode`` first, then the largest."""
    def rank(m: Match) -> tuple:
        v = m.verdict
        if mode == "training":
            return (-v.training_safe, -v.inference_safe, -len(m.nodes))
        return (-v.inference_safe, -len(m.nodes), -v.training_safe)

    chosen, used = [], set()
    ranked = sorted((m for m in matches if m.pattern.phase == "forward"), key=rank)
    for m in ranked:
        ids = {id(n) for n in m.nodes}
        if ids & used:
            continue
        used |= ids
        chosen.append(m)
    return chosen


def focus_nodes(a: Analysis, focus: str, hops: int) -> set[int]:
    """Forward nodes within ``hops`` of a node name, or of a match (``pattern`` or ``pattern:k``)."""
    g = a.graph
    name, _, index = focus.partition(":")
    if g.has_node(focus):
        start = [g.node(focus)]
    else:
        found = [m for m in a.matches if m.pattern.name == name and m.pattern.phase == "forward"]
        k = int(index) if index.isdigit() else 0
        if not found or k >= len(found):
            raise FuseError(f"--focus {focus!r}: no node or forward match of that name "
                            f"({len(found)} matches of {name!r})" if found else
                            f"--focus {focus!r}: no node or pattern of that name in the model")
        start = found[k].nodes
    seen = {id(n): 0 for n in start}
    queue = deque(start)
    while queue:
        n = queue.popleft()
        if seen[id(n)] >= hops:
            continue
        neighbours = [t.producer for t in n.inputs if t is not None and t.producer is not None]
        neighbours += [c for t in n.outputs if t is not None for c in t.consumers]
        for m in neighbours:
            if id(m) not in seen and m.phase == "forward" and not m.meta.get("constant"):
                seen[id(m)] = seen[id(n)] + 1
                queue.append(m)
    return set(seen)


def scope_of(name: str, depth: int) -> str | None:
    """The first ``depth`` components of a '/'-separated name, or None when it has no deeper parts."""
    parts = [p for p in name.split("/") if p]
    return "/".join(parts[:depth]) if depth > 0 and len(parts) > depth else None


def _verdict_color(m: Match) -> str:
    v = m.verdict
    return COLORS["training"] if v.training_safe else COLORS["inference"] if v.inference_safe \
        else COLORS["none"]


def _node_label(n: Node) -> list[str]:
    out = n.outputs[0] if n.outputs and n.outputs[0] is not None else None
    return [n.op_type, n.name] + ([f"{format_shape(out.shape)} {out.dtype}"] if out is not None else [])


class _Drawer:
    """Builds one graphviz.Digraph; node ids are n<k>, never the model's names."""

    def __init__(self, title: str) -> None:
        import graphviz

        self.dot = graphviz.Digraph("fusecli", graph_attr={
            "rankdir": "TB", "fontname": "Helvetica", "label": escape(title), "labelloc": "t",
            "fontsize": "12"}, node_attr={"fontname": "Helvetica", "fontsize": "10"},
            edge_attr={"fontname": "Helvetica", "fontsize": "9", "color": "#666666"})
        self.ids: dict[int, str] = {}

    def node(self, key: int, label: str, **attrs) -> str:
        if key not in self.ids:
            self.ids[key] = f"n{len(self.ids)}"
            self.dot.node(self.ids[key], label, **attrs)
        return self.ids[key]

    def edge(self, a: str, b: str, **attrs) -> None:
        self.dot.edge(a, b, **attrs)


def _drawable(g: Graph, sel: Selection) -> list[Node]:
    return [n for n in g.forward_nodes() if not n.meta.get("constant")
            and (sel.nodes is None or id(n) in sel.nodes)]


def _forward(d: _Drawer, a: Analysis, sel: Selection, collapse: int) -> dict[int, str]:
    """Draw forward nodes (fused groups and collapsed scopes as one node); map node -> drawn id."""
    fused_of = {id(n): m for m in sel.fused for n in m.nodes}
    drawn: dict[int, str] = {}
    for n in _drawable(a.graph, sel):
        m = fused_of.get(id(n))
        if m is not None:
            color = _verdict_color(m)
            v = m.verdict
            state = "training-safe" if v.training_safe else "inference only" if v.inference_safe \
                else "not fusable"
            drawn[id(n)] = d.node(id(m), _label(m.pattern.name, m.pattern.kernel.split(" / ")[0],
                                                " > ".join(x.name for x in m.nodes), state),
                                  shape="box", style="rounded,filled,bold", color=color,
                                  fillcolor=color + "33", penwidth="2")
            continue
        scope = scope_of(n.name, collapse)
        if scope is not None:
            drawn[id(n)] = d.node(hash(("scope", scope)), _label(scope + "/…", "(collapsed scope)"),
                                  shape="box3d", style="filled", fillcolor="#eeeeee")
            continue
        drawn[id(n)] = d.node(id(n), _label(*_node_label(n)), **FORWARD_STYLE)
    return drawn


def _leaf(d: _Drawer, t: Tensor) -> str:
    return d.node(id(t), _label(t.name, f"{t.kind} {format_shape(t.shape)}"), **LEAF_STYLE)


def _forward_edges(d: _Drawer, a: Analysis, sel: Selection, drawn: dict[int, str]) -> None:
    seen = set()
    for n in _drawable(a.graph, sel):
        for t in n.inputs:
            if t is None:
                continue
            if t.producer is not None and id(t.producer) in drawn:
                src = drawn[id(t.producer)]
            elif t.kind == "input" or (t.producer is not None and sel.nodes is not None
                                       and not t.producer.meta.get("constant")):
                src = _leaf(d, t)  # graph inputs, and tensors entering a focused drawing
            else:
                continue  # parameters and constants are not drawn in the op graph
            key = (src, drawn[id(n)], t.name)
            if src != drawn[id(n)] and key not in seen:
                seen.add(key)
                d.edge(src, drawn[id(n)], label=escape(format_shape(t.shape)))


def build_dot(a: Analysis, view: str = "before", focus: str | None = None, hops: int = 2,
              collapse: int = 0, mode: str = "inference") -> tuple[str, int]:
    """The DOT source of a view and the number of nodes it draws."""
    if view not in VIEWS:
        raise FuseError(f"unknown view {view!r}; choose one of {', '.join(VIEWS)}")
    nodes = focus_nodes(a, focus, hops) if focus else None
    fused = choose_fused(a.matches, mode) if view == "after" else []
    if nodes is not None:
        fused = [m for m in fused if all(id(n) in nodes for n in m.nodes)]
    sel = Selection(nodes, fused)
    title = f"{os.path.basename(os.path.normpath(a.path))}: {view}" \
        + (f", fused for {mode}" if view == "after" else "") \
        + (f" (focus {focus}, {hops} hops)" if focus else "")
    d = _Drawer(title)
    drawn = _forward(d, a, sel, collapse)
    _forward_edges(d, a, sel, drawn)
    if view == "backward":
        _backward(d, a, sel, drawn)
    if view == "after":
        _legend(d)
    if len(d.ids) > BIG_GRAPH_NODES:  # spline routing dominates dot's time on big graphs
        d.dot.graph_attr.update(splines="line", mclimit="0.1", nslimit="1")
    return d.dot.source, len(d.ids)


def _legend(d: _Drawer) -> None:
    with d.dot.subgraph(name="cluster_legend") as s:
        s.attr(label="verdict", fontsize="10", color="#bbbbbb")
        for state, color in (("training-safe", COLORS["training"]), ("inference only", COLORS["inference"]),
                             ("not fusable", COLORS["none"])):
            s.node(f"legend_{state}", state, shape="box", style="rounded,filled", color=color,
                   fillcolor=color + "33", fontsize="9")


def _backward(d: _Drawer, a: Analysis, sel: Selection, drawn: dict[int, str]) -> None:
    """Backward ops, gradient edges between them, and saved tensors as red/grey edges with bytes."""
    joint, live = a.joint, a.liveness
    blocking = {b.tensor.name for m in a.matches for b in m.verdict.blocking}
    forward_ids = {n.name: id(n) for n in a.graph.nodes}
    in_view = None if sel.nodes is None else {n.name for n in a.graph.nodes if id(n) in sel.nodes}
    back = [n for n in joint.backward_nodes() if in_view is None or n.meta.get("forward") in in_view]
    bids = {}
    for n in back:
        bids[id(n)] = d.node(id(n), _label(n.op_type, n.name), **BACKWARD_STYLE)
    for n in back:
        for t in n.inputs:
            if t is None or t.producer is None or t.producer.phase != "backward":
                continue
            if id(t.producer) in bids:
                d.edge(bids[id(t.producer)], bids[id(n)], color="#b9770e", style="dashed")
    small = len(drawn) <= PARAMS_DRAWN_UP_TO
    for s in live.saved:
        t = s.tensor
        readers = [n for n in s.needed_by if id(n) in bids]
        if not readers or (t.kind in ("parameter", "constant") and not small):
            continue
        if t.producer is not None and forward_ids.get(t.producer.name) in drawn:
            src = drawn[forward_ids[t.producer.name]]
        elif t.kind in ("input", "parameter") or t.producer is not None:
            src = _leaf(d, a.graph.tensors.get(t.name, t))
        else:
            continue
        blocks = t.name in blocking
        for r in readers:
            d.edge(src, bids[id(r)], label=escape(f"{t.name} {format_bytes(s.bytes)}"
                                                  + (" (shape)" if s.reads == "shape" else "")),
                   color=COLORS["none"] if blocks else "#4a6fa5",
                   penwidth="2.5" if blocks else "1.2", fontcolor=COLORS["none"] if blocks else "#333333",
                   constraint="false")


FORMATS = ("svg", "png", "pdf", "dot")
DOT_TIMEOUT_S = 300


def output_format(path: str) -> str:
    fmt = path.rsplit(".", 1)[-1].lower() if "." in path else ""
    if fmt not in FORMATS:
        raise FuseError(f"{path}: the output must end in one of .{', .'.join(FORMATS)}")
    return fmt


def run_dot(source: str, fmt: str) -> bytes:
    """Lay out and draw with Graphviz's ``dot`` program; a clear error when it is missing."""
    import shutil
    import subprocess

    exe = shutil.which("dot")
    if exe is None:
        raise FuseError("Graphviz's dot program is not installed (Debian/Ubuntu: apt-get install graphviz; "
                        "macOS: brew install graphviz; conda: conda install graphviz); "
                        "--dot still writes the DOT source")
    try:
        done = subprocess.run([exe, f"-T{fmt}"], input=source.encode(), capture_output=True,
                              timeout=DOT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise FuseError(f"dot did not finish in {DOT_TIMEOUT_S} s; draw less with --focus, or use --dot") \
            from None
    if done.returncode != 0:
        first = (done.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[0]
        raise FuseError(f"dot failed: {first}")
    return done.stdout
