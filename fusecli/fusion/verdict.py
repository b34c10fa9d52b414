"""A verdict per match: fusable at all, safe for inference, safe for training, what blocks it, and why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..core.ir import Graph, Node, Tensor
from ..core.kinds import reads_type_only
from ..core.trees import is_noop
from ..core.units import format_bytes
from ..memory.liveness import Liveness
from .frameworks import framework_notes, not_fusable_notes
from .match import Match
from .recompute import Recompute, node_flops, plan

# Verdict.state's values, worst first
LADDER = ("not fusable", "inference only", "training-safe if recomputed", "training-safe")


@dataclass
class Blocking:
    """An interior tensor that backward reads: the fused kernel would have to write it out."""

    tensor: Tensor
    needed_by: list[str]
    bytes: int | None  # None: a dim is unknown


@dataclass
class Verdict:
    inference_safe: bool
    training_safe: bool
    reason: str
    blocking: list[Blocking] = field(default_factory=list)
    traffic_bytes: int = 0  # interior bytes written and read back that fusion saves (known sizes only)
    frameworks: dict = field(default_factory=dict)
    recompute: Recompute | None = None  # training-safe if these blocking tensors are recomputed
    check: str | None = None  # the check that rejected it: "dtypes", "read_outside" (not fusable),
    # "backward_reads" (inference only), "recompute_contraction" (no recompute verdict)

    @property
    def state(self) -> str:
        """Its rung of LADDER: not fusable < inference only < training-safe if recomputed < training-safe."""
        if self.training_safe:
            return "training-safe"
        if self.recompute is not None:
            return "training-safe if recomputed"
        return "inference only" if self.inference_safe else "not fusable"


def side_outputs(m: Match) -> set[int]:
    """Ids of interior tensors the kernel writes out as extra outputs (SkipLayerNorm's sum), with the
    no-op casts that copy them."""
    out: set[int] = set()
    for name in getattr(m.pattern, "side_outputs", ()):
        t = m.bound.get(name)
        while t is not None:
            out.add(id(t))
            p = t.producer
            t = p.inputs[0] if is_noop(p) and p.outputs[0] is t else None
    return out


class Lookups:
    """Facts about single tensors that ``judge`` reads for many matches (a tensor is the edge or the
    interior of several), each made once per analysis: its bytes, and which backward ops read its value."""

    def __init__(self, live: Liveness, sizes: Mapping[str, int] | None) -> None:
        self.live, self.sizes = live, sizes
        self._bytes: dict[int, int | None] = {}
        self._readers: dict[int, dict[str | None, set[str]] | None] = {}
        self._flops: dict[int, int | None] = {}
        self._read_by: dict[str, str] = {}
        self._at: str | None = None

    def node_flops(self, node: Node) -> int | None:
        """``recompute.node_flops(node, sizes)``, once per node (a node is in several matches)."""
        n = self._flops.get(id(node), _UNSET)
        if n is _UNSET:
            n = self._flops[id(node)] = node_flops(node, self.sizes)
        return n

    def read_by(self, name: str) -> str:
        """'BatchNormGrad (backward of bn1)': the backward ops that read saved tensor ``name``, once per
        name."""
        text = self._read_by.get(name)
        if text is None:
            text = self._read_by[name] = ", ".join(sorted(
                {f"{n.op_type} (backward of {n.meta.get('forward', '?')})"
                 for n in self.live.saved_by_name[name].needed_by}))
        return text

    @property
    def at(self) -> str:
        """``_at(sizes)``, made once."""
        if self._at is None:
            self._at = _at(self.sizes)
        return self._at

    def nbytes(self, t: Tensor) -> int | None:
        """``t.nbytes(sizes)``, once per tensor."""
        n = self._bytes.get(id(t), _UNSET)
        if n is _UNSET:
            n = self._bytes[id(t)] = t.nbytes(self.sizes)
        return n

    def value_readers(self, t: Tensor) -> dict[str | None, set[str]] | None:
        """Op types of the backward ops that read ``t``'s value, by the forward node each is the backward of;
        None when backward does not keep its value or it is a parameter or constant."""
        if t.kind in ("parameter", "constant"):
            return None
        readers = self._readers.get(id(t), _UNSET)
        if readers is _UNSET:
            s = self.live.saved_by_name.get(t.name)
            value = s is not None and s.reads == "value"
            # not s.needed_by: it may be very long
            readers = self._readers[id(t)] = self.live.reader_ops_by_forward(t.name) if value else None
        return readers


_UNSET = object()  # not looked up yet


def _interior(m: Match, inside: set[int]) -> list[Tensor]:
    """``m.interior()`` with the ids of its nodes made once."""
    out = []
    for n in m.nodes[:-1]:
        for t in n.outputs:
            if t is not None:
                for c in t.consumers:
                    if id(c) in inside:
                        out.append(t)
                        break
    return out


def _outside_readers(m: Match, outputs: set[str], interior: list[Tensor],
                     inside: set[int]) -> tuple[Tensor, list[Node], bool] | None:
    """The first interior tensor read outside the match (or a graph output), with those readers; a read
    of its shape alone (dynamo's Shape of repeated keys) needs no value written out."""
    for t in interior:
        others = [c for c in t.consumers if id(c) not in inside and not reads_type_only(c, t)
                  and c.kind not in ("shape", "size")]
        if others or t.name in outputs:
            return t, others, t.name in outputs
    return None


def _dtype_clash(m: Match) -> str | None:
    dtypes = {t.dtype for n in m.nodes for t in n.outputs[:1] if t is not None and t.dtype != "bool"}
    return None if len(dtypes) <= 1 else ", ".join(sorted(dtypes))


def _edge_activations(m: Match, inside: set[int]) -> list[Tensor]:
    """The match's inputs (``m.inputs()``, in order) and then its root's outputs, less parameters and
    constants (backward's reads of those are no activation's)."""
    seen: set[int] = set()
    out = []
    for n in m.nodes:
        for t in n.inputs:
            if t is None or t.kind in ("parameter", "constant") or id(t) in seen:
                continue
            seen.add(id(t))
            if t.producer is None or id(t.producer) not in inside:  # made outside: an input of the match
                out.append(t)
    out.extend(x for x in m.root.outputs if x is not None)
    return out


def _edge_reads(m: Match, lookups: Lookups, inside: set[int]) -> str:
    """'ConvBackpropFilter reads x; ReluGrad reads y': backward reads of the match's edge activations."""
    names = {n.name for n in m.nodes}
    by_op: dict[str, list[str]] = {}
    for t in _edge_activations(m, inside):
        by_forward = lookups.value_readers(t)
        if not by_forward:
            continue
        ops: set[str] = set()
        for forward, readers in by_forward.items():  # by_forward is short: the nodes that read t
            if forward in names:
                ops.update(readers)
        for op in sorted(ops):
            by_op.setdefault(op, []).append(t.name)
    return "; ".join(f"{op} reads {', '.join(ts)}" for op, ts in sorted(by_op.items()))


def judge(m: Match, graph: Graph, live: Liveness, sizes: Mapping[str, int] | None = None,
          outputs: set[str] | None = None, lookups: Lookups | None = None) -> Verdict:
    """Judge one forward or backward match against the structure and the liveness result
    (``outputs``: the graph's output names, and ``lookups``, made once by the caller that judges many)."""
    notes = framework_notes(m)
    clash = _dtype_clash(m)
    if clash:
        return Verdict(False, False, f"not fusable: the chain mixes dtypes ({clash})",
                       frameworks=not_fusable_notes(notes), check="dtypes")
    if lookups is None:
        lookups = Lookups(live, sizes)
    inside = {id(n) for n in m.nodes}
    if m.pattern.phase == "backward":
        return _judge_backward(m, lookups, notes, inside)
    side = side_outputs(m)
    interior = _interior(m, inside)
    if side:
        interior = [t for t in interior if id(t) not in side]
    if outputs is None:
        outputs = {t.name for t in graph.outputs}
    outside = _outside_readers(m, outputs, interior, inside)
    if outside:
        t, readers, is_output = outside
        who = "is a graph output" if is_output and not readers else \
            f"is also read by {', '.join(r.name for r in readers[:3])} outside the match"
        return Verdict(False, False, f"not fusable: {t.name} (made by {t.producer.name}) {who}, "
                       "so the fused kernel would have to write it out anyway",
                       frameworks=not_fusable_notes(notes), check="read_outside")
    traffic = sum((lookups.nbytes(t) or 0) * (1 + len(t.consumers)) for t in interior)
    edge = _edge_reads(m, lookups, inside)
    if m.pattern.fused_kind:
        return Verdict(True, True, f"training-safe: becomes {m.pattern.kernel}, an op with its own "
                       "gradient that reads only the fused op's inputs (and statistics it writes out)"
                       + (f"; today {edge}" if edge else ""), traffic_bytes=traffic, frameworks=notes)
    blocking = _blocking(interior, live)
    if blocking:
        return _blocked(m, blocking, lookups, traffic, notes)
    return Verdict(True, True, "training-safe: no tensor inside the fused kernel is read by backward"
                   + (f" ({edge})" if edge else ""), traffic_bytes=traffic, frameworks=notes)


def _blocking(interior: list[Tensor], live: Liveness) -> list[Blocking]:
    """The interior tensors whose value backward reads."""
    blocking = []
    for t in interior:
        s = live.saved_by_name.get(t.name)
        if s is not None and s.reads == "value":
            blocking.append(Blocking(t, [n.name for n in s.needed_by], s.bytes))
    return blocking


def _blocked(m: Match, blocking: list[Blocking], lookups: Lookups, traffic: int, notes: dict) -> Verdict:
    """Training-safe if recomputed, or inference only: backward reads ``blocking``."""
    sizes = lookups.sizes
    rc = plan(m, blocking, lookups.live, sizes, lookups.node_flops)
    b = next((x for x in blocking if isinstance(rc, Recompute) and x.tensor.name in rc.tensors),
             blocking[0])
    what = lookups.read_by(b.tensor.name)
    size = "size unknown" if b.bytes is None else f"{format_bytes(b.bytes)} at {lookups.at}"
    blocked = (f"{what} reads {b.tensor.name}, made inside the fused kernel by {b.tensor.producer.name} "
               f"({size})")
    if isinstance(rc, Recompute):
        return Verdict(True, False, f"training-safe if recomputed: {blocked}; {rc.recipe}: "
                       f"+{_count(rc.flops, 'FLOPs')} in backward, frees {_size(rc.bytes_freed)}, keeps "
                       f"{_size(rc.bytes_kept)} instead{_net(rc, sizes)}", blocking, traffic, notes, rc,
                       "backward_reads")
    return Verdict(True, False, f"inference only: {blocked}; to train fused, the kernel must also "
                   f"write it out or recompute it, and {rc}", blocking, traffic, notes,
                   check="recompute_contraction")


def _at(sizes: Mapping[str, int] | None) -> str:
    """'batch=2, seq=128': the input dims the bytes are counted at."""
    names = getattr(sizes, "variables", ())
    return ", ".join(f"{n}={sizes[n]}" for n in names) if names else "the model's fixed sizes"


def _net(rc: Recompute, sizes: Mapping[str, int] | None) -> str:
    """What recomputing frees once what it keeps is counted: nothing, when it keeps as much or more."""
    net = rc.net_bytes_freed
    if net is None:
        return ""
    if net > 0:
        return f" (net: frees {format_bytes(net)})"
    more = "as much as it frees" if net == 0 else f"{format_bytes(-net)} more than it frees"
    return f"; at {_at(sizes)} recomputing frees nothing: it keeps {more}"


def _count(n: int | None, unit: str) -> str:
    return f"{n:,} {unit}" if n is not None else f"unknown {unit} (a size is unknown)"


def _size(n: int | None) -> str:
    return format_bytes(n) if n is not None else "an unknown size"


def _judge_backward(m: Match, lookups: Lookups, notes: dict, inside: set[int]) -> Verdict:
    emitted = []
    traffic = 0
    for t in _interior(m, inside):
        others = [c for c in t.consumers if id(c) not in inside]
        n = lookups.nbytes(t) or 0
        traffic += n * (1 if others else 2)  # the re-read always; the write too when nobody else reads it
        if others:
            emitted.append(f"{t.name} (also read by {', '.join(sorted({c.op_type for c in others}))})")
    reason = f"backward fusion: {' + '.join(n.op_type for n in m.nodes)} run as one kernel"
    if emitted:
        reason += "; the kernel also writes out " + "; ".join(emitted)
    return Verdict(False, True, reason, traffic_bytes=traffic, frameworks=notes)


def suppress_dominated(matches: list[Match]) -> list[Match]:
    """Drop a match whose nodes lie inside a larger match that is at least as safe (bias in conv_bias_act);
    it stays in the larger ones' ``inner`` (what a rewrite falls back to where no kernel takes them)."""
    by_node: dict[int, list[Match]] = {}
    for m in matches:
        for n in m.nodes:
            by_node.setdefault(id(n), []).append(m)
    node_ids: dict[int, set[int]] = {}  # id(match) -> ids of its nodes, made for the matches compared only
    kept = []
    for m in matches:
        candidates = by_node[id(m.nodes[0])]
        over = []
        if len(candidates) > 1:  # else m is the only match over its first node
            ids = _node_ids(m, node_ids)
            safe = _safety(m)
            over = [o for o in candidates if o is not m and len(o.nodes) > len(m.nodes)
                    and ids <= _node_ids(o, node_ids)
                    and all(a >= b for a, b in zip(_safety(o), safe, strict=True))]
        for o in over:
            o.inner.append(m)
        if not over:
            kept.append(m)
    return kept


def _safety(m: Match) -> tuple[bool, bool, bool]:
    v = m.verdict
    return (v.inference_safe, v.training_safe or v.recompute is not None, v.training_safe)


def _node_ids(m: Match, made: dict[int, set[int]]) -> set[int]:
    """The ids of ``m``'s nodes, made once per match (``made``)."""
    ids = made.get(id(m))
    if ids is None:
        ids = made[id(m)] = {id(n) for n in m.nodes}
    return ids
