"""The format-neutral graph IR: Graph, Node, Tensor.

A tensor knows its producer and its consumers; a node keeps the op type of its source format
(``Conv``, ``Conv2D``) and a canonical ``kind`` (``conv``) that rules and patterns are written against.
Passes annotate ``meta`` dicts instead of growing new fields.
"""

from __future__ import annotations

import gc
import heapq
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from .dims import dim_value
from .errors import FuseError

T = TypeVar("T")

TENSOR_KINDS = ("input", "parameter", "constant", "activation")
PHASES = ("forward", "backward")

Dim = int | str | None  # a static size, a symbolic name, or unknown

_DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint64": 8, "uint32": 4, "uint16": 2,
    "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16, "string": 8,
    "float8e4m3fn": 1, "float8e4m3fnuz": 1, "float8e5m2": 1, "float8e5m2fnuz": 1,
    "int4": 1, "uint4": 1, "resource": 0, "variant": 0,
}
FLOAT_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})
LOWER_FLOAT_DTYPES = frozenset({"float16", "bfloat16"})  # what autocast and a model cast compute in


def dtype_size(dtype: str) -> int:
    """Bytes per element of a dtype name (unknown dtypes count 4, the common case)."""
    return _DTYPE_BYTES.get(dtype, 4)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a big graph is built and walked.

    A graph is millions of small container objects held in cycles (tensor <-> producer); as it grows,
    the collector walks all of them again and again (a third of a 100k-node analysis) and frees
    nothing. Reference counting still frees as usual; cycles left behind are collected afterwards, by
    the next full collection.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            # everything made in the block is still in the youngest generation, where the next young
            # collection would walk it all; move it to the oldest at once (a list splice, no walk)
            gc.freeze()
            gc.unfreeze()
            gc.enable()


@dataclass(eq=False, slots=True)
class Tensor:
    """A value in the graph: one producer (None for inputs, parameters and constants)."""

    name: str
    dtype: str = "float32"
    shape: tuple[Dim, ...] | None = None
    kind: str = "activation"
    producer: Node | None = None
    consumers: list[Node] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.dtype}, {self.shape}, {self.kind})"

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    @property
    def shape_known(self) -> bool:
        """True when every dim is a number or a name (a rank and no unknown dims)."""
        return self.shape is not None and all(d is not None for d in self.shape)

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    def resolve_shape(self, dims: Mapping[str, int] | None = None) -> tuple[int, ...] | None:
        """Concrete dims at the named dims' values ``dims``; None when the rank or a dim is unknown."""
        if self.shape is None:
            return None
        out = []
        for d in self.shape:
            v = d if isinstance(d, int) else dim_value(d, dims or {})
            if v is None:
                return None
            out.append(v)
        return tuple(out)

    def nbytes(self, dims: Mapping[str, int] | None = None) -> int | None:
        """Size in bytes at the named dims' values ``dims`` (a ``Sizes``); None when the rank or a dim is
        unknown there: an unknown size is never taken as 1."""
        shape = self.shape
        if shape is None:
            return None
        memo = getattr(dims, "shape_bytes", None)  # a Sizes answers once per distinct shape
        if memo is not None:
            return memo(shape, self.dtype)
        return shape_bytes(shape, self.dtype, {} if dims is None else dims)


def shape_bytes(shape: tuple[Dim, ...], dtype: str, dims: Mapping[str, int]) -> int | None:
    """Bytes of a ``dtype`` tensor of ``shape`` at the named dims' values ``dims``; None when a dim is
    unknown there."""
    n = 1
    for d in shape:  # resolve_shape's rule, inline: called for every tensor
        if not isinstance(d, int):
            d = dim_value(d, dims)
            if d is None:
                return None
        n *= max(d, 0)
    return n * _DTYPE_BYTES.get(dtype, 4)


@dataclass(eq=False, slots=True)
class Node:
    """An op: source op type, canonical kind, ordered inputs and outputs (None = absent optional)."""

    name: str
    op_type: str
    kind: str
    inputs: list[Tensor | None] = field(default_factory=list)
    outputs: list[Tensor | None] = field(default_factory=list)
    attrs: dict = field(default_factory=dict)
    domain: str = ""
    phase: str = "forward"
    meta: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"Node({self.name!r}, {self.op_type}, kind={self.kind}, {self.phase})"

    def input(self, i: int) -> Tensor | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def output(self, i: int) -> Tensor | None:
        return self.outputs[i] if i < len(self.outputs) else None


def distinct(items: Iterable[T]) -> list[T]:
    """``items`` without repeats of the same object, first occurrences in their order."""
    return list({id(x): x for x in items}.values())


