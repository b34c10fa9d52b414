"""Open dims sized by ONNX's own (C++) shape inference with the graph inputs bound to numbers.

At the user's point and at the fit's probe points (``dim_fit``), ONNX's inference with data propagation
sizes most dims the symbolic run left open (``unk__7`` out of Shape -> Gather -> Concat -> Reshape); the
numbers are fitted to integer polynomials in the input dims and checked at every point. What it leaves
open (a Slice whose bounds come out of a Div of a shape) goes on to onnxruntime's symbolic tool
(``onnx_sizes``), and then this fit is not tried.

Each run sees only the part of the model the open tensors depend on, cut at float activations whose
shapes are already polynomials in the input dims: those become graph inputs of that shape at the point
(a float activation's values never size anything), so a run costs the shape computations, not the model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx
from onnx import helper

from ..dims import dim_value
from ..ir import Graph, Tensor
from ..sizes import input_dim_name
from .dim_fit import MAX_FIT_VARIABLES, fit_polynomials, over_variables
from .shape_tools import dims_of, infer_shapes

_FLOAT_TYPES = {"float32": onnx.TensorProto.FLOAT, "float64": onnx.TensorProto.DOUBLE,
                "float16": onnx.TensorProto.FLOAT16, "bfloat16": onnx.TensorProto.BFLOAT16}


def fit_by_onnx(graph: Graph, model: onnx.ModelProto, pending: set[str], values: Mapping[str, int],
                variables: tuple[str, ...]) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """The shapes of the ``pending`` tensors whose every open dim ONNX's bound inference sizes at each
    point and fits to a polynomial, and the dims it found at the user's point (ints, None where open).
    Where it leaves one open at the user's point, no fit: onnxruntime's tool then runs anyway, on as
    much of the model, and the fit's further runs would cost more than they save."""
    if not pending or not variables or len(variables) > MAX_FIT_VARIABLES:
        return {}, {}
    template = cut_model(graph, model, pending, variables)

    def numbers(point: Mapping[str, int], need: set[str]) -> dict[str, tuple]:
        inferred, _ = infer_shapes(bind_inputs(template, point))
        return needed_dims(inferred, need)

    at_user = numbers(values, pending)
    closed: dict[str, tuple] = {}
    positions: list[tuple[str, int]] = []
    for name in sorted(pending):
        got, shape = at_user.get(name), graph.tensors[name].shape
        if got is None or None in got or (shape is not None and len(got) != len(shape)):
            continue
        closed[name] = shape if shape is not None else (None,) * len(got)
        positions += [(name, axis) for axis, d in enumerate(closed[name]) if not over_variables(d, variables)]
    if len(closed) < len(pending):
        return {}, at_user
    fitted = fit_polynomials(numbers, positions, values, at_user, variables)
    out = {}
    for name, shape in closed.items():
        dims = [fitted.get((name, axis), d if over_variables(d, variables) else None)
                for axis, d in enumerate(shape)]
        if None not in dims:
            out[name] = tuple(dims)
    return out, at_user


def cut_model(graph: Graph, model: onnx.ModelProto, need: set[str], variables: tuple[str, ...],
              plain: bool = False) -> onnx.ModelProto:
    """The nodes ``need`` depends on, back to the graph inputs, initializers and float activations whose
    shape ``graph`` knows over ``variables`` (graph inputs here, their dims as expressions to bind).
    ``plain``: cut only where every dim is a number or a variable itself, for a symbolic tool (it reads a
    dim's text as one symbol: ``2*seq`` squared would print as ``2*seq**2``)."""
    g = model.graph
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    keep: set[int] = set()
    frontier: dict[str, Tensor] = {}
    seen = set(need)
    todo = [producer[n] for n in need if n in producer]
    while todo:
        i = todo.pop()
        if i in keep:
            continue
        keep.add(i)
        for x in g.node[i].input:
            if not x or x in seen:
                continue
            seen.add(x)
            if x not in producer:
                continue
            t = graph.tensors.get(x)
            if _cuttable(t, variables, plain):
                frontier[x] = t
            else:
                todo.append(producer[x])
    return sub_model(model, keep, seen, need, producer,
                     [helper.make_tensor_value_info(x, _FLOAT_TYPES[t.dtype], list(t.shape))
                      for x, t in frontier.items()])


def sub_model(model: onnx.ModelProto, keep: set[int], seen: set[str], need: set[str],
              producer: Mapping[str, int],
              more_inputs: Sequence[onnx.ValueInfoProto] = ()) -> onnx.ModelProto:
    """The nodes at positions ``keep`` as a model: the graph inputs and initializers among ``seen``, then
    ``more_inputs``, and the made ones of ``need`` as outputs (shape tools then do only that work)."""
    g = model.graph
    out = onnx.ModelProto()
    for fd, value in model.ListFields():
        if fd.name != "graph":
            set_field(out, fd, value)
    og = out.graph
    og.name = g.name
    og.node.extend(g.node[i] for i in sorted(keep))
    og.input.extend(i for i in g.input if i.name in seen)
    og.input.extend(more_inputs)
    og.initializer.extend(t for t in g.initializer if t.name in seen)
    og.output.extend(onnx.ValueInfoProto(name=n) for n in sorted(need) if n in producer)
    return out


def _cuttable(t: Tensor | None, variables: tuple[str, ...], plain: bool = False) -> bool:
    """A float activation sized by the input dims: a shape is known, its values size nothing."""
    if t is None or t.producer is None or t.dtype not in _FLOAT_TYPES or t.shape is None:
        return False

    def known(d) -> bool:  # plain: a number or an input dim itself, not an expression of them
        return (isinstance(d, int) or d in variables) if plain else over_variables(d, variables)

    return any(not isinstance(d, int) for d in t.shape) and all(known(d) for d in t.shape)


def bind_inputs(model: onnx.ModelProto, values: Mapping[str, int]) -> onnx.ModelProto:
    """A copy of ``model`` with its graph inputs' named dims (and expressions of them) bound to ``values``."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    bind_in_place(m, values)
    return m


def bind_in_place(m: onnx.ModelProto, values: Mapping[str, int]) -> None:
    """``m``'s graph inputs' dims bound to ``values`` where they evaluate there (unnamed ones by the name
    fusecli gives them, ``sizes.input_dim_name``)."""
    for vi in m.graph.input:
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                continue
            v = dim_value(d.dim_param or input_dim_name(vi.name, axis), values)
            if v is not None:
                d.Clear()
                d.dim_value = v


def needed_dims(model: onnx.ModelProto, need: set[str]) -> dict[str, tuple]:
    """The dims (ints, None where open) of the ``need`` values the (inferred) model describes."""
    g = model.graph
    out: dict[str, tuple] = {}
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.name in need:
            s = dims_of(vi)
            if s is not None or vi.name not in out:
                out[vi.name] = None if s is None else tuple(d if isinstance(d, int) else None for d in s)
    return out


def set_field(msg, fd, value) -> None:
    """Copy one field (``ListFields()``'s descriptor and value) into ``msg``: repeated, message or scalar."""
    if fd.is_repeated:
        getattr(msg, fd.name).extend(value)
    elif fd.message_type is not None:
        getattr(msg, fd.name).CopyFrom(value)
    else:
        setattr(msg, fd.name, value)
