"""Every dim of an ONNX model sized with the real shape tools, as a polynomial in its input dims.

ONNX shape inference (with data propagation) on the model as written leaves dims that come out of
Shape -> Gather -> Concat -> Reshape chains, Range, Expand or Where open (``unk__7``). They are resolved,
in this order, by:

1. onnxruntime's symbolic shape inference on the model with symbolic inputs: dims as expressions of the
   input dims (``batch*seq``, ``seq + 1``);
2. both tools again on the model with the graph inputs bound to the user's values: the numbers, which
   also check every expression of step 1;
3. what is still only a number is evaluated at more integer points (each variable moved) and solved for
   integer polynomial coefficients of degree <= 2, then checked at the user's point; where that fails the
   dim keeps an opaque name (``unk1``) with its value at the user's sizes, so totals stay exact at those
   sizes and their formulas name what is not known.

A dim nothing resolves stays ``None``: its tensor has no size, and the analysis says so.
Weights are never read: initializers left out of the structure read become graph inputs for onnxruntime.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper

from ..core.dims import dim_poly, dim_value
from ..core.ir import Graph
from ..core.kinds import data_dependent_origins
from .bound_fit import bind_in_place, cut_model, fit_by_onnx, sub_model
from .dim_fit import fit_polynomials, over_variables, pending_tensors
from .onnx_wire import payload_left_out
from .routing import SIZED_BY_VALUES, balanced, find_routers
from .shape_tools import huge_shape_value, infer_shapes, value_shapes

Shape = tuple | None
MAX_FOLD_ROUNDS = 16  # rounds of evaluating shape computations (fold_shape_values), each followed by ONNX's
MAX_SYMBOLIC_PASSES = 64  # onnxruntime's loop re-runs after each merge of dims; a bound on it


def resolve_sizes(graph: Graph, values: Mapping[str, int], variables: tuple[str, ...],
                  model: onnx.ModelProto, omitted: set[str], routing: str | None = None) -> dict[str, int]:
    """Fill the graph's open dims in place; returns the values of the opaque dims it had to name.
    ``routing="balanced"``: mixture-of-experts routers are taken as spreading tokens evenly
    (``load.routing``); the dims that follow from it are named ``routed1``, ... (one per value)."""
    pending = pending_tensors(graph, variables)
    if not pending:
        return {}
    runner = _Runner(model, omitted, variables, routing, graph)
    graph.meta["routers"] = [r.indices for r in runner.routers]
    # 0. ONNX's own inference bound at points, fitted (C++; under --routing the tools see a changed model)
    fitted, onnx_at_user = fit_by_onnx(graph, runner.model, pending, values, variables) \
        if not runner.routers else ({}, {})
    for name, shape in fitted.items():
        graph.tensors[name].shape = shape
        pending.discard(name)
    # 1. symbolic, unbound (a model without input dims has nothing to be symbolic in: numbers at once)
    # (on the part they depend on, cut at float activations of known shape: its values size nothing)
    symbolic = (runner.ort(None, cut_model(graph, runner.model, pending, variables, plain=True)) or {}) \
        if variables and pending else {}
    for name in list(pending):
        s = _usable(symbolic.get(name), variables, graph.tensors[name].shape)
        if s is not None:
            graph.tensors[name].shape = s
            pending.discard(name)
    checked = [t for t in graph.tensors.values() if t.producer is not None and t.shape is not None
               and t.name not in fitted  # checked at the user's point as they were fitted
               and any(isinstance(d, str) and not _is_variable(d, variables) for d in t.shape)]
    if not pending and not checked:
        return {}
    # 2. numbers at the user's point: they check step 1's expressions and size what is still open (step 0's
    # run gave them where it closed every dim; the tools run again for the rest only)
    need = pending | {t.name for t in checked}
    at_user = {n: s for n, s in onnx_at_user.items() if n in need and s is not None and None not in s}
    if need - at_user.keys():
        at_user = {**runner.numbers(values, need - at_user.keys()), **at_user}
    for t in checked:
        got = at_user.get(t.name)
        if got is None or len(got) != len(t.shape):
            continue
        if any(g is not None and dim_value(d, values) != g for d, g in zip(t.shape, got, strict=True)):
            t.shape = tuple(d if isinstance(d, int) or _is_variable(d, variables) else None for d in t.shape)
            pending.add(t.name)
    if not pending:
        return {}
    # 3. what is known only as a number gets a fitted polynomial, or an opaque name
    positions: list[tuple[str, int]] = []
    for name in sorted(pending):
        t = graph.tensors[name]
        got = at_user.get(name)
        if got is None or (t.shape is not None and len(got) != len(t.shape)):
            continue
        if t.shape is None:
            t.shape = (None,) * len(got)
        for axis, (d, g) in enumerate(zip(t.shape, got, strict=True)):
            if g is not None and (d is None or dim_poly(d) is None or not over_variables(d, variables)):
                positions.append((name, axis))
    fitted = fit_polynomials(runner.numbers, positions, values, at_user, variables)
    routed = data_dependent_origins(graph, lambda u: u.name in pending) if runner.routers else {}
    opaque: dict[str, int] = {}
    symbol_of: dict[object, str] = {}  # one opaque name per open dim of the tools (unk__7), else per place
    routed_of: dict[int, str] = {}  # under --routing, one name per routed size: the experts' token counts
    for name, axis in positions:
        t = graph.tensors[name]
        expr = fitted.get((name, axis))
        if expr is None and not variables:  # fixed sizes: the number is the dim
            expr = at_user[name][axis]
        elif expr is None and name in routed:
            value = at_user[name][axis]
            expr = routed_of.get(value)
            if expr is None:
                expr = routed_of[value] = f"routed{len(routed_of) + 1}"
                opaque[expr] = value
        elif expr is None:
            d = t.shape[axis]
            key = d if isinstance(d, str) else (name, axis)
            expr = symbol_of.get(key)
            if expr is None:
                expr = symbol_of[key] = f"unk{len(symbol_of) + 1}"
                opaque[expr] = at_user[name][axis]
        dims = list(t.shape)
        dims[axis] = expr
        t.shape = tuple(dims)
    return opaque


def _is_variable(d, variables: tuple[str, ...]) -> bool:
    return isinstance(d, str) and d in variables


def _usable(shape: Shape, variables: tuple[str, ...], current: Shape) -> Shape:
    """onnxruntime's shape where every dim is a polynomial over the input dims, in the graph's notation."""
    if shape is None or (current is not None and len(shape) != len(current)):
        return None
    out = []
    for d in shape:
        if isinstance(d, str):
            p = dim_poly(d)
            if p is None or not p.symbols() <= set(variables):
                return None
            d = p.constant if p.constant is not None else (d if d in variables else str(p))
        out.append(d)
    return tuple(out)


class _Runner:
    """Runs the shape tools on the model, symbolic or bound to numbers (weights as graph inputs)."""

    def __init__(self, model: onnx.ModelProto, omitted: set[str], variables: tuple[str, ...],
                 routing: str | None = None, graph: Graph | None = None) -> None:
        self.model = _weights_as_inputs(model, omitted)
        self.routers = find_routers(self.model) if routing == "balanced" else []
        if self.routers:
            self.model = balanced(self.model, self.routers)
        # its shapes known so far: where a run's part of the model is cut (not under --routing, where the
        # experts' token counts are evaluated from the router's values: its inputs stay in)
        self.graph = None if self.routers else graph
        self.variables = variables
        self.ort_failed = False
        self.fold_elements = ROUTED_FOLD_ELEMENTS if self.routers else FOLD_ELEMENTS

    def bound(self, values: Mapping[str, int] | None, need: set[str] | None = None) -> onnx.ModelProto:
        """The model (only what ``need`` depends on, when given, cut at the float activations whose
        shapes the graph knows: ``bound_fit.cut_model``) with its inputs bound to ``values``."""
        m = None if need is None else _ancestors(self.model, need) if self.graph is None else \
            cut_model(self.graph, self.model, need, self.variables)
        if values is None:
            return m if m is not None else self.model
        if m is None:
            m = onnx.ModelProto()
            m.CopyFrom(self.model)
        bind_in_place(m, values)
        return m

    def ort(self, values: Mapping[str, int] | None, model: onnx.ModelProto | None = None,
            need: set[str] | None = None) -> dict | None:
        if self.ort_failed:
            return None
        shapes = ort_symbolic_shapes(model if model is not None else self.bound(values, need))
        if shapes is None:
            self.ort_failed = True
        return shapes

    def numbers(self, values: Mapping[str, int], need: set[str] | None = None) -> dict[str, tuple]:
        """Every tensor's dims at ``values`` (ints, None where both tools leave it open); onnxruntime's
        (slower) inference runs only where ONNX's leaves open a tensor of ``need`` (default: any)."""
        inferred, _ = infer_shapes(self.bound(values, need))
        shapes = value_shapes(inferred)
        if need is not None:
            open_ = any(_open(shapes.get(n)) for n in need)
        else:
            open_ = any(_open(s) for s in shapes.values()) or _missing(inferred, shapes)
        if open_:
            more = self.ort(values, inferred)
            for name, s in (more or {}).items():
                old = shapes.get(name)
                if s is not None and (old is None or _known(s) > _known(old)):
                    shapes[name] = s
        current = inferred
        for _ in range(MAX_FOLD_ROUNDS):  # each round sizes what the next one's Shape ops read
            if need is None or not any(_open(shapes.get(n)) for n in need):
                break
            folded = fold_shape_values(current, shapes, self.fold_elements)
            if folded is None:
                break
            current = infer_shapes(folded)[0]
            grew = False
            for name, s in value_shapes(current).items():
                old = shapes.get(name)
                if s is not None and (old is None or _known(s) > _known(old)):
                    shapes[name] = s
                    grew = True
            if not grew:
                break
        return {n: None if s is None else tuple(d if isinstance(d, int) else None for d in s)
                for n, s in shapes.items()}


