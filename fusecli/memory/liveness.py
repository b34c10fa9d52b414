"""Liveness over the joint graph: the schedule, each tensor's lifetime, the saved set, peak and timeline.

Schedule = forward topological order, then the backward ops in the order they were made. A forward
tensor that a backward op reads is *saved*: it stays alive across the forward/backward boundary.
Parameters and constants are alive throughout; graph outputs at least until the loss (the boundary), to
the end where the caller holds them (``outputs_held``); parameter gradients until the end (the optimizer
reads them).

Bytes are counted per storage where the caller says which tensors share one (``storage``: a view's base,
or None for a tensor the framework never allocates, grad.storage): a base is alive from its producer to
the last read of any of its views, and a tensor without a storage of its own adds nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import accumulate

from ..core.ir import Graph, Node, Tensor


@dataclass(slots=True)
class Saved:
    """A forward tensor kept for backward: who reads it, and whether its value or only its shape."""

    tensor: Tensor
    needed_by: list[Node]
    reads: str  # "value" | "shape"
    bytes: int | None  # None: a dim is unknown (left out of the totals)


@dataclass
class Liveness:
    schedule: list[Node]
    boundary: int  # index of the first backward op (== len(schedule) when there is none)
    saved: list[Saved]
    timeline: list[int]  # live bytes after each step
    peak_bytes: int
    peak_step: int
    resident_bytes: int  # parameters and constants, alive throughout
    saved_by_name: dict[str, Saved] = field(default_factory=dict)
    unknown: set[str] = field(default_factory=set)  # tensors of unknown size, left out of every total
    live_at_peak: list[Tensor] = field(default_factory=list)  # what the peak is made of
    views: int = 0  # tensors counted in their base's storage (``storage``)
    never_allocated: int = 0  # tensors the framework never allocates (``storage``)
    # tensor -> the tensor whose storage holds it (None: never allocated); others are their own storage
    storage: Mapping[Tensor, Tensor | None] = field(default_factory=dict, repr=False, compare=False)
    # (tensor, step): a second buffer of the tensor's size, alive at that step only (a backward formula's)
    transients: list[tuple[Tensor, int]] = field(default_factory=list, repr=False, compare=False)
    tensors: list[Tensor] = field(default_factory=list, repr=False, compare=False)  # the joint's, in order
    # each one's first and last step (born -1 before the first step); None: a parameter or constant
    # (a view's or a never-allocated tensor's is None too: its bytes are its base's, or none)
    spans: list[tuple[int, int] | None] = field(default_factory=list, repr=False, compare=False)
    _reader_ops: dict[str, dict[str | None, set[str]]] = field(default_factory=dict, repr=False,
                                                               compare=False)
    _lifetimes: dict[str, tuple[int, int]] | None = field(default=None, repr=False, compare=False)

    @property
    def lifetimes(self) -> dict[str, tuple[int, int]]:
        """First and last step of every tensor but parameters and constants, by name; made on first use
        (the report reads ``spans`` by position)."""
        if self._lifetimes is None:
            self._lifetimes = {t.name: s for t, s in zip(self.tensors, self.spans, strict=True)
                               if s is not None}
        return self._lifetimes

    @property
    def saved_bytes(self) -> int:
        return sum(s.bytes for s in self.saved if s.bytes is not None)

    @property
    def saved_activation_bytes(self) -> int:
        return sum(s.bytes for s in self.saved if s.tensor.kind == "activation" and s.bytes is not None)

    def incomplete(self) -> list[str]:
        """Which totals leave out a tensor of unknown size."""
        out = []
        if any(s.bytes is None for s in self.saved):
            out.append("saved_bytes")
        if any(s.bytes is None and s.tensor.kind == "activation" for s in self.saved):
            out.append("saved_activation_bytes")
        if self.unknown:
            out.append("peak_bytes")
        return out

    def reader_ops_by_forward(self, name: str) -> dict[str | None, set[str]]:
        """The op types of the backward ops that read saved tensor ``name``, by the forward node each is
        the backward of (``meta["forward"]``); made once per tensor, as a tensor may have many readers."""
        ops = self._reader_ops.get(name)
        if ops is None:
            ops = self._reader_ops[name] = {}
            for b in self.saved_by_name[name].needed_by:
                ops.setdefault(b.meta.get("forward"), set()).add(b.op_type)
        return ops

    @property
    def peak_node(self) -> Node | None:
        return self.schedule[self.peak_step] if 0 <= self.peak_step < len(self.schedule) else None


def analyze_liveness(joint: Graph, sizes: Mapping[str, int] | None = None,
                     keeps_for_shape: Callable[[Tensor, Node], bool] | None = None,
                     storage: Mapping[Tensor, Tensor | None] | None = None,
                     transients: list[tuple[Tensor, int]] = (), held: list[Tensor] = (),
                     held_until: Mapping[Tensor, int] | None = None, outputs_held: bool = False) -> Liveness:
    """Lifetimes and the saved set of ``joint`` at the dims' values ``sizes``, in one pass over its edges.
    A tensor of unknown size is left out of every total (and listed in ``unknown``).

    ``keeps_for_shape(t, reader)``: whether the backward op ``reader``'s read of t's shape keeps the
    whole tensor alive (as TensorFlow does where a dim is unknown in its graph); by default a shape
    read costs nothing. ``storage``: tensor -> the tensor whose storage holds it (None: never allocated);
    a tensor not in it is its own storage. ``transients``: (tensor, step), one more buffer of the
    tensor's size alive at that step only. ``held``: forward tensors alive until the end of forward
    whatever reads them (a value the model's forward holds in a local). ``held_until``: forward tensor ->
    a forward step it is alive until at least (an argument a module call's frame holds). ``outputs_held``:
    the graph's outputs live to the end of backward (the caller's variable holds them), not only to the loss.
    """
    schedule = joint.nodes
    boundary = next((i for i, n in enumerate(schedule) if n.phase == "backward"), len(schedule))
    end = len(schedule) - 1
    # the last step reading each tensor: later steps overwrite earlier ones (keys: tensors, by identity);
    # _backward_reads goes on from the boundary, in its pass over the backward steps' reads
    last = {t: i for i, n in enumerate(schedule[:boundary]) for t in n.inputs}
    for t in held:
        if last.get(t, -2) < boundary - 1:
            last[t] = boundary - 1
    for t, step in (held_until or {}).items():
        if last.get(t, -2) < step:
            last[t] = step
    readers, shape_readers = _backward_reads(schedule, boundary, last, keeps_for_shape)
    for t in joint.outputs:  # graph outputs live until the loss, parameter gradients until the end
        keep = min(boundary, end) if t.meta.get("grad_of") is None and not outputs_held else end
        if last.get(t, -2) < keep:
            last[t] = keep
    spans = _Spans(joint, schedule, last, sizes, storage or {})
    for t, step in transients:
        spans.add_transient(t, step)
    size = spans.size
    saved = [Saved(t, nodes, "value", size(t)) for t, nodes in readers.items()]
    saved += [Saved(t, nodes, "shape", size(t)) for t, nodes in shape_readers.items()
              if t not in readers]
    # largest first, unknown sizes last, then by name: two stable sorts on plain keys (faster than tuples)
    saved.sort(key=_saved_name)
    saved.sort(key=_saved_size_order)
    timeline = spans.timeline()
    peak_step = timeline.index(max(timeline)) if timeline else -1  # the first step at the maximum
    peak = timeline[peak_step] if timeline else spans.resident + spans.delta[0]
    return Liveness(schedule, boundary, saved, timeline, peak, peak_step, spans.resident,
                    {s.tensor.name: s for s in saved}, spans.unknown, spans.alive_at(peak_step),
                    sum(b is not None for b in storage.values()) if storage else 0,
                    sum(b is None for b in storage.values()) if storage else 0,
                    storage or {}, list(transients), spans.tensors, spans.spans)


def _saved_name(s: Saved) -> str:
    return s.tensor.name


def _saved_size_order(s: Saved) -> float:
    """Largest first, unknown sizes last."""
    return _UNKNOWN_LAST if s.bytes is None else -s.bytes


_UNKNOWN_LAST = float("inf")


def _backward_reads(schedule: list[Node], boundary: int, last: dict[Tensor, int],
                    keeps_for_shape: Callable[[Tensor, Node], bool] | None,
                    ) -> tuple[dict[Tensor, list[Node]], dict[Tensor, list[Node]]]:
    """The backward ops reading each forward value, and each shape read that keeps its tensor, in
    schedule order, each reader once; every read from ``boundary`` on sets its tensor's ``last`` step,
    and a kept shape extends it."""
    readers: dict[Tensor, list[Node]] = {}
    shape_readers: dict[Tensor, list[Node]] = {}
    for i in range(boundary, len(schedule)):
        node = schedule[i]
        if node.phase != "backward":
            for t in node.inputs:
                last[t] = i
            continue
        for t in node.inputs:
            if t is None:
                continue
            last[t] = i
            if t.producer is not None and t.producer.phase != "forward":
                continue
            nodes = readers.get(t)
            if nodes is None:
                readers[t] = [node]
            elif nodes[-1] is not node:  # a node reading t twice reads it at one step: listed once
                nodes.append(node)
        if keeps_for_shape is None:
            continue
        for t in node.meta.get("shape_reads", ()):
            if keeps_for_shape(t, node):
                nodes = shape_readers.setdefault(t, [])
                if not nodes or nodes[-1] is not node:
                    nodes.append(node)
                if last.get(t, -1) < i:
                    last[t] = i
    return readers, shape_readers


class _Spans:
    """Each tensor's size and lifetime (born .. last step, born -1 before the first step), and the
    change of live bytes per step."""

    def __init__(self, joint: Graph, schedule: list[Node], last: dict[Tensor, int],
                 sizes: Mapping[str, int] | None, storage: Mapping[Tensor, Tensor | None]) -> None:
        step = {id(n): i for i, n in enumerate(schedule)}
        self.steps = len(schedule)
        self.sizes = sizes
        self.size_of: dict[tuple, int | None] = {}  # nbytes per (shape, dtype): most tensors share a few
        self.unknown: set[str] = set()
        self.resident = 0  # parameters and constants, alive throughout
        self.spans: list[tuple[int, int] | None] = []  # per tensor of joint.tensors, None: resident
        self.tensors = list(joint.tensors.values())
        delta = self.delta = [0] * (len(schedule) + 2)
        size_of, spans, unknown = self.size_of, self.spans, self.unknown
        resident = 0
        shared = _shared_ends(storage, step, last) if storage else {}
        for t in self.tensors:
            if storage and t in storage:  # a view, or never allocated: its base's bytes, or none
                spans.append(None)
                continue
            n = size_of.get((t.shape, t.dtype), size_of)  # self.size, inline: once per tensor
            if n is size_of:  # the dict itself: this (shape, dtype) is not sized yet
                n = self.size(t)
            if n is None:
                unknown.add(t.name)
            if t.kind in _RESIDENT:
                resident += n or 0
                spans.append(None)
                continue
            if "stands_for_parameters" in t.meta:  # a weight made each step from parameters the export
                resident += n or 0  # folded away, which eager holds all along: as many bytes as it (v, w)
            producer = t.producer
            born = -1 if producer is None else step[id(producer)]
            end = last.get(t, born)
            if end < shared.get(t, -2):
                end = shared[t]
            if end < born:
                end = born
            spans.append((born, end))
            if n:
                delta[born + 1] += n
                delta[end + 2] -= n
        self.resident = resident

    def add_transient(self, t: Tensor, step: int) -> None:
        """One more buffer of ``t``'s size, alive at ``step`` only (unknown size: left out, as t is)."""
        n = self.size(t)
        if n:
            self.delta[step + 1] += n
            self.delta[step + 2] -= n

    def size(self, t: Tensor) -> int | None:
        """``t.nbytes(sizes)``, once per distinct (shape, dtype)."""
        key = (t.shape, t.dtype)
        try:
            return self.size_of[key]
        except KeyError:
            n = self.size_of[key] = t.nbytes(self.sizes)
            return n

    def timeline(self) -> list[int]:
        """Live bytes after each step."""
        return list(accumulate(self.delta[1:self.steps + 1], initial=self.resident + self.delta[0]))[1:]

    def alive_at(self, step: int) -> list[Tensor]:
        """The storages alive at ``step``, parameters and constants included, in the graph's order."""
        return [t for t, span in zip(self.tensors, self.spans, strict=True)
                if (t.kind in _RESIDENT if span is None else span[0] <= step <= span[1])]


def _shared_ends(storage: Mapping[Tensor, Tensor | None], step: dict[int, int],
                 last: dict[Tensor, int]) -> dict[Tensor, int]:
    """Each base's last step over its views: a storage is freed when its last view is."""
    out: dict[Tensor, int] = {}
    for t, base in storage.items():
        if base is None:
            continue
        end = last.get(t, -1 if t.producer is None else step.get(id(t.producer), -1))
        if end > out.get(base, -2):
            out[base] = end
    return out


_RESIDENT = ("parameter", "constant")
