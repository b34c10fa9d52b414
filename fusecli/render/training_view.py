"""The fused-training view: the seed's Fig. 4 for any model.

Forward ops with every training-usable match (training-safe, or training-safe if recomputed) drawn as
one fused node, backward ops with every backward match (ReluGrad + BatchNormGrad, ...) drawn as one
fused node, and only the tensors that cross between the two: each saved tensor a note with its name and
bytes, between the op that makes it (or a leaf: input, parameter) and the backward ops that read it;
tensors a fused backward recomputes instead of keeping drawn dashed; gradients that leave a fused
backward node labelled d<tensor> with their bytes.
"""

from __future__ import annotations

from ..core.units import format_bytes, format_shape
from ..fusion.match import Match
from ..fusion.select import select
from ..pipeline import Analysis
from .kit import (
    BACKWARD_STYLE,
    COLORS,
    FORWARD_STYLE,
    LEAF_STYLE,
    SAVED_STYLE,
    Drawer,
    dot_label,
    escape,
    node_label,
    saved_node,
    state_text,
)

RECOMPUTE_COLOR = "#1f77b4"


def _training_matches(a: Analysis) -> tuple[list[Match], list[Match]]:
    """Non-overlapping forward matches usable in training, chosen as `fusecli rewrite` chooses
    (fusion.select) once those whose backward is fused too are taken first, and the backward matches."""
    position = {id(m): i for i, m in enumerate(a.matches)}  # backward matches: in the catalogue's order
    back = select(a.matches, lambda m: m.pattern.phase == "backward", first=lambda m: position[id(m)])
    paired = {n.meta.get("forward") for m in back for n in m.nodes}  # forward ops of a fused backward
    chosen = select(a.matches, lambda m: m.pattern.phase == "forward"
                    and (m.verdict.training_safe or m.verdict.recompute is not None),
                    first=lambda m: -sum(n.name in paired for n in m.nodes))
    return chosen, back


def _in_view(fused: list[Match], nodes: set[int] | None) -> set[int] | None:
    """--focus: the focused forward nodes, with every fused match that reaches into them drawn whole."""
    if nodes is None:
        return None
    nodes = set(nodes)
    for m in fused:
        ids = {id(n) for n in m.nodes}
        if ids & nodes:
            nodes |= ids
    return nodes


def _entering(d: Drawer, t) -> str:
    """A leaf for a tensor drawn without its maker: a graph input, or one entering a focused drawing."""
    def label() -> str:
        return dot_label(d.short(t.name), f"{t.kind} {format_shape(t.shape)}")

    return d.node(hash(("tensor", t.name)), label, tooltip=escape(t.name), **LEAF_STYLE)


