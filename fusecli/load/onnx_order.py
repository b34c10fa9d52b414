"""An ONNX graph's nodes in an order ONNX accepts: each after the nodes making what it reads.

ONNX Runtime loads a graph whose nodes are listed out of order; onnx's checker and a walk that assumes the
file's order do not. What edits a ModelProto (rewrite, prune, annotate) sorts it first: a stable
topological sort (Kahn's algorithm, ties by position), so a file already in order stays as it is. A cycle,
or a node input nothing makes, is refused in one line.

What analyzes one reads its nodes in the canonical order instead (``canonical``): a topological order
decided by the graph alone, so that two files listing the same nodes in different orders are read alike.
"""

from __future__ import annotations

import onnx

from ..core.errors import FuseError
from ..core.ir import kahn_order

_SUBGRAPH = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
Reads = list[tuple[str, ...]]  # per node, the names it reads (``reads``)


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """The names a node's subgraphs (If, Loop, Scan) read from the outer graphs: what they read and do
    not make themselves."""
    names: set[str] = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else \
            list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []
        for sub in graphs:
            names |= _outer_reads(sub)
    return names


def _outer_reads(graph: onnx.GraphProto) -> set[str]:
    made = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    made |= {t.values.name for t in graph.sparse_initializer}
    made |= {o for n in graph.node for o in n.output if o}
    used = {i for n in graph.node for i in n.input if i} | {o.name for o in graph.output}
    for n in graph.node:
        used |= subgraph_reads(n)
    return used - made


def reads(node: onnx.NodeProto) -> tuple[str, ...]:
    """The names a node reads: its inputs and, for If/Loop/Scan, what its subgraphs read."""
    if not node.attribute or not any(a.type in _SUBGRAPH for a in node.attribute):
        return tuple(node.input)
    return (*node.input, *subgraph_reads(node))


def predecessors(nodes: list[onnx.NodeProto], read: Reads | None = None) -> list[dict[int, str]]:
    """For each node, the nodes making what it reads (``reads``, or ``read[k]`` when given), each with one
    name it reads."""
    read = [reads(n) for n in nodes] if read is None else read
    maker = _makers(nodes)
    return [{maker[i]: i for i in rs if i in maker and maker[i] != k} for k, rs in enumerate(read)]


def _makers(nodes: list[onnx.NodeProto]) -> dict[str, int]:
    return {o: k for k, n in enumerate(nodes) for o in n.output if o}


def topological(nodes: list[onnx.NodeProto], read: Reads | None = None) -> list[onnx.NodeProto]:
    """``nodes`` each after the nodes making what it reads, in the given order wherever it already is
    one; FuseError naming a node on a cycle. ``read``: each node's ``reads``, when the caller has them."""
    read = [reads(n) for n in nodes] if read is None else read
    maker = _makers(nodes)
    if all(maker.get(i, -1) < k for k, rs in enumerate(read) for i in rs if i):
        return list(nodes)  # already in order: the common case, one linear pass
    order = kahn_order([set(p) for p in predecessors(nodes, read)])
    if len(order) < len(nodes):
        placed = set(order)
        stuck = next(n for k, n in enumerate(nodes) if k not in placed)
        raise FuseError(f"the graph has a cycle (through node {stuck.name or stuck.op_type!r}); refused")
    return [nodes[k] for k in order]


def canonical(nodes: list[onnx.NodeProto], outputs: list[str]) -> list[int]:
    """Indices of ``nodes`` in an order decided by the graph, not by the list: depth first from the graph
    ``outputs`` in their order, each node after the makers of what it reads, the deepest maker first (the
    longest chain of makers behind it: a program computes a long branch, attention, before it computes
    the short one, the MLP, that it adds to it), equal depths in the order the node reads them (its
    inputs, then its subgraphs' reads by name); then the nodes no output needs, by their first output's
    name. The list's order never breaks a tie; on a cycle, an order of the nodes that is not topological
    (what reads it refuses it)."""
    maker, clash = _makers_by_graph(nodes)
    preds = [[maker[i] for i in _reads_in_order(n) if i in maker] for n in nodes]
    roots = [maker[name] for name in outputs if name in maker]
    first = _post_order(preds, roots, lambda left: sorted(left, key=lambda k: _key(nodes[k], clash)))
    depth = [0] * len(nodes)
    for k in first[0]:
        depth[k] = 1 + max((depth[p] for p in preds[k] if p != k), default=0)
    deepest_first = [ps if len(ps) < 2 else sorted(ps, key=lambda p: -depth[p]) for ps in preds]
    return _post_order(deepest_first, roots, lambda left: first[1])[0]


