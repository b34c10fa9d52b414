"""Shape plumbing: the integer ops (Shape, Gather, Unsqueeze, Concat, Range, ...) whose results feed
only the shape inputs of other ops (Reshape's target, Expand's, Slice's bounds), never data.

``render`` hides them by default (``--shape-ops`` draws them): on a real transformer they are most of
the boxes and say nothing about what fuses or what backward keeps.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..core.ir import Node

INT_DTYPES = frozenset({"int64", "int32"})
# op type -> the input slots that take a shape, an axis list or slice bounds (ONNX, then TensorFlow)
SHAPE_INPUTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}), "Expand": frozenset({1}), "Slice": frozenset({1, 2, 3, 4}),
    "Tile": frozenset({1}), "ConstantOfShape": frozenset({0}), "Unsqueeze": frozenset({1}),
    "Squeeze": frozenset({1}), "Pad": frozenset({1}), "Resize": frozenset({1, 2, 3}),
    "Split": frozenset({1}), "TopK": frozenset({1}), "ReduceSum": frozenset({1}),
    "ReduceMean": frozenset({1}), "ReduceMax": frozenset({1}), "BroadcastTo": frozenset({1}),
    "StridedSlice": frozenset({1, 2, 3}), "Fill": frozenset({0}), "ExpandDims": frozenset({1}),
    "Transpose": frozenset({1}),  # TensorFlow's perm input (ONNX Transpose has one input)
}


def _reads_shape_only(consumer: Node, tensor, hidden: set[int]) -> bool:
    """``consumer`` is hidden itself, or reads ``tensor`` only at shape slots."""
    if id(consumer) in hidden:
        return True
    slots = SHAPE_INPUTS.get(consumer.op_type, frozenset())
    return all(k in slots for k, t in enumerate(consumer.inputs) if t is tensor)


def shape_only(nodes: Iterable[Node], outputs: Iterable = ()) -> set[int]:
    """ids of the forward ``nodes`` (in topological order) whose every result is an integer tensor read
    only as a shape, directly or through other such ops; graph ``outputs`` are data."""
    ordered = list(nodes)
    data = {id(t) for t in outputs}
    hidden: set[int] = set()
    for n in reversed(ordered):  # consumers before producers
        outs = [t for t in n.outputs if t is not None]
        if not outs or n.phase != "forward":
            continue
        ok = all(t.dtype in INT_DTYPES and id(t) not in data and t.consumers
                 and all(c.phase == "forward" and _reads_shape_only(c, t, hidden) for c in t.consumers)
                 for t in outs)
        if ok:
            hidden.add(id(n))
    return hidden
