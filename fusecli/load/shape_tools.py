"""ONNX shape inference, run within a budget, and the shapes it leaves in a model.

Data propagation turns 1-D tensors into "shape values" element by element: a graph input, an
initializer or a Constant claiming millions of elements makes it allocate gigabytes (a 76-byte file
took 10 GB). Such a model is inferred without data propagation, and the warning says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import onnx

from ..core import budgets
from ..core.errors import error_text

DATA_PROP_ELEMENTS = int(os.environ.get("FUSECLI_MAX_SHAPE_VALUE_ELEMENTS", 1 << 16))
# inputs read as the shape (or repeats) of an output: one element per dim of what the op makes
SHAPE_INPUTS = {"ConstantOfShape": 0, "Reshape": 1, "Expand": 1, "Tile": 1}


def infer_shapes(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None]:
    """ONNX shape inference, with data propagation unless the model claims a huge 1-D integer tensor;
    on failure the model as it was. Returns the model and a warning (or None)."""
    big = huge_shape_value(model)
    note = None
    if big is not None:
        note = (f"{big} claims more than {DATA_PROP_ELEMENTS} elements in one dim; shape inference ran "
                "without data propagation (raise FUSECLI_MAX_SHAPE_VALUE_ELEMENTS to allow it)")
    elif model.graph.sparse_initializer:  # onnx 1.23's data propagation hangs on some (fuzz seed 20265754)
        note = "the model has sparse initializers; shape inference ran without data propagation"
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=note is None)
        return inferred, note
    except Exception as e:  # onnx raises several C++-mapped types here
        first = error_text(e)
        return model, f"shape inference failed, shapes may be missing: {first}"


def check_shape_costs(model: onnx.ModelProto) -> None:
    """OverBudget (one line, naming the tensor and the figure) when a declared or inferred shape costs
    more than the RANK budget: a value, initializer or Constant of more dims, or a tensor an op reads as
    a shape (ConstantOfShape, Reshape, Expand, Tile) of more elements (a rank-N output, one dim each).
    Linear in the model's values and nodes; run before the shape tools build anything from a shape."""
    cap = budgets.limit("RANK")
    graphs = [model.graph]
    while graphs:
        g = graphs.pop()
        shapes: dict[str, list] = {}
        for what, infos in (("graph input", g.input), ("value", g.value_info), ("graph output", g.output)):
            for vi in infos:
                if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
                    dims = vi.type.tensor_type.shape.dim
                    budgets.check("RANK", len(dims), f"{what} {vi.name!r} declares {len(dims):,} dims")
                    shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        for t in g.initializer:
            budgets.check("RANK", len(t.dims), f"initializer {t.name!r} declares {len(t.dims):,} dims")
            shapes[t.name] = list(t.dims)
        for n in g.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    budgets.check("RANK", len(a.t.dims), f"{n.op_type} {n.name or n.output[0]!r} declares "
                                  f"{len(a.t.dims):,} dims")
                    if n.op_type == "Constant" and n.output:
                        shapes[n.output[0]] = list(a.t.dims)
                graphs += [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for n in g.node:
            k = SHAPE_INPUTS.get(n.op_type)
            if k is None or len(n.input) <= k or n.input[k] not in shapes:
                continue
            known = [d for d in shapes[n.input[k]] if d is not None]
            elements = 1
            for d in known:
                elements *= d
            if known and elements > cap:
                budgets.check("RANK", elements, f"{n.op_type} {n.name or n.output[0]!r} reads "
                              f"{n.input[k]!r} as a shape of {elements:,} elements")


def huge_shape_value(model: onnx.ModelProto) -> str | None:
    """The name of a 1-D input, value (value_info, output), initializer or Constant longer than the
    data-propagation budget."""
    g = model.graph
    for what, infos in (("graph input", g.input), ("value", g.value_info), ("graph output", g.output)):
        for vi in infos:
            tt = vi.type.tensor_type
            if vi.type.HasField("tensor_type") and len(tt.shape.dim) == 1:
                d = tt.shape.dim[0]
                if d.HasField("dim_value") and d.dim_value > DATA_PROP_ELEMENTS:
                    return f"{what} {vi.name!r}"
    for t in g.initializer:
        if len(t.dims) == 1 and t.dims[0] > DATA_PROP_ELEMENTS:
            return f"initializer {t.name!r}"
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR and len(a.t.dims) == 1 \
                        and a.t.dims[0] > DATA_PROP_ELEMENTS:
                    return f"Constant {n.name or n.output[0]!r}"
    return None


def dims_of(value_info: onnx.ValueInfoProto) -> tuple | None:
    """A value's dims: ints, names (or expressions), None where unknown; None when the rank is unknown."""
    if not value_info.type.HasField("tensor_type"):
        return None
    tt = value_info.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim)


def value_shapes(model: onnx.ModelProto,
                 extra: Iterable[onnx.ValueInfoProto] = ()) -> dict[str, tuple | None]:
    """Dims of every value the model's graph describes (inputs, value_info, outputs, ``extra``)."""
    g = model.graph
    out: dict[str, tuple | None] = {}
    for vi in (*g.input, *g.value_info, *g.output, *extra):
        s = dims_of(vi)
        if s is not None or vi.name not in out:
            out[vi.name] = s
    for t in g.initializer:
        out[t.name] = tuple(t.dims)
    return out
