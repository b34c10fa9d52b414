"""DOT for the before / after / backward views (the seed posts' figures, for any model).

before: the forward op graph as in the model. after: each chosen fusion match drawn as one fused node,
coloured by verdict (``--mode training`` draws only what is safe for training). backward: forward and
backward ops side by side, each saved tensor a note with its name and bytes on the way from the op that
makes it to the backward ops that read it; tensors that block a training fusion in red.

Labels show the last scope segments of a name (the full name is the SVG tooltip), so a view's boxes
stay narrow on real models. Unless asked (``--shape-ops``, ``--unfold``), shape plumbing is hidden and,
past fold.FOLD_ABOVE ops, repeated blocks are drawn once in a cluster labelled "x80"
(core/blocks.py). ``count_nodes`` walks the same code without building any DOT, so a view too
big to lay out is refused in about the time of the analysis.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..core.errors import FuseError
from ..core.ir import Graph, Node, Tensor
from ..core.names import common_scope, cut
from ..core.units import format_bytes, format_shape
from ..fusion.emitted import emitted_kernel
from ..fusion.match import Match
from ..fusion.select import select
from ..pipeline import Analysis
from .fold import draw_clusters, hide
from .kit import (
    BACKWARD_STYLE,
    COLORS,
    FORWARD_STYLE,
    LABEL_CHARS,
    LEAF_STYLE,
    SAVED_STYLE,
    SCOPE_STYLE,
    STATE_TEXT,
    Drawer,
    dot_label,
    escape,
    node_label,
    saved_node,
    state_text,
    verdict_state,
)
from .training_view import draw_fused_training  # the seeds' Fig. 4 for any model

BIG_GRAPH_NODES = 150  # past this: straight edges, no shape labels on forward edges, cheaper layout
PARAMS_DRAWN_UP_TO = 12  # backward view: saved weights are drawn only for graphs this small
PNG_MAX_INCHES = 150  # PNG output is scaled to fit 150 x 150 in at 96 dpi (14,400 px)


class FocusError(FuseError):
    """A --focus value that names no node and no match (a usage error)."""


@dataclass
class RenderOptions:
    view: str = "after"
    focus: str | None = None
    hops: int = 2
    collapse: int = 0
    mode: str = "inference"
    fmt: str | None = None  # the output format: png gets a size cap
    unfold: bool = False  # draw every repeated block (no folding)
    shape_ops: bool = False  # draw the integer ops that only compute shapes


def choose_fused(matches: list[Match], mode: str = "inference") -> list[Match]:
    """The forward matches to draw fused, chosen as `fusecli rewrite` chooses (fusion.select), among those
    fusable in ``mode`` (training: the training-safe ones and those safe if recomputed)."""
    allowed = ("training", "recompute") if mode == "training" else ("training", "recompute", "inference")
    return select(matches, lambda m: m.pattern.phase == "forward" and verdict_state(m) in allowed)


def parse_focus(a: Analysis, focus: str) -> list[Node]:
    """The nodes a --focus value names: a node, or the K-th forward match of a pattern (FocusError)."""
    g = a.graph
    if g.has_node(focus):
        return [g.node(focus)]
    name, _, index = focus.rpartition(":") if ":" in focus else (focus, "", "0")
    found = [m for m in a.matches if m.pattern.name == name and m.pattern.phase == "forward"]
    forms = "give a node name, PATTERN (its first match) or PATTERN:K (K counts from 0)"
    if not found:
        have = sorted({m.pattern.name for m in a.matches if m.pattern.phase == "forward"})
        raise FocusError(f"--focus {focus!r}: no node or pattern of that name in the model; {forms}"
                         + (f"; patterns matched here: {', '.join(have)}" if have else ""))
    if not index.isdigit() or int(index) >= len(found):
        raise FocusError(f"--focus {focus!r}: {name} has {len(found)} forward matches, so K is 0 to "
                         f"{len(found) - 1}; {forms}")
    return found[int(index)].nodes


def focus_nodes(a: Analysis, focus: str, hops: int) -> set[int]:
    """Forward nodes within ``hops`` of a node name, or of a match (``pattern`` or ``pattern:k``)."""
    start = parse_focus(a, focus)
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


def scope_of(name: str, depth: int, prefix: str = "") -> str | None:
    """The first ``depth`` '/'-components of a name below ``prefix`` (the scope every name shares),
    or None when it has no deeper parts."""
    if prefix and name.startswith(prefix):
        name = name[len(prefix):]
    lead = "/" if name.startswith("/") else ""  # PyTorch's '/m/...' keeps its leading slash
    parts = [p for p in name.lstrip("/").split("/", depth) if p]
    return lead + "/".join(parts[:depth]) if depth > 0 and len(parts) > depth else None


def _drawable(g: Graph, nodes: set[int] | None) -> list[Node]:
    return [n for n in g.forward_nodes() if not n.meta.get("constant")
            and (nodes is None or id(n) in nodes)]


def _fused_label(d: Drawer, m: Match) -> str:
    scope = d.short(m.root.name.rsplit("/", 1)[0] if "/" in m.root.name else m.root.name)
    return dot_label(m.pattern.name, emitted_kernel(m, d.mode) or "", scope, *state_text(m).split("\n"))


def _forward(d: Drawer, a: Analysis, nodes: set[int] | None, fused: list[Match], collapse: int,
             rejected: list[Match] = ()) -> dict[int, str]:
    """Draw forward nodes (fused groups and collapsed scopes as one node); map node -> drawn id.
    ``rejected``: not-fusable matches, whose ops are drawn apart with a red dashed border."""
    fused_of = {id(n): m for m in fused for n in m.nodes}
    rejected_of = {id(n): m for m in rejected for n in m.nodes}
    drawn: dict[int, str] = {}
    if d.dry:  # count only: the same keys, no labels or attributes
        for n in _drawable(a.graph, nodes):
            m = fused_of.get(id(n))
            scope = scope_of(n.name, collapse, d.prefix) if collapse and m is None else None
            key = id(m) if m is not None else ("scope", scope) if scope is not None else id(n)
            drawn[id(n)] = d.node(key, str)
        return drawn
    for n in _drawable(a.graph, nodes):
        m = fused_of.get(id(n))
        if m is not None:
            color = COLORS[verdict_state(m)]
            drawn[id(n)] = d.node(id(m), lambda m=m: _fused_label(d, m), shape="box",
                                  style="rounded,filled,bold", color=color, fillcolor=color + "33",
                                  penwidth="2", tooltip=escape(" > ".join(x.name for x in m.nodes)
                                                               + ": " + m.verdict.reason))
            continue
        scope = scope_of(n.name, collapse, d.prefix) if collapse else None
        if scope is not None:
            drawn[id(n)] = d.node(("scope", scope),
                                  lambda s=scope: dot_label(cut(s, LABEL_CHARS) + "/…", "(collapsed scope)"),
                                  tooltip=escape(d.prefix + scope), **SCOPE_STYLE)
            continue
        style = dict(FORWARD_STYLE, tooltip=escape(n.name))
        r = rejected_of.get(id(n))
        if r is not None:
            style.update(color=COLORS["none"], style="rounded,filled,dashed", penwidth="2",
                         tooltip=escape(f"{n.name}: {r.pattern.name} {r.verdict.reason}"))
        drawn[id(n)] = d.node(id(n), lambda n=n: node_label(d, n), **style)
    return drawn


def _leaf(d: Drawer, t: Tensor) -> str:
    def label() -> str:
        return dot_label(d.short(t.name), f"{t.kind} {cut(format_shape(t.shape), LABEL_CHARS)}")

    return d.node(id(t), label, tooltip=escape(t.name), **LEAF_STYLE)


def _forward_edges(d: Drawer, a: Analysis, nodes: set[int] | None, drawn: dict[int, str]) -> None:
    seen = set()
    labelled = len(drawn) <= BIG_GRAPH_NODES
    for n in _drawable(a.graph, nodes):
        for t in n.inputs:
            if t is None:
                continue
            p = d.drawn_as(t.producer)
            if p is not None and id(p) in drawn:
                src = drawn[id(p)]
            elif d.enters(t):
                src = _leaf(d, t)  # graph inputs, and tensors entering a focused drawing
            else:
                continue  # parameters and constants are not drawn in the op graph
            if d.dry:
                continue
            dst = drawn[id(n)]
            key = (src, dst, t.name if labelled else None)  # big graphs: one edge per pair of boxes
            if src != dst and key not in seen:
                seen.add(key)
                if labelled:
                    d.edge(src, dst, label=escape(format_shape(t.shape), LABEL_CHARS), tooltip=escape(t.name))
                else:
                    d.edge(src, dst)


FORWARD_LEGEND = [("forward op", FORWARD_STYLE), ("input / tensor entering", LEAF_STYLE)]


def draw_before(d: Drawer, a: Analysis, nodes: set[int] | None, o: RenderOptions) -> None:
    drawn = _forward(d, a, nodes, [], o.collapse)
    _forward_edges(d, a, nodes, drawn)
    d.legend(FORWARD_LEGEND + ([("collapsed scope", SCOPE_STYLE)] if o.collapse else []))


def draw_after(d: Drawer, a: Analysis, nodes: set[int] | None, o: RenderOptions) -> None:
    fused = choose_fused(a.matches, o.mode)
    if nodes is not None:  # a match that reaches into the focus is drawn whole, as in the full view
        nodes = set(nodes)
        for m in fused:
            ids = {id(n) for n in m.nodes}
            if ids & nodes:
                nodes |= ids
    used = {id(n) for m in fused for n in m.nodes}
    rejected = [m for m in a.matches if m.pattern.phase == "forward" and verdict_state(m) == "none"
                and not any(id(n) in used for n in m.nodes)]
    drawn = _forward(d, a, nodes, fused, o.collapse, rejected)
    _forward_edges(d, a, nodes, drawn)
    shown = {verdict_state(m) for m in fused}
    items = [(f"fused: {STATE_TEXT[s]}", {"shape": "box", "style": "rounded,filled,bold", "color": COLORS[s],
                                           "fillcolor": COLORS[s] + "33"})
             for s in ("training", "recompute", "inference") if s in shown]
    if rejected:
        items.append(("not fusable (ops drawn apart)", dict(FORWARD_STYLE, color=COLORS["none"],
                                                            style="rounded,filled,dashed")))
    d.legend(items + FORWARD_LEGEND, f"fused for {o.mode}")


def draw_backward(d: Drawer, a: Analysis, nodes: set[int] | None, o: RenderOptions) -> None:
    """Backward ops, gradient edges between them, and saved tensors as red/blue edges with bytes."""
    drawn = _forward(d, a, nodes, [], o.collapse)
    _forward_edges(d, a, nodes, drawn)
    joint, live = a.joint, a.liveness
    blocking = {b.tensor.name for m in a.matches for b in m.verdict.blocking}
    forward_ids = {n.name: id(n) for n in a.graph.nodes}
    in_view = None if not d.focused else {n.name for n in a.graph.nodes if id(n) in nodes}
    back = [n for n in joint.backward_nodes() if d.shows_backward(n)
            and (in_view is None or n.meta.get("forward") in in_view)]
    bids = {}
    for n in back:
        bids[id(n)] = d.node(id(n), str) if d.dry else d.node(
            id(n), lambda n=n: dot_label(n.op_type, d.short(n.name)), tooltip=escape(n.name),
            **BACKWARD_STYLE)
    for n in back if not d.dry else ():
        for t in n.inputs:
            p = d.drawn_as(t.producer) if t is not None else None
            if p is not None and p.phase == "backward" and id(p) in bids and p is not n:
                d.edge(bids[id(p)], bids[id(n)], color="#b9770e", style="dashed")
    # each backward op on the rank of the forward op it differentiates: backward runs up beside forward,
    # and saved-tensor edges stay short (long edges make dot's layout slow on big graphs)
    beside: dict[str, list[str]] = {}
    for n in back:
        f = forward_ids.get(n.meta.get("forward"))
        if f in drawn:
            beside.setdefault(drawn[f], []).append(bids[id(n)])
    d.same_rank(beside)
    small = len(drawn) <= PARAMS_DRAWN_UP_TO
    for s in live.saved:
        t = s.tensor
        readers = [n for n in s.needed_by if id(n) in bids]
        if not readers or (t.kind in ("parameter", "constant") and not small):
            continue
        maker = d.drawn_as(a.graph.node(t.producer.name)) if t.producer is not None \
            and a.graph.has_node(t.producer.name) else None
        if maker is not None and id(maker) in drawn:
            src = drawn[id(maker)]
        elif t.producer is not None and t.producer.name in d.hidden_names:
            continue  # made by hidden shape plumbing or a folded instance
        elif t.kind in ("input", "parameter") or t.producer is not None:
            src = _leaf(d, a.graph.tensors.get(t.name, t))
        else:
            continue
        colour = COLORS["none"] if t.name in blocking else "#4a6fa5"
        saved = saved_node(d, t, format_bytes(s.bytes) + (" (shape)" if s.reads == "shape" else ""), colour)
        d.edge(src, saved, color=colour, arrowhead="none")
        for r in readers if not d.dry else ():
            d.edge(saved, bids[id(r)], color=colour, penwidth="2.5" if colour == COLORS["none"] else "1.2")
    d.legend(FORWARD_LEGEND + [
        ("backward op", BACKWARD_STYLE),
        ("saved tensor and its bytes, between\nits maker and the backward ops that read it",
         {**SAVED_STYLE, "color": "#4a6fa5", "fontcolor": "#4a6fa5"}),
        ("red: read from inside a fused kernel\n(blocks a training fusion)",
         {**SAVED_STYLE, "color": COLORS["none"], "fontcolor": COLORS["none"]})])


View = Callable[[Drawer, Analysis, "set[int] | None", RenderOptions], None]
MEMORY_VIEWS = ("backward", "fused-training")  # views whose folded blocks say what each keeps
VIEWS: dict[str, View] = {"before": draw_before, "after": draw_after, "backward": draw_backward,
                          "fused-training": draw_fused_training}


def _title(a: Analysis, o: RenderOptions) -> str:
    return f"{os.path.basename(os.path.normpath(a.path))}: {o.view}" \
        + (f", fused for {o.mode}" if o.view == "after" else "") \
        + (f" (focus {o.focus}, {o.hops} hops)" if o.focus else "")


def _draw(a: Analysis, o: RenderOptions, dry: bool) -> Drawer:
    if o.view not in VIEWS:
        raise FuseError(f"unknown view {o.view!r}; choose one of {', '.join(VIEWS)}")
    nodes = focus_nodes(a, o.focus, o.hops) if o.focus else None
    prefix = common_scope([n.name for n in a.graph.nodes if not n.meta.get("constant")])
    d = Drawer(_title(a, o), prefix, dry)
    d.mode, d.focused = o.mode, nodes is not None
    nodes = hide(d, a, o, nodes)
    VIEWS[o.view](d, a, nodes, o)
    draw_clusters(d, a, o.view in MEMORY_VIEWS)
    return d


def count_nodes(a: Analysis, options: RenderOptions) -> int:
    """How many nodes a view draws, without building any DOT (checked against --max-nodes first)."""
    return len(_draw(a, options, dry=True).ids)


def build_dot(a: Analysis, view: str = "before", focus: str | None = None, hops: int = 2,
              collapse: int = 0, mode: str = "inference", fmt: str | None = None, unfold: bool = False,
              shape_ops: bool = False) -> tuple[str, int]:
    """The DOT source of a view and the number of nodes it draws."""
    o = RenderOptions(view, focus, hops, collapse, mode, fmt, unfold, shape_ops)
    d = _draw(a, o, dry=False)
    count = len(d.ids)
    if count > BIG_GRAPH_NODES:  # spline routing and crossing minimisation dominate dot's time
        d.dot.graph_attr.update(splines="line", mclimit="0.1", nslimit="1", nslimit1="1",
                                searchsize="10", remincross="false")
    if fmt == "png":
        d.dot.graph_attr.update(size=f"{PNG_MAX_INCHES},{PNG_MAX_INCHES}", dpi="96")
    return d.dot.source, count


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