FOLD_ELEMENTS = 1 << 16  # a shape computation's tensors are small; bigger ones are not evaluated
ROUTED_FOLD_ELEMENTS = 1 << 22  # a balanced routing's one-hot masks: tokens * k * experts
_SUBGRAPHS = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
_NOT_FOLDED = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                         "Multinomial", "Bernoulli"})


def fold_shape_values(model: onnx.ModelProto, shapes: dict,
                      max_elements: int = FOLD_ELEMENTS) -> onnx.ModelProto | None:
    """The bound model with its shape computations evaluated by onnx's reference implementation: every
    small tensor that depends on the graph inputs only through their (now static) shapes, and on
    constants whose data was read, becomes an initializer (exporters compute window sizes and paddings
    with float arithmetic on shapes, which neither shape tool follows). None when nothing folds."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    g = model.graph
    static = {t.name for t in g.initializer if _has_data(t)}
    nodes, made, picked = [], {}, set()
    for k, n in enumerate(g.node):
        if n.domain not in ("", "ai.onnx") or any(a.type in _SUBGRAPHS for a in n.attribute):
            continue
        if n.op_type in ("Shape", "Size"):
            s = shapes.get(n.input[0]) if n.input else None
            if s is None or _open(s):
                continue
        elif n.op_type in _NOT_FOLDED or not all(i == "" or i in static for i in n.input) \
                or (n.op_type != "Constant" and not n.input):
            continue
        if n.op_type in SIZED_BY_VALUES:  # NonZero of static values: its size is known once evaluated
            ins = [shapes.get(i) for i in n.input if i]
            if any(s is None or _open(s) or _numel(s) > max_elements for s in ins):
                continue
        else:
            outs = [shapes.get(o) for o in n.output if o]
            if any(s is None or _open(s) or _numel(s) > max_elements for s in outs):
                continue
        nodes.append(n)
        picked.add(k)
        static.update(o for o in n.output if o)
        made.update({o: n for o in n.output if o})
    consumers = {i for k, n in enumerate(g.node) if k not in picked for i in n.input}
    consumers |= {o.name for o in g.output}
    boundary = sorted(o for o in made if o in consumers and made[o].op_type != "Constant")
    if not boundary:
        return None
    sub = onnx.ModelProto()
    sub.CopyFrom(model)
    del sub.graph.node[:], sub.graph.output[:], sub.graph.input[:], sub.graph.value_info[:]
    for n in nodes:
        if n.op_type in ("Shape", "Size"):
            s = shapes[n.input[0]]
            value = np.array(list(s) if n.op_type == "Shape" else _numel(s), dtype=np.int64)
            if n.op_type == "Shape":
                start = next((a.i for a in n.attribute if a.name == "start"), 0)
                end = next((a.i for a in n.attribute if a.name == "end"), len(s))
                value = value[start:end]
            sub.graph.node.append(helper.make_node("Constant", [], [n.output[0]],
                                                   value=numpy_helper.from_array(value)))
        else:
            sub.graph.node.append(n)
    sub.graph.output.extend(onnx.ValueInfoProto(name=o) for o in boundary)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            results = ReferenceEvaluator(sub).run(None, {})
    except Exception:  # an op the reference implementation lacks, or inputs it refuses: fold nothing
        return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = [n for k, n in enumerate(out.graph.node) if k not in picked or n.op_type == "Constant"]
    del out.graph.node[:]
    out.graph.node.extend(kept)
    out.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), name)
                                 for name, v in zip(boundary, results, strict=True))
    del out.graph.input[:]  # the graph inputs, with their bound dims, stay; weights-as-inputs too
    out.graph.input.extend(model.graph.input)
    del out.graph.value_info[:]  # inferred again from the folded values (stale unknowns would stay)
    for o in out.graph.output:  # an output's open dims too: ONNX keeps a declared dim over an inferred one
        if any(not d.HasField("dim_value") for d in o.type.tensor_type.shape.dim):
            o.ClearField("type")
    return out


def _has_data(t: onnx.TensorProto) -> bool:
    return not payload_left_out(t) and t.data_location != onnx.TensorProto.EXTERNAL


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _ancestors(model: onnx.ModelProto, need: set[str]) -> onnx.ModelProto:
    """The part of ``model`` that computes ``need``: the nodes they depend on, the inputs and
    initializers those read, and ``need`` as outputs (shape tools then do only that work)."""
    g = model.graph
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    keep, todo, seen = set(), [n for n in need if n in producer], set(need)
    while todo:
        i = producer[todo.pop()]
        if i in keep:
            continue
        keep.add(i)
        for x in g.node[i].input:
            if x and x not in seen:
                seen.add(x)
                if x in producer:
                    todo.append(x)
    return sub_model(model, keep, seen, need, producer)


def _open(shape: tuple | None) -> bool:
    return shape is None or any(not isinstance(d, int) for d in shape)


def _known(shape: tuple) -> int:
    return sum(isinstance(d, int) for d in shape)


def _missing(model: onnx.ModelProto, shapes: dict) -> bool:
    return any(o and o not in shapes for n in model.graph.node for o in n.output)


def _weights_as_inputs(model: onnx.ModelProto, omitted: set[str]) -> onnx.ModelProto:
    """The structure read, with initializers and Constant nodes whose data was left out turned into typed
    graph inputs (onnxruntime's inference reads every Constant's value), and the other Constant nodes'
    values as initializers of their names (IR >= 4, where an initializer need not be a graph input): the
    same values to the shape tools, and a third fewer nodes for onnxruntime's symbolic tool, which runs
    ONNX's inference once per node."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    stubs = [t for t in g.initializer if t.name in omitted]
    if stubs:
        kept = [t for t in g.initializer if t.name not in omitted]
        del g.initializer[:]
        g.initializer.extend(kept)
    constants: list[tuple[str, onnx.TensorProto]] = []  # (name, tensor) of the left-out ones
    lifted: list[onnx.TensorProto] = []
    nodes = []
    for n in g.node:
        a = n.attribute[0] if n.op_type == "Constant" and len(n.attribute) == 1 else None
        if a is None or a.type != onnx.AttributeProto.TENSOR:
            nodes.append(n)
        elif payload_left_out(a.t):
            constants.append((n.output[0], a.t))
        elif m.ir_version >= 4 and n.domain in ("", "ai.onnx") and a.name == "value" \
                and len(n.output) == 1 and n.output[0]:
            t = onnx.TensorProto()
            t.CopyFrom(a.t)
            t.name = n.output[0]
            lifted.append(t)
        else:
            nodes.append(n)
    if len(nodes) < len(g.node):
        del g.node[:]
        g.node.extend(nodes)
    g.initializer.extend(lifted)
    listed = {i.name for i in g.input}
    g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                   for t in stubs if t.name not in listed)
    g.input.extend(helper.make_tensor_value_info(name, t.data_type, list(t.dims)) for name, t in constants)
    return m