def redirect(readers: Iterable[Node], old: Tensor, new: Tensor) -> None:
    """``readers`` read ``new`` wherever they read ``old``; both tensors' consumer lists follow."""
    readers = distinct(readers)
    for r in readers:
        r.inputs = [new if u is old else u for u in r.inputs]
    moved = {id(r) for r in readers}
    old.consumers[:] = [c for c in old.consumers if id(c) not in moved]
    new.consumers.extend(readers)


def unique_name(base: str, taken) -> str:
    """``base`` if not in ``taken``, else ``base_1``, ``base_2``, ..."""
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    return name


class GraphError(FuseError):
    """The graph breaks an IR invariant (a cycle, a tensor made twice, a dangling reference)."""


class Graph:
    """Nodes in topological order plus the tensors they connect, indexed by name."""

    def __init__(self, name: str = "graph", fmt: str = "onnx") -> None:
        self.name = name
        self.format = fmt
        self.nodes: list[Node] = []
        self.tensors: dict[str, Tensor] = {}
        self.inputs: list[Tensor] = []
        self.outputs: list[Tensor] = []
        self.meta: dict = {}
        self._node_names: dict[str, Node] = {}
        self._suffixes: dict[str, int] = {}  # unique_node_name: the last suffix handed out per base

    # -- building -------------------------------------------------------------------------------
    def tensor(self, name: str, **fields) -> Tensor:
        """The tensor of that name, made on first use; ``fields`` fill in a new tensor only."""
        t = self.tensors.get(name)
        if t is None:
            t = self.tensors[name] = Tensor(name, **fields)
        return t

    def add_node(self, node: Node) -> Node:
        """Append a node (callers add in topological order) and link its tensors both ways."""
        name, names = node.name, self._node_names
        if name in names:
            raise GraphError(f"duplicate node name {name!r}")
        names[name] = node
        for t in node.inputs:
            if t is not None:
                t.consumers.append(node)
        for t in node.outputs:
            if t is None:
                continue
            if t.producer is not None:
                raise GraphError(f"tensor {t.name!r} is produced by both {t.producer.name!r} "
                                 f"and {node.name!r}")
            t.producer = node
        self.nodes.append(node)
        return node

    def unique_node_name(self, base: str) -> str:
        """``unique_name(base, node names)``, in constant time when many nodes share a base name."""
        if base not in self._node_names:
            return base
        # node names are never given back, so the suffixes below the last one handed out stay taken
        i = self._suffixes.get(base, 1)
        name = f"{base}_{i}"
        while name in self._node_names:
            i += 1
            name = f"{base}_{i}"
        self._suffixes[base] = i
        return name

    def node(self, name: str) -> Node:
        return self._node_names[name]

    def has_node(self, name: str) -> bool:
        return name in self._node_names

    def copy(self) -> Graph:
        """A copy with new Node and Tensor objects (meta dicts copied shallowly); linear time."""
        g = Graph(self.name, self.format)
        g.meta = dict(self.meta)
        m = g.tensors
        for t in self.tensors.values():
            m[t.name] = Tensor(t.name, t.dtype, t.shape, t.kind, None, [], dict(t.meta))
        names, nodes = g._node_names, g.nodes
        for n in self.nodes:
            ins = [None if t is None else m[t.name] for t in n.inputs]
            outs = [None if t is None else m[t.name] for t in n.outputs]
            node = Node(n.name, n.op_type, n.kind, ins, outs, n.attrs, n.domain, n.phase, dict(n.meta))
            # add_node, inline (called once per node): its checks, its links, its append
            if node.name in names:
                raise GraphError(f"duplicate node name {node.name!r}")
            names[node.name] = node
            for t in ins:
                if t is not None:
                    t.consumers.append(node)
            for t in outs:
                if t is not None:
                    if t.producer is not None:
                        raise GraphError(f"tensor {t.name!r} is produced by both {t.producer.name!r} "
                                         f"and {node.name!r}")
                    t.producer = node
            nodes.append(node)
        g.inputs = [m[t.name] for t in self.inputs]
        g.outputs = [m[t.name] for t in self.outputs]
        return g

    # -- views ----------------------------------------------------------------------------------
    def forward_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.phase == "forward"]

    def backward_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.phase == "backward"]

    def op_counts(self, nodes: Iterable[Node] | None = None) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes if nodes is None else nodes:
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
        return counts

    # -- invariants -----------------------------------------------------------------------------
    def lint(self) -> None:
        """Check every IR invariant; raise GraphError naming the first one broken."""
        tensors = self.tensors
        for t in tensors.values():
            if t.kind not in TENSOR_KINDS:
                raise GraphError(f"tensor {t.name!r} has unknown kind {t.kind!r}")
        seen_nodes = self._lint_nodes()
        input_ids: dict[int, set[int]] = {}  # long input lists, as _lint_nodes' consumer lists
        for t in tensors.values():
            producer = t.producer
            if producer is not None and producer not in seen_nodes:
                raise GraphError(f"{t.name!r} names a producer that is not in the graph")
            for c in t.consumers:
                inputs = c.inputs
                if c not in seen_nodes or not (t in inputs if len(inputs) <= _SHORT
                                               else _lists(inputs, t, input_ids, id(c))):
                    raise GraphError(f"{t.name!r} lists consumer {c.name!r} that does not read it")
            # an activation has a producer, but one eager makes from a parameter at every step that the
            # exporter folded into an initializer (grad.storage.made_each_step)
            if producer is None and t.kind == "activation" and "from_parameter" not in t.meta:
                raise GraphError(f"activation {t.name!r} has no producer")
        for t in self.outputs:
            if tensors.get(t.name) is not t:
                raise GraphError(f"graph output {t.name!r} is not in the graph")

    def _lint_nodes(self) -> set[Node]:
        """``lint``'s walk of the nodes in order: names, phases, the tensors each reads (in the graph, made
        before it, listing it as a consumer) and makes; returns the nodes. Node and Tensor hash by
        identity (eq=False), so sets hold them as they are."""
        tensors = self.tensors
        seen_nodes: set[Node] = set()
        # the tensors in the graph (under their own name) made so far: those without a producer, then
        # each node's outputs
        defined: set[Tensor] = {t for name, t in tensors.items() if t.producer is None and name == t.name}
        names = set()
        # long consumer lists are looked up through id sets, so that a tensor read by thousands of
        # nodes costs linear time, not quadratic
        consumer_ids: dict[int, set[int]] = {}
        for node in self.nodes:
            if node.name in names:
                raise GraphError(f"duplicate node name {node.name!r}")
            names.add(node.name)
            if node.phase not in PHASES:
                raise GraphError(f"node {node.name!r} has unknown phase {node.phase!r}")
            for t in node.inputs:
                if t is None:
                    continue
                if t not in defined:
                    if tensors.get(t.name) is not t:
                        raise GraphError(f"node {node.name!r} reads {t.name!r}, not in the graph")
                    raise GraphError(f"node {node.name!r} reads {t.name!r} before it is made "
                                     "(not topological)")
                consumers = t.consumers
                if not (node in consumers if len(consumers) <= _SHORT  # identity: eq=False
                        else _lists(consumers, node, consumer_ids, id(t))):
                    raise GraphError(f"{t.name!r} does not list its consumer {node.name!r}")
            for t in node.outputs:
                if t is None:
                    continue
                if tensors.get(t.name) is not t:
                    raise GraphError(f"node {node.name!r} makes {t.name!r}, not in the graph")
                if t.producer is not node:
                    raise GraphError(f"{t.name!r} does not name {node.name!r} as its producer")
                if t.kind == "input":
                    raise GraphError(f"input {t.name!r} has a producer {node.name!r}")
                defined.add(t)
            seen_nodes.add(node)
        return seen_nodes