def _post_order(preds: list[list[int]], roots: list[int], then) -> tuple[list[int], list[int]]:
    """Indices in post-order, depth first from ``roots`` over ``preds`` (with a stack: graphs are deeper
    than the recursion limit), then from ``then(the indices not reached)``; and those second roots."""
    entered = [False] * len(preds)
    order: list[int] = []

    def visit(root: int) -> None:
        if entered[root]:
            return
        entered[root] = True
        stack = [(root, 0)]
        while stack:
            k, i = stack[-1]
            ps = preds[k]
            while i < len(ps) and entered[ps[i]]:
                i += 1
            if i < len(ps):
                stack[-1] = (k, i + 1)
                entered[ps[i]] = True
                stack.append((ps[i], 0))
            else:
                stack.pop()
                order.append(k)

    for k in roots:
        visit(k)
    left = then([k for k in range(len(preds)) if not entered[k]]) if len(order) < len(preds) else []
    for k in left:
        visit(k)
    return order, left


def _makers_by_graph(nodes: list[onnx.NodeProto]) -> tuple[dict[str, int], bool]:
    """``_makers``, and whether a name is made twice (a graph refused later); then the maker of such a
    name is the one whose whole node sorts last, whatever the list's order."""
    maker = _makers(nodes)
    if sum(1 for n in nodes for o in n.output if o) == len(maker):
        return maker, False
    maker = {}
    for k in sorted(range(len(nodes)), key=lambda k: _key(nodes[k], True)):
        for o in nodes[k].output:
            if o:
                maker[o] = k
    return maker, True


def _reads_in_order(node: onnx.NodeProto) -> tuple[str, ...]:
    """``reads``, its subgraphs' part sorted by name (a set's order changes from run to run)."""
    if not node.attribute or not any(a.type in _SUBGRAPH for a in node.attribute):
        return tuple(node.input)
    return (*node.input, *sorted(subgraph_reads(node)))


def _key(node: onnx.NodeProto, whole: bool = False) -> tuple[str, bytes]:
    """What places a node no graph output needs: its first output's name (each name is made once, unless
    ``whole``), then the whole node."""
    first = next((o for o in node.output if o), None)
    if first is not None and not whole:
        return first, b""
    return first or "", node.SerializeToString(deterministic=True)


def canonicalize(graph: onnx.GraphProto) -> bool:
    """Put the graph's nodes in the canonical order (``canonical``), in place; whether the order changed."""
    nodes = list(graph.node)  # hold the wrappers: the sorted list keeps them
    order = canonical(nodes, [o.name for o in graph.output])
    if order == list(range(len(nodes))):
        return False
    replace(graph.node, [nodes[k] for k in order])
    return True


def undefined_input(graph: onnx.GraphProto, read: Reads | None = None) -> str | None:
    """The first node input that no node, initializer or graph input makes, as a sentence; else None."""
    nodes = list(graph.node)
    read = [tuple(n.input) for n in nodes] if read is None else read
    made = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    made |= {t.values.name for t in graph.sparse_initializer}
    made |= _makers(nodes).keys()
    for n, rs in zip(nodes, read, strict=True):
        missing = next((i for i in rs[:len(n.input)] if i and i not in made), None)
        if missing is not None:
            return (f"node {n.name or n.op_type!r} reads {missing!r}, which no node, initializer or graph "
                    "input makes")
    return None


def sort_graph(graph: onnx.GraphProto) -> bool:
    """Check the graph (FuseError for an undefined input or a cycle) and put its nodes in topological order
    in place; whether the order changed."""
    nodes = list(graph.node)  # hold the wrappers: the sorted list keeps them
    read = [reads(n) for n in nodes]
    problem = undefined_input(graph, read)
    if problem is not None:
        raise FuseError(f"{problem}; refused")
    ordered = topological(nodes, read)
    if all(a is b for a, b in zip(ordered, nodes, strict=True)):
        return False
    replace(graph.node, ordered)
    return True


def replace(field, items: list) -> None:
    """Set a repeated message field to ``items`` (references stay valid under upb; extend copies)."""
    items = list(items)
    del field[:]
    field.extend(items)
