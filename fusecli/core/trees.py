"""The pattern language: trees of ``Op`` and ``Var``, and the root-anchored matcher that walks producers
from the last op (as Grappler does). Below both grad/ (the autodiff profiles' composites) and fusion/ (the
catalogue): spellings/ writes its trees in it.

A pattern is a tree of ``Op`` (a node of some kinds, its operands below it) and ``Var`` (any tensor,
optionally constrained). A name on an ``Op`` or ``Var`` binds the tensor; a later ``Var`` of the same
name must be that same tensor, which is how shared operands (x in GELU, x - mean in LayerNorm) match.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from .ir import Node, Tensor

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
    def kind_checks(self) -> tuple[tuple[int, frozenset[str], None], ...]:
        """(position, kinds, None) of the operands whose producer's kind ``arg_kinds`` constrains: the
        one-level checks of ``_producers_may_match`` (no deeper skeleton)."""
        return tuple((i, k, None) for i, k in enumerate(self.arg_kinds) if k is not None)

    @cached_property
    def root_test(self) -> tuple:
        """What ``root_may_match`` reads of the form (its skeleton ``ROOT_TEST_DEPTH`` ops deep): forms
        that share it get the same answer."""
        return _skeleton(self, ROOT_TEST_DEPTH, frozenset())


ROOT_TEST_DEPTH = 3  # how many ops deep root_may_match looks: the root, its operands' producers, theirs


def _names(pat: Op | Var) -> set[str]:
    """Every name bound in the tree ``pat``."""
    names = {pat.name} if pat.name is not None else set()
    for a in getattr(pat, "args", ()):
        names |= _names(a)
    return names


def _skeleton(pat: Op, depth: int, bound_before: frozenset[str]) -> tuple:
    """(operand count, more, operands swap, checks): what ``_match_node`` requires of the operands' producers
    ``depth`` ops deep. checks: (position, kinds, the producer's own skeleton or None) per operand the matcher
    surely matches as an ``Op``: not optional, and not a name some earlier subtree may have bound already
    (``bound_before``: the names the match may hold when ``pat``'s operands are tried; those then only
    need to be the same tensor). An optional operand keeps the one-level check of ``arg_kinds``."""
    checks = []
    before = set(bound_before)
    for i, a in enumerate(pat.args):
        if isinstance(a, Op) and not a.optional and (a.name is None or a.name not in before):
            sub = _skeleton(a, depth - 1, frozenset(before)) if depth > 2 else None
            checks.append((i, a.kinds, sub))
        elif isinstance(a, Op) and pat.arg_kinds[i] is not None and not pat.arg_kinds[i] & _NOOP_KEYS:
            checks.append((i, pat.arg_kinds[i], None))
        before |= _names(a)
    return len(pat.args), pat.more, pat.commutative and len(pat.args) == 2, tuple(checks)


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


class _State:
    """The match so far. ``save`` is a few lengths, not copies: ``restore`` drops what was added since
    and puts back the values of keys written over (``undo``), so the dicts keep their order."""

    __slots__ = ("nodes", "roles", "bound", "undo")

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.roles: dict[str, Node] = {}
        self.bound: dict[str, Tensor] = {}
        self.undo: list[tuple[dict, str, object]] = []  # (dict, key, the value written over)

    def save(self):
        return len(self.nodes), len(self.roles), len(self.bound), len(self.undo)

    def restore(self, saved) -> None:
        n, r, b, u = saved
        del self.nodes[n:]
        undo = self.undo
        while len(undo) > u:  # values written over first, then the keys added since
            d, key, old = undo.pop()
            d[key] = old
        _truncate(self.roles, r)
        _truncate(self.bound, b)

    def put(self, d: dict, key: str, value) -> None:
        """``d[key] = value``, remembering a value it writes over."""
        if key in d:
            self.undo.append((d, key, d[key]))
        d[key] = value


def _truncate(d: dict, n: int) -> None:
    """Drop the keys added after the first ``n``."""
    if len(d) > n:
        for key in list(d)[n:]:
            del d[key]


def node_key(node: Node) -> str:
    return node.op_type if node.phase == "backward" else node.kind


def is_noop(node: Node | None) -> bool:
    """An Identity, or a Cast to the dtype it reads (exporters write float32 -> float32 casts), forward or
    the backward one such a forward Cast gets (its gradient: a Cast between ReluGrad and BiasAddGrad)."""
    if node is None or not node.inputs or node_key(node) not in _NOOP_KEYS:
        return False
    x, y = node.inputs[0], node.outputs[0]
    return x is not None and y is not None and x.dtype == y.dtype


def through_noops(t: Tensor) -> Tensor:
    """The tensor a chain of no-op casts and identities copies (``t`` itself when there is none)."""
    while is_noop(t.producer) and t.producer.outputs[0] is t:
        t = t.producer.inputs[0]
    return t


def _match_tensor(pat: Op | Var, t: Tensor | None, st: _State) -> bool:
    """Match ``pat`` on ``t``; on failure the state is as it was."""
    if t is None:
        return False
    if pat.name is not None and pat.name in st.bound:  # the same value, up to no-op casts
        b = st.bound[pat.name]
        if b is t:
            return True
        common = through_noops(b)
        if common is not through_noops(t):
            return False
        _join_noops(t, common, st)  # the no-ops on this read are the match's, as on a first read
        if _join_noops(b, common, st):  # the first read's, where it bound the no-op's output: the value
            st.put(st.bound, pat.name, common)  # is the one both read, made outside the no-ops now joined
        return True
    if isinstance(pat, Var):
        if pat.check is not None and not pat.check(t):
            return False
        if pat.name is not None:
            st.bound[pat.name] = t  # a new key: bound names return above
        return True
    if pat.optional:
        return _match_op_tensor(pat, t, st) or _match_tensor(pat.args[0], t, st)
    return _match_op_tensor(pat, t, st)


def _join_noops(t: Tensor, common: Tensor, st: _State) -> bool:
    """The no-op casts and identities from ``common`` up to ``t`` join the match (a second read of a bound
    value through a no-op: GELU's x read once as it is and once through an Identity); whether any did."""
    joined = False
    while t is not common:
        node = t.producer
        if node not in st.nodes:
            st.nodes.append(node)
            joined = True
        t = node.inputs[0]
    return joined


def _match_op_tensor(pat: Op, t: Tensor, st: _State) -> bool:
    """``pat`` made ``t``, directly or through no-op casts (which join the match); on failure the state is
    as it was (``_match_node`` leaves it so, the casts are taken off)."""
    orig, node = t, t.producer
    if node is None:
        return False
    if node_key(node) not in pat.kinds and not is_noop(node):
        return False  # no cast to walk, and _match_node would refuse the kind
    nodes = st.nodes
    n = len(nodes)
    while node is not None and node_key(node) not in pat.kinds and is_noop(node) and node.outputs[0] is t:
        if node in nodes:  # identity: nodes compare by identity
            break
        nodes.append(node)
        t = node.inputs[0]
        node = t.producer
    if node is None or node.outputs[0] is not t or not _match_node(pat, node, st):
        del nodes[n:]
        return False
    if pat.name is not None:
        st.put(st.bound, pat.name, orig)
    return True


_NOOP_KINDS = ("cast", "identity")  # is_noop's forward kinds
_NOOP_KEYS = frozenset({*_NOOP_KINDS, "Cast", "Identity"})  # is_noop's node keys (backward: op types)


def _match_node(pat: Op, node: Node, st: _State) -> bool:
    """Match ``pat`` rooted at ``node``; on failure the state is as it was."""
    if node_key(node) not in pat.kinds or node.meta.get("constant"):
        return False
    if node in st.nodes:  # a node appears once per match (nodes compare by identity)
        return False
    inputs = node.inputs
    if None in inputs:
        inputs = [t for t in inputs if t is not None]
    args = pat.args
    if len(inputs) < len(args) or (not pat.more and len(inputs) != len(args)):
        return False
    if pat.check is not None and not pat.check(node):
        return False
    orders = [inputs]
    if pat.commutative and len(args) == 2:
        orders.append([inputs[1], inputs[0], *inputs[2:]])
    kind_checks = pat.kind_checks
    for order in orders:
        if not _producers_may_match(kind_checks, order):
            continue
        saved = st.save()
        st.nodes.append(node)
        if pat.role:
            st.put(st.roles, pat.role, node)
        if _match_operands(args, order, st):
            return True
        st.restore(saved)
    return False


def _match_operands(args: tuple[Op | Var, ...], order: list[Tensor], st: _State) -> bool:
    for a, t in zip(args, order, strict=False):
        if not _match_tensor(a, t, st):
            return False
    return True


def root_may_match(root_test: tuple, inputs: list[Tensor]) -> bool:
    """A necessary condition for ``match_at(form, node)`` on the root's operands ``inputs`` (not None),
    without the matcher's state: ``_match_node``'s checks of operand counts and of the producers' kinds
    along the form's ``root_test``, ``ROOT_TEST_DEPTH`` ops deep, in either order of two commutative
    operands."""
    nargs, more, swap, checks = root_test
    n = len(inputs)
    if n < nargs or (not more and n != nargs):
        return False
    return _producers_may_match(checks, inputs) or (
        swap and _producers_may_match(checks, [inputs[1], inputs[0], *inputs[2:]]))


def _producers_may_match(checks: tuple, order: list[Tensor]) -> bool:
    """Each checked operand is made, through the no-op casts ``_match_op_tensor`` walks, by a node of its
    kinds, not constant, whose first output it is (and whose own operands pass their skeleton)."""
    for i, kinds, sub in checks:
        t = order[i]
        p = t.producer
        if p is None:
            return False
        key = p.op_type if p.phase == "backward" else p.kind  # node_key, inline: a hot loop
        while key not in kinds and key in _NOOP_KEYS and is_noop(p) and p.outputs[0] is t:
            t = p.inputs[0]  # the walk of _match_op_tensor
            p = t.producer
            if p is None:
                return False
            key = p.op_type if p.phase == "backward" else p.kind
        if p.outputs[0] is not t or key not in kinds or p.meta.get("constant"):
            return False
        if sub is not None:
            inputs = p.inputs
            if None in inputs:
                inputs = [x for x in inputs if x is not None]
            if not root_may_match(sub, inputs):
                return False
    return True


def match_at(pattern_root: Op, node: Node) -> tuple[list[Node], dict[str, Node], dict[str, Tensor]] | None:
    """Match the tree rooted at ``node``; its nodes in data-flow order, roles and bindings, or None."""
    st = _State()
    if not _match_node(pattern_root, node, st):
        return None
    return list(reversed(st.nodes)), st.roles, st.bound


def dataflow_order(nodes: list[Node]) -> list[Node]:
    """Nodes of one match in topological order, the root last."""
    root = nodes[-1] if nodes else None
    ids = {id(n) for n in nodes}
    order: list[Node] = []
    done: set[int] = set()

    def visit(n: Node) -> None:
        done.add(id(n))
        for t in n.inputs:
            if t is not None:
                p = t.producer
                if p is not None and id(p) in ids and id(p) not in done:
                    visit(p)
        order.append(n)

    visit(root)
    for n in nodes:
        if id(n) not in done:
            visit(n)
    return order