_SHORT = 8


def _lists(items: list, x: object, cache: dict[int, set[int]], key: int) -> bool:
    """Whether ``x`` is (identically) in the long list ``items``, through a set of ids kept in ``cache``."""
    ids = cache.get(key)
    if ids is None:
        ids = cache[key] = {id(i) for i in items if i is not None}
    return id(x) in ids


def topological_order(nodes: list[Node]) -> list[Node]:
    """Kahn's algorithm over producer links, stable for nodes already in order; GraphError on a cycle."""
    index = {n: i for i, n in enumerate(nodes)}  # Node hashes by identity (eq=False)
    if len(index) == len(nodes) and _in_order(nodes, index):
        return list(nodes)  # what Kahn's algorithm below returns for nodes already in order
    preds = [{index[t.producer] for t in n.inputs
              if t is not None and t.producer is not None and t.producer in index} for n in nodes]
    order = kahn_order(preds)
    if len(order) != len(nodes):
        placed = set(order)
        stuck = next(n.name for i, n in enumerate(nodes) if i not in placed)
        raise GraphError(f"the graph has a cycle (through node {stuck!r})")
    return [nodes[i] for i in order]


def kahn_order(preds: list[set[int]]) -> list[int]:
    """Indices 0..n-1, each after its predecessors ``preds[i]``, ties by index so that an order which
    already is one is kept (Kahn's algorithm with a heap). On a cycle, shorter: what it placed."""
    indegree = [len(p) for p in preds]
    users: list[list[int]] = [[] for _ in preds]
    for i, ps in enumerate(preds):
        for p in ps:
            users[p].append(i)
    ready = [i for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            indegree[u] -= 1
            if indegree[u] == 0:
                heapq.heappush(ready, u)
    return order


def _in_order(nodes: list[Node], index: dict[Node, int]) -> bool:
    """Whether every producer in ``nodes`` comes before the nodes that read it (ONNX files are so)."""
    for i, n in enumerate(nodes):
        for t in n.inputs:
            if t is not None and index.get(t.producer, -1) >= i:  # (None, no producer: not in index)
                return False
    return True
