"""Elementwise ops whose inputs cannot broadcast at the user's dims: an inconsistent export.

ONNX broadcasts elementwise inputs numpy's way (aligned from the last axis, each pair of dims equal or
one of them 1). An export whose shapes break that (a trace that baked a wrong axis into a Reshape:
Cohere's rotate_half under the TorchScript exporter, ``16`` against ``32``) is one onnxruntime refuses
to run; ONNX's shape inference leaves the op's output unknown, and everything computed from it. Said
where it starts, so the unknown sizes that follow are not taken for a missing ``--dim``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..core.dims import dim_value
from ..core.ir import Graph, Node

# ONNX ops whose inputs broadcast multidirectionally (the Operators.md "Multidirectional Broadcasting")
BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Where", "Equal", "Less", "LessOrEqual",
                          "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Max", "Min", "Mean", "Sum",
                          "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "PRelu"})


def broadcast_conflicts(graph: Graph, sizes: Mapping[str, int]) -> list[tuple[Node, int, int]]:
    """Each broadcasting node with two inputs whose dims at ``sizes`` are both known, unequal and not
    1 at some aligned axis: (node, one dim, the other), in graph order."""
    out = []
    for node in graph.nodes:
        if node.op_type not in BROADCASTING or node.domain not in ("", "ai.onnx"):
            continue
        shapes = [[dim_value(d, sizes) for d in t.shape] for t in node.inputs
                  if t is not None and t.shape is not None]
        found = _conflict(shapes)
        if found is not None:
            out.append((node, *found))
    return out


def _conflict(shapes: list[list[int | None]]) -> tuple[int, int] | None:
    for i, a in enumerate(shapes):
        for b in shapes[i + 1:]:
            for x, y in zip(reversed(a), reversed(b), strict=False):
                if x is not None and y is not None and x != y and x != 1 and y != 1:
                    return x, y
    return None


def broadcast_note(conflicts: list[tuple[Node, int, int]]) -> str | None:
    """The first conflict said in one line (None where there is none)."""
    if not conflicts:
        return None
    node, a, b = conflicts[0]
    shapes = " and ".join(str(tuple(t.shape)) for t in node.inputs if t is not None and t.shape is not None)
    rest = len(conflicts) - 1
    more = f" ({rest} more such op{'s' if rest > 1 else ''})" if rest else ""
    return (f"an inconsistent model: {node.op_type} node {node.name!r} reads shapes {shapes}, which do not "
            f"broadcast ({a} against {b}){more}; onnxruntime refuses to run such a model, and the sizes "
            "computed from it are unknown: export the model again (its exporter wrote a wrong shape)")
