"""What a view leaves out, and the cluster round each folded block.

``hide``: shape plumbing (shape_ops.py) unless ``--shape-ops``; past FOLD_ABOVE ops, and without
``--focus`` or ``--unfold``, every repeated block but its first instance (core/blocks.py).
``draw_clusters``: one box group per folded block, labelled "h.* x80 (0…79)", with what backward keeps
of each instance in the views that show memory.
"""

from __future__ import annotations

from ..core.blocks import fold_backward, fold_blocks
from ..core.terminal import printable
from ..core.units import format_bytes
from .shape_ops import shape_only

FOLD_ABOVE = 100  # ops left once shape plumbing is hidden, past which repeated blocks fold
FOLD_STYLE = {"style": "rounded,dashed", "color": "#7f7f7f", "fontsize": "11", "labeljust": "l"}


def hide(d, a, o, nodes: set[int] | None) -> set[int] | None:
    """Fill the drawer's hidden ops and folding; the forward ops a view draws (None: all of them)."""
    forward = [n for n in a.graph.forward_nodes() if not n.meta.get("constant")]
    hidden = set() if o.shape_ops else shape_only(forward, a.graph.outputs)
    left = [n for n in forward if id(n) not in hidden]
    if not o.unfold and nodes is None and len(left) > FOLD_ABOVE:
        d.folding = fold_blocks(left)
        fold_backward(list(a.joint.backward_nodes()), d.folding)
        hidden |= set(d.folding.stand_in)
    if not hidden:
        return nodes
    d.hidden = hidden
    d.hidden_names = {n.name for n in forward if id(n) in hidden}
    return {id(n) for n in left if id(n) not in hidden and (nodes is None or id(n) in nodes)}


def _saved_per_instance(a, names: set[str]) -> int | None:
    """Bytes backward keeps of tensors an instance makes (None: a size is unknown)."""
    sizes = [s.bytes for s in a.liveness.saved if s.tensor.producer is not None
             and s.tensor.producer.name in names]
    return None if any(b is None for b in sizes) else sum(sizes)


def draw_clusters(d, a, memory: bool) -> None:
    """A dashed box group round each folded block's drawn ops (forward, backward and fused boxes)."""
    if d.dry or not d.folding.blocks:
        return
    home: dict[str, object] = {}  # node name -> its block
    for block in d.folding.blocks:
        for n in block.first:
            home[n.name] = block
    members: dict[int, list[str]] = {id(b): [] for b in d.folding.blocks}
    placed: set[str] = set()

    def place(key, names) -> None:
        drawn = d.ids.get(key)
        block = next((home[x] for x in names if x in home), None)
        if drawn is not None and block is not None and drawn not in placed:
            placed.add(drawn)
            members[id(block)].append(drawn)

    for n in (*a.graph.nodes, *a.joint.nodes):  # the forward graph's ops, then the joint graph's
        place(id(n), [n.name if n.phase == "forward" else n.meta.get("forward", "")])
    for m in a.matches:
        place(id(m), [x.name if x.phase == "forward" else x.meta.get("forward", "") for x in m.nodes])
    for k, block in enumerate(d.folding.blocks):
        if not members[id(block)]:
            continue
        label = _escape(block.title())
        if memory:
            saved = _saved_per_instance(a, {n.name for n in block.first})
            if saved is not None:
                label += f"\\nbackward keeps {format_bytes(saved)} per block, " \
                         f"{format_bytes(saved * block.count)} in all"
        attrs = "; ".join(f'{k2}="{v}"' for k2, v in FOLD_STYLE.items())
        body = "; ".join(members[id(block)])
        d.dot.body.append(f'\tsubgraph cluster_fold_{k} {{ label="{label}"; {attrs}; {body} }}\n')


def _escape(text: str) -> str:
    """Text safe inside a quoted DOT string, one line, control characters shown as escapes."""
    return printable(text.replace("\n", " ")).replace("\\", "\\\\").replace('"', '\\"')
