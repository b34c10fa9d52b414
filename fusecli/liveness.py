"""Liveness over the joint graph: the schedule, each tensor's lifetime, the saved set, peak and timeline.

Schedule = forward topological order, then the backward ops in the order they were made. A forward
tensor that a backward op reads is *saved*: it stays alive across the forward/backward boundary.
Parameters and constants are alive throughout; graph outputs at least until the loss (the boundary);
parameter gradients until the end (the optimizer reads them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .ir import Graph, Node, Tensor, distinct


@dataclass
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
    lifetimes: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)  # first, last step
    _reader_ops: dict[str, dict[str | None, set[str]]] = field(default_factory=dict, repr=False,
                                                               compare=False)

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
                     keeps_for_shape: Callable[[Tensor, Node], bool] | None = None) -> Liveness:
    """Lifetimes and the saved set of ``joint`` at the dims' values ``sizes``, in one pass over its edges.
    A tensor of unknown size is left out of every total (and listed in ``unknown``).

    ``keeps_for_shape(t, reader)``: whether the backward op ``reader``'s read of t's shape keeps the
    whole tensor alive (as TensorFlow does where a dim is unknown in its graph); by default a shape
    read costs nothing.
    """
    schedule = joint.nodes
    step = {id(n): i for i, n in enumerate(schedule)}
    boundary = next((i for i, n in enumerate(schedule) if n.phase == "backward"), len(schedule))
    end = len(schedule) - 1
    nbytes: dict[str, int | None] = {}
    unknown: set[str] = set()
    born: dict[str, int] = {}
    last: dict[str, int] = {}
    readers: dict[str, list[Node]] = {}
    shape_readers: dict[str, list[Node]] = {}
    resident = 0
    size_of: dict[tuple, int | None] = {}  # nbytes per (shape, dtype): most tensors share a few shapes
    for t in joint.tensors.values():
        key = (t.shape, t.dtype)
        if key in size_of:
            n = size_of[key]
        else:
            n = size_of[key] = t.nbytes(sizes)
        nbytes[t.name] = n
        if n is None:
            unknown.add(t.name)
        if t.kind in ("parameter", "constant"):
            resident += n or 0
            continue
        born[t.name] = last[t.name] = -1 if t.producer is None else step[id(t.producer)]
    for i, node in enumerate(schedule):
        backward = node.phase == "backward"
        for t in node.inputs:
            if t is None:
                continue
            name = t.name
            if last.get(name, i) < i:
                last[name] = i
            if backward and (t.producer is None or t.producer.phase == "forward"):
                if name in readers:
                    readers[name].append(node)
                else:
                    readers[name] = [node]
        if backward and keeps_for_shape is not None:
            for t in node.meta.get("shape_reads", ()):
                if keeps_for_shape(t, node):
                    shape_readers.setdefault(t.name, []).append(node)
                    if t.name in last and last[t.name] < i:
                        last[t.name] = i
    for t in joint.outputs:
        if t.name in last:
            last[t.name] = max(last[t.name], min(boundary, end) if t.meta.get("grad_of") is None else end)

    saved = []
    for name, nodes in readers.items():
        saved.append(Saved(joint.tensors[name], distinct(nodes), "value", nbytes[name]))
    for name, nodes in shape_readers.items():
        if name not in readers:
            saved.append(Saved(joint.tensors[name], distinct(nodes), "shape", nbytes[name]))
    saved.sort(key=lambda s: (s.bytes is None, -(s.bytes or 0), s.tensor.name))

    delta = [0] * (len(schedule) + 2)
    for name, b in born.items():
        n = nbytes[name] or 0
        delta[b + 1] += n
        delta[max(last[name], b) + 2] -= n
    timeline, live = [], resident + delta[0]
    for i in range(len(schedule)):
        live += delta[i + 1]
        timeline.append(live)
    peak_step = max(range(len(timeline)), key=timeline.__getitem__) if timeline else -1
    peak = timeline[peak_step] if timeline else resident + delta[0]
    at_peak = [t for t in joint.tensors.values() if t.kind in ("parameter", "constant")
               or (t.name in born and born[t.name] <= peak_step <= max(last[t.name], born[t.name]))]
    lifetimes = {name: (b, max(last[name], b)) for name, b in born.items()}
    return Liveness(schedule, boundary, saved, timeline, peak, peak_step, resident,
                    {s.tensor.name: s for s in saved}, unknown, at_peak, lifetimes)


