"""Root-anchored matching of expression-tree patterns, walking producers from the last op (as Grappler).

A pattern is a tree of ``Op`` (a node of some kinds, its operands below it) and ``Var`` (any tensor,
optionally constrained). A name on an ``Op`` or ``Var`` binds the tensor; a later ``Var`` of the same
name must be that same tensor, which is how shared operands (x in GELU, x - mean in LayerNorm) match.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from ..ir import Graph, Node, Tensor

TensorCheck = Callable[[Tensor], bool]


@dataclass(frozen=True)
class Var:
    """Any tensor (if ``check`` accepts it); ``name`` binds it for later use."""

    name: str | None = None
    check: TensorCheck | None = None


@dataclass(frozen=True)
class Op:
    """A node whose kind (forward) or op type (backward) is in ``kinds``, with operands ``args``.

    ``commutative``: two operands that may come in either order; ``more``: extra trailing inputs are
    allowed and left unmatched; ``role``: the name the node gets in the match; ``optional``: the node
    may be absent, its first operand then matching the tensor itself (an optional Dropout or scale).
    """

    kinds: frozenset[str]
    args: tuple[Op | Var, ...] = ()
    role: str | None = None
    name: str | None = None
    commutative: bool = False
    more: bool = False
    check: Callable[[Node], bool] | None = None
    optional: bool = False

    @cached_property
    def arg_kinds(self) -> tuple[frozenset[str] | None, ...]:
        """Per operand: the kinds its producer must have (an unnamed ``Op``; an optional one or what it
        wraps), else None."""
        return tuple(_producer_kinds(a) for a in self.args)

    @cached_property
    def root_test(self) -> tuple:
        """What ``_root_may_match`` reads of the form: forms that share it get the same answer."""
        return self.arg_kinds, len(self.args), self.more, self.commutative


def _producer_kinds(a: Op | Var) -> frozenset[str] | None:
    if not isinstance(a, Op) or a.name is not None:
        return None
    if not a.optional:
        return a.kinds
    inner = _producer_kinds(a.args[0])
    return None if inner is None else a.kinds | inner


def op(kinds: str | frozenset[str] | set[str], *args: Op | Var, **kw) -> Op:
    ks = frozenset({kinds}) if isinstance(kinds, str) else frozenset(kinds)
    return Op(ks, tuple(args), **kw)


@dataclass
class Match:
    """One occurrence of a pattern: its nodes in data-flow order, roles and bound tensors."""

    pattern: object  # fusion.patterns.Pattern
    nodes: list[Node]
    roles: dict[str, Node] = field(default_factory=dict)
    bound: dict[str, Tensor] = field(default_factory=dict)
    verdict: object = None  # fusion.verdict.Verdict, filled by the verdict pass
    inner: list[Match] = field(default_factory=list)  # smaller matches inside it that the report leaves out

    @property
    def root(self) -> Node:
        return self.nodes[-1]

    def interior(self) -> list[Tensor]:
        """Tensors made and read inside the match: what the fused kernel no longer writes out.

        Other outputs of matched nodes (BatchNorm's batch statistics) are side outputs the fused
        kernel still writes, like the root's output."""
        inside = {id(n) for n in self.nodes}
        return [t for n in self.nodes[:-1] for t in n.outputs
                if t is not None and any(id(c) in inside for c in t.consumers)]

    def inputs(self) -> list[Tensor]:
        """Tensors read by the match and made outside it."""
        made = {id(t) for n in self.nodes for t in n.outputs if t is not None}
        seen, out = set(), []
        for n in self.nodes:
            for t in n.inputs:
                if t is not None and id(t) not in made and id(t) not in seen:
                    seen.add(id(t))
                    out.append(t)
        return out


class _State:
    __slots__ = ("nodes", "roles", "bound")

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.roles: dict[str, Node] = {}
        self.bound: dict[str, Tensor] = {}

    def save(self):
        return len(self.nodes), dict(self.roles), dict(self.bound)

    def restore(self, saved) -> None:
        n, self.roles, self.bound = saved
        del self.nodes[n:]


def _node_key(node: Node) -> str:
    return node.op_type if node.phase == "backward" else node.kind


def is_noop(node: Node | None) -> bool:
    """A forward Identity, or a Cast to the dtype it reads (exporters write float32 -> float32 casts)."""
    if node is None or node.phase != "forward" or node.kind not in ("cast", "identity") or not node.inputs:
        return False
    x, y = node.inputs[0], node.outputs[0]
    return x is not None and y is not None and x.dtype == y.dtype


def through_noops(t: Tensor) -> Tensor:
    """The tensor a chain of no-op casts and identities copies (``t`` itself when there is none)."""
    while is_noop(t.producer) and t.producer.outputs[0] is t:
        t = t.producer.inputs[0]
    return t


def _match_tensor(pat: Op | Var, t: Tensor | None, st: _State) -> bool:
    if t is None:
        return False
    if pat.name is not None and pat.name in st.bound:  # the same value, up to no-op casts
        b = st.bound[pat.name]
        return b is t or through_noops(b) is through_noops(t)
    if isinstance(pat, Var):
        if pat.check is not None and not pat.check(t):
            return False
        if pat.name is not None:
            st.bound[pat.name] = t
        return True
    if pat.optional:
        saved = st.save()
        if _match_op_tensor(pat, t, st):
            return True
        st.restore(saved)
        return _match_tensor(pat.args[0], t, st)
    return _match_op_tensor(pat, t, st)


def _match_op_tensor(pat: Op, t: Tensor, st: _State) -> bool:
    """``pat`` made ``t``, directly or through no-op casts (which join the match)."""
    orig, node = t, t.producer
    saved = st.save()
    while node is not None and node.kind not in pat.kinds and is_noop(node) and node.outputs[0] is t:
        if any(n is node for n in st.nodes):
            break
        st.nodes.append(node)
        t = node.inputs[0]
        node = t.producer
    if node is None or node.outputs[0] is not t or not _match_node(pat, node, st):
        st.restore(saved)
        return False
    if pat.name is not None:
        st.bound[pat.name] = orig
    return True


def _operands_may_match(arg_kinds: tuple[frozenset[str] | None, ...], order: list[Tensor]) -> bool:
    """A cheap necessary condition for ``_match_tensor`` on each operand: an unnamed ``Op`` operand needs a
    producer of one of its kinds, not constant, whose first output the tensor is. Most tries fail here."""
    for kinds, t in zip(arg_kinds, order, strict=False):
        if kinds is not None:
            if is_noop(t.producer) and "cast" not in kinds:
                t = through_noops(t)
            p = t.producer
            if p is None or p.outputs[0] is not t or _node_key(p) not in kinds or p.meta.get("constant"):
                return False
    return True


def _match_node(pat: Op, node: Node, st: _State) -> bool:
    if _node_key(node) not in pat.kinds or node.meta.get("constant"):
        return False
    if any(n is node for n in st.nodes):  # a node appears once per match
        return False
    inputs = [t for t in node.inputs if t is not None]
    if len(inputs) < len(pat.args) or (not pat.more and len(inputs) != len(pat.args)):
        return False
    if pat.check is not None and not pat.check(node):
        return False
    orders = [inputs]
    if pat.commutative and len(pat.args) == 2:
        orders.append([inputs[1], inputs[0], *inputs[2:]])
    arg_kinds = pat.arg_kinds
    for order in orders:
        if not _operands_may_match(arg_kinds, order):
            continue
        saved = st.save()
        st.nodes.append(node)
        if pat.role:
            st.roles[pat.role] = node
        if all(_match_tensor(a, t, st) for a, t in zip(pat.args, order, strict=False)):
            return True
        st.restore(saved)
    return False


def _root_may_match(form: Op, inputs: list[Tensor]) -> bool:
    """_match_node's first checks on a root's operands (count, producers' kinds), without its state."""
    n, nargs = len(inputs), len(form.args)
    if n < nargs or (not form.more and n != nargs):
        return False
    arg_kinds = form.arg_kinds
    return _operands_may_match(arg_kinds, inputs) or (
        form.commutative and nargs == 2 and _operands_may_match(arg_kinds, [inputs[1], inputs[0]]))


def match_at(pattern_root: Op, node: Node) -> tuple[list[Node], dict[str, Node], dict[str, Tensor]] | None:
    """Match the tree rooted at ``node``; its nodes in data-flow order, roles and bindings, or None."""
    st = _State()
    if not _match_node(pattern_root, node, st):
        return None
    return list(reversed(st.nodes)), st.roles, st.bound


def find_matches(graph: Graph, patterns, phase: str = "forward") -> list[Match]:
    """Every occurrence of every pattern, trying each node of ``phase`` as a root (linear in nodes).

    The first form of a pattern that matches at a root wins; each pattern matches a root once.
    """
    by_root: dict[str, list] = {}
    for p in patterns:
        if p.phase == phase:
            for k in p.root.kinds:
                by_root.setdefault(k, []).append(p)
    found: list[Match] = []
    for node in graph.nodes:
        if node.phase != phase:
            continue
        key = _node_key(node)
        candidates = by_root.get(key)
        if not candidates or node.meta.get("constant"):  # no form matches at a constant node
            continue
        inputs = [t for t in node.inputs if t is not None]
        may: dict[tuple, bool] = {}  # _root_may_match's answer per root_test (many forms share one)
        for p in candidates:
            anchor = getattr(p, "anchor", None)
            if anchor is not None and not anchor(node):
                continue  # the pattern's own cheap test of the root (attention: P from a softmax)
            finder = getattr(p, "find", None)
            if finder is not None:  # a pattern read by its form, not by trees (attention)
                got = finder(node)
                if got is not None and (p.require is None or p.require(got[1], got[2])):
                    found.append(Match(p, dataflow_order(got[0]), got[1], got[2]))
                continue
            for form in p.forms:
                if key not in form.kinds:
                    continue
                ok = may.get(form.root_test)
                if ok is None:
                    ok = may[form.root_test] = _root_may_match(form, inputs)
                if not ok:
                    continue  # match_at would say no: skip its set-up
                m = match_at(form, node)
                if m is None:
                    continue
                nodes, roles, bound = m
                if p.require is not None and not p.require(roles, bound):
                    continue
                for name in p.include_producers:  # the producer, and the no-op casts in between
                    t = bound.get(name)
                    while t is not None and t.producer is not None and all(n is not t.producer
                                                                            for n in nodes):
                        nodes.insert(0, t.producer)
                        t = t.producer.inputs[0] if is_noop(t.producer) else None
                found.append(Match(p, dataflow_order(nodes), roles, bound))
                break
    return found


def dataflow_order(nodes: list[Node]) -> list[Node]:
    """Nodes of one match in topological order, the root last."""
    root = nodes[-1] if nodes else None
    ids = {id(n) for n in nodes}
    order, done = [], set()

    def visit(n: Node) -> None:
        if id(n) in done:
            return
        done.add(id(n))
        for t in n.inputs:
            if t is not None and t.producer is not None and id(t.producer) in ids:
                visit(t.producer)
        order.append(n)

    visit(root)
    for n in nodes:
        visit(n)
    return order