def draw_fused_training(d: Drawer, a: Analysis, nodes, o) -> None:
    """render.VIEWS entry: the forward and backward graphs fused for training (``nodes``: --focus, the
    forward nodes to draw; the backward ops of those, and the tensors that cross between them)."""
    fused, back_fused = _training_matches(a)
    nodes = _in_view(fused, nodes)
    fwd: dict[int, str] = {}
    of_match = {id(n): m for m in fused for n in m.nodes}
    forward = [n for n in a.graph.forward_nodes() if not n.meta.get("constant")
               and (nodes is None or id(n) in nodes)]
    for n in forward:
        m = of_match.get(id(n))
        if m is None:
            fwd[id(n)] = d.node(id(n), lambda n=n: node_label(d, n), tooltip=escape(n.name), **FORWARD_STYLE)
            continue
        v = m.verdict
        color = COLORS["training"] if v.training_safe else RECOMPUTE_COLOR
        fwd[id(n)] = d.node(id(m), lambda m=m: dot_label(" + ".join(x.op_type for x in m.nodes),
                                                      f"({m.pattern.name})", *state_text(m).split("\n")),
                            shape="box", style="rounded,filled,bold", color=color, fillcolor=color + "33",
                            penwidth="2", tooltip=escape(" > ".join(x.name for x in m.nodes)))
    for n in forward:
        for t in n.inputs:
            if t is None:
                continue
            p = d.drawn_as(t.producer)
            if p is not None and id(p) in fwd:
                if fwd[id(p)] != fwd[id(n)]:
                    d.edge(fwd[id(p)], fwd[id(n)], label=escape(format_shape(t.shape)))
            elif d.enters(t):
                d.edge(_entering(d, t), fwd[id(n)])
    in_view = None if not d.focused else {n.name for n in a.graph.nodes if id(n) in nodes}
    bwd: dict[int, str] = {}
    of_back = {id(n): m for m in back_fused for n in m.nodes}
    for n in a.joint.backward_nodes():
        if not d.shows_backward(n) or (in_view is not None and n.meta.get("forward") not in in_view):
            continue
        m = of_back.get(id(n))
        if m is not None:
            bwd[id(n)] = d.node(id(m), lambda m=m: dot_label(" + ".join(x.op_type for x in m.nodes),
                                                          f"({m.pattern.name})", "fused backward"),
                                tooltip=escape(" > ".join(x.name for x in m.nodes)),
                                **{**BACKWARD_STYLE, "penwidth": "2"})
        else:
            bwd[id(n)] = d.node(id(n), lambda n=n: dot_label(n.op_type, d.short(n.meta.get("forward", ""))),
                                tooltip=escape(n.name), **BACKWARD_STYLE)
    forward_by_name = {n.name: n for n in a.graph.nodes}
    for n in a.joint.backward_nodes():
        if id(n) not in bwd:
            continue
        for t in n.inputs:
            p = d.drawn_as(t.producer) if t is not None else None
            if p is None or p.phase != "backward" or id(p) not in bwd or bwd[id(p)] == bwd[id(n)]:
                continue
            label = ""
            if id(p) in of_back:  # a gradient leaving a fused backward: d<forward output of the reader>
                f = forward_by_name.get(n.meta.get("forward", ""))
                out = f.outputs[0] if f is not None and f.outputs else None
                size = t.nbytes(a.sizes)
                label = f"d{out.name if out is not None else t.name} " \
                    + (format_bytes(size) if size is not None else "? B")
            d.edge(bwd[id(p)], bwd[id(n)], label=escape(label), color="#b9770e", style="dashed")
    recomputed = {name for m in fused if m.verdict.recompute for name in m.verdict.recompute.tensors}
    for s in a.liveness.saved:
        t = s.tensor
        readers = {bwd[id(r)] for r in s.needed_by if id(r) in bwd}
        if not readers:
            continue
        f = d.drawn_as(forward_by_name.get(t.producer.name)) if t.producer is not None else None
        if f is not None and id(f) in fwd:
            src = fwd[id(f)]
        elif t.producer is not None and t.producer.name in d.hidden_names:
            continue  # made by hidden shape plumbing or a folded instance
        else:
            src = _entering(d, t)
        dashed = t.name in recomputed
        size = format_bytes(s.bytes) if s.bytes is not None else "? B"  # None: an unknown size
        colour, style = (RECOMPUTE_COLOR, "dashed") if dashed else ("#4a6fa5", "solid")
        saved = saved_node(d, t, size + (" (recomputed)" if dashed else ""), colour, style=style)
        d.edge(src, saved, color=colour, style=style, arrowhead="none", constraint="false")
        for r in sorted(readers):
            d.edge(saved, r, color=colour, style=style, penwidth="1.2" if dashed else "2", constraint="false")
    fused_style = {"shape": "box", "style": "rounded,filled"}
    d.legend([("forward op", FORWARD_STYLE), ("backward op", BACKWARD_STYLE),
              ("fused, training-safe", {**fused_style, "color": COLORS["training"],
                                        "fillcolor": COLORS["training"] + "33"}),
              ("fused, training-safe\nif recomputed", {**fused_style, "color": RECOMPUTE_COLOR,
                                                       "fillcolor": RECOMPUTE_COLOR + "33"}),
              ("input / parameter", LEAF_STYLE),
              ("a tensor backward keeps, and its bytes", {**SAVED_STYLE, "color": "#4a6fa5",
                                                          "fontcolor": "#4a6fa5"}),
              ("dashed: recomputed instead", {**SAVED_STYLE, "color": RECOMPUTE_COLOR, "style": "dashed",
                                              "fontcolor": RECOMPUTE_COLOR})], "fused for training")