def ort_symbolic_shapes(model: onnx.ModelProto, passes: int = MAX_SYMBOLIC_PASSES) -> dict[str, Shape] | None:
    """onnxruntime's symbolic shape inference, keeping what it infers where it stops early (its public
    entry point raises then, and writes a file into the current folder); None when it fails, or when a
    1-D tensor claims more elements than the budget (a Reshape to it would make one symbol per element)."""
    if huge_shape_value(model) is not None:
        return None
    try:
        SymbolicShapeInference = _symbolic_shape_inference()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            sym = SymbolicShapeInference(2**31 - 1, True, False, 0)
            sym._preprocess(model)
            for _ in range(passes):
                if not sym.run_:
                    break
                sym._infer_impl()
            return value_shapes(sym.out_mp_, extra=sym.known_vi_.values())
    except Exception:  # a best-effort refinement: any failure leaves ONNX's shapes as they were
        return None


def _symbolic_shape_inference():
    """onnxruntime's SymbolicShapeInference class, from its own file: importing it as
    ``onnxruntime.tools.symbolic_shape_infer`` runs ``onnxruntime/tools/__init__.py`` first, which imports
    PyTorch when it is installed (seconds). The file itself needs only onnx, numpy, sympy and packaging."""
    import importlib.util
    import sys

    name = "fusecli._ort_symbolic_shape_infer"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.find_spec("onnxruntime")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("onnxruntime is not installed")
        path = os.path.join(spec.submodule_search_locations[0], "tools", "symbolic_shape_infer.py")
        file_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(file_spec)
        sys.modules[name] = module
        file_spec.loader.exec_module(module)
    return module.SymbolicShapeInference
