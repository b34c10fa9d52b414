"""The DOT drawing kit every render view draws with: the Drawer (one graphviz.Digraph, ids never the model's
names), labels and escaping, the node styles, and a match's verdict as a colour and a label.
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.blocks import Folding
from ..core.ir import Node, Tensor
from ..core.names import cut, last_segments
from ..core.terminal import printable
from ..core.units import format_shape
from ..fusion.match import Match

LABEL_CHARS = 40  # a name in a label (its last scope segments)
TOOLTIP_CHARS = 4000  # dot refuses quoted strings over 16,384 characters (escaping may double them)
COLORS = {"training": "#2ca02c", "recompute": "#17becf", "inference": "#ff7f0e", "none": "#d62728"}
FORWARD_STYLE = {"shape": "box", "style": "rounded,filled", "fillcolor": "#e8f0fe", "color": "#4a6fa5"}
BACKWARD_STYLE = {"shape": "box", "style": "filled", "fillcolor": "#fdebd0", "color": "#b9770e"}
LEAF_STYLE = {"shape": "ellipse", "style": "filled", "fillcolor": "#f2f2f2", "color": "#888888",
              "fontsize": "10"}
SAVED_STYLE = {"shape": "note", "fontsize": "9", "margin": "0.05,0.02", "height": "0.3"}  # a saved tensor
SCOPE_STYLE = {"shape": "box3d", "style": "filled", "fillcolor": "#eeeeee"}


def escape(text: str, limit: int = TOOLTIP_CHARS) -> str:
    """Text safe inside a quoted DOT string: cut to ``limit``, one line, control characters shown as escapes,
    backslashes doubled, quotes escaped."""
    text = printable(cut(text, limit).replace("\n", " ").replace("\r", " "))
    return text.replace("\\", "\\\\").replace('"', '\\"')


def dot_label(*lines: str) -> str:
    return "\\n".join(escape(line, 200) for line in lines if line)


STATE_TEXT = {"training": "training-safe", "recompute": "training-safe if recomputed",
              "inference": "inference only", "none": "not fusable"}  # colour key -> its rung of LADDER
_STATE_KEY = {text: key for key, text in STATE_TEXT.items()}


def verdict_state(m: Match) -> str:
    """'training', 'recompute' (training-safe if recomputed), 'inference' or 'none' (not fusable): the
    verdict's rung (``Verdict.state``) as a colour key."""
    return _STATE_KEY[m.verdict.state]


def state_text(m: Match) -> str:
    """The verdict as a label: a recompute that keeps as much as it frees says it frees nothing."""
    rc = m.verdict.recompute
    return m.verdict.state + (",\nfrees nothing" if rc is not None and rc.frees_nothing else "")


class Drawer:
    """Builds one graphviz.Digraph; node ids are n<k>, never the model's names. ``dry``: only count."""

    def __init__(self, title: str, prefix: str, dry: bool = False) -> None:
        self.ids: dict[object, str] = {}
        self.prefix, self.dry = prefix, dry
        self.mode = "inference"  # the --mode a view draws for (the after view's kernel labels)
        self.focused = False  # --focus: tensors from ops not drawn enter as leaves
        self.hidden: set[int] = set()  # ids of ops not drawn: shape plumbing, folded instances
        self.hidden_names: set[str] = set()  # names of the hidden forward ops (their backward ops hide)
        self.folding = Folding()
        self.dot = None
        if dry:
            return
        import graphviz

        self.dot = graphviz.Digraph("fusecli", graph_attr={
            "rankdir": "TB", "fontname": "Helvetica", "label": escape(title), "labelloc": "t",
            "fontsize": "12"}, node_attr={"fontname": "Helvetica", "fontsize": "10"},
            edge_attr={"fontname": "Helvetica", "fontsize": "9", "color": "#666666"})

    def node(self, key: object, label: Callable[[], str], **attrs) -> str:
        if key not in self.ids:
            self.ids[key] = f"n{len(self.ids)}"
            if not self.dry:
                self.dot.node(self.ids[key], label(), **attrs)
        return self.ids[key]

    def drawn_as(self, node: Node | None) -> Node | None:
        """The op drawn in a node's place: itself, the first instance's op for a folded one; None when
        there is no node or it is hidden."""
        if node is None:
            return None
        node = self.folding.stand_in.get(id(node), node)
        return None if id(node) in self.hidden else node

    def enters(self, t: Tensor) -> bool:
        """A tensor drawn as a leaf: a graph input, or one entering a focused drawing from an op not
        drawn there (not from hidden shape plumbing or a folded instance)."""
        p = t.producer
        return t.kind == "input" or (self.focused and p is not None and not p.meta.get("constant")
                                     and id(p) not in self.hidden)

    def shows_backward(self, n: Node) -> bool:
        """A backward op not folded away whose forward op is drawn (or that has none)."""
        forward = self.folding.anchor.get(id(n), n.meta.get("forward"))
        return id(n) not in self.hidden and id(n) not in self.folding.stand_in \
            and forward not in self.hidden_names

    def edge(self, a: str, b: str, **attrs) -> None:
        if not self.dry:
            self.dot.edge(a, b, **attrs)

    def same_rank(self, groups: dict[str, list[str]]) -> None:
        """Draw each key's nodes on the rank of the key."""
        if self.dry:
            return
        for key, ids in groups.items():
            self.dot.body.append("\t{rank=same; " + "; ".join([key, *ids]) + "}\n")

    def short(self, name: str) -> str:
        return last_segments(name, self.prefix, limit=LABEL_CHARS)

    def legend(self, items: list[tuple[str, dict]], title: str = "legend") -> None:
        if self.dry:
            return
        with self.dot.subgraph(name="cluster_legend") as s:
            s.attr(label=title, fontsize="10", color="#bbbbbb")
            for k, (text, attrs) in enumerate(items):
                s.node(f"legend_{k}", dot_label(*text.split("\n")), **{"fontsize": "9", **attrs})


def node_label(d: Drawer, n: Node) -> str:
    out = n.outputs[0] if n.outputs and n.outputs[0] is not None else None
    shape = cut(f"{format_shape(out.shape)} {out.dtype}", LABEL_CHARS) if out is not None else ""
    return dot_label(n.op_type, d.short(n.name), shape)


def saved_node(d: Drawer, t: Tensor, size: str, colour: str, **attrs) -> str:
    """A saved tensor drawn once, between its maker and its readers: its name and bytes as a node, so the
    text takes its own place in the layout (edge labels are placed after routing and other edges cross
    them)."""
    return d.node(("saved", t.name), lambda: dot_label(d.short(t.name), size), tooltip=escape(t.name),
                  **{**SAVED_STYLE, "color": colour, "fontcolor": colour, **attrs})
