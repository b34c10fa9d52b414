"""Whether an attention mask computed from shapes alone is the causal mask (or a causal sliding window).

GroupQueryAttention applies the causal mask itself (``causal=1``; ``local_window_size=W``: each query sees its
last W keys), so the export's own mask may go only where it is exactly that. The mask's subgraph (it reads
the graph inputs' shapes, never their values) is cut out and run by onnxruntime at probe sizes: every
symbolic dim of the inputs but the batch set to P. Query i may see key j iff 0 <= i - j < W
(W = infinity: causal), over the (S, L) = (P, P) scores, alike for every batch row and head. A mask
that reads an integer constant c (a window size) is probed at P = c + 2 as well, so a window wider than the
small probes is seen. The same probes tell whether a bool mask leaves every query a key (rows_kept): then a
Where that fills masked scores with -1e4 is an additive bias of that fill.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...core.budgets import check_elements
from ...core.errors import FuseError, OverBudget
from ...spellings.attention import MASKED
from ..graph.values import Weights

PROBES = (7, 19)  # sizes every mask is probed at
MAX_PROBE = 4098  # a window constant past this is not probed: the mask is not proven causal
MAX_NODES = 1024  # a mask's subgraph larger than this is not cut out
_VALUE_OPS = frozenset({"Add", "Sub", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "Mod",
                        "Mul", "Div", "Min", "Max", "Trilu"})  # where a window constant would be read


def subgraph(weights: Weights, name: str) -> onnx.ModelProto | str:
    """The nodes that make ``name`` from graph inputs and constants, as a model with ``name`` its output."""
    nodes, inits, inputs, seen, stack = [], [], [], set(), [name]
    taken: set[int] = set()
    graph_inputs = {v.name: v for v in weights.model.graph.input}
    while stack:
        t = stack.pop()
        if not t or t in seen:
            continue
        seen.add(t)
        if t in graph_inputs and t not in weights.initializers:
            inputs.append(graph_inputs[t])
        elif weights.is_constant(t) and (t in weights.initializers
                                         or weights.producer[t].op_type != "Constant"):
            try:
                value = weights.value(t)
            except OverBudget:
                raise
            except FuseError as e:  # a constant subgraph that cannot be folded
                return str(e)
            if value is None:
                return f"the value of {t!r} cannot be read"
            inits.append(numpy_helper.from_array(np.asarray(value), t))
        elif t in weights.producer:
            node = weights.producer[t]
            if id(node) in taken:  # a node with several outputs is reached once per output
                continue
            taken.add(id(node))
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
                return f"{node.op_type} {node.name} has a subgraph"
            nodes.append(node)
            if len(nodes) > MAX_NODES:
                return f"its subgraph has over {MAX_NODES} nodes"
            stack.extend(node.input)
        else:
            return f"{t!r} comes from nothing"
    order = {id(n): i for i, n in enumerate(weights.model.graph.node)}
    nodes.sort(key=lambda n: order[id(n)])
    graph = helper.make_graph(nodes, "mask", inputs, [onnx.ValueInfoProto(name=name)], inits)
    return helper.make_model(graph, opset_imports=list(weights.model.opset_import),
                             ir_version=weights.model.ir_version)


def _window_constants(model: onnx.ModelProto) -> list[int]:
    """Integer constants > 1 that value ops of the mask read (a sliding window's size)."""
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].HasField("t"):
            values[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    found = []
    for n in model.graph.node:
        if n.op_type not in _VALUE_OPS:
            continue
        for i in n.input:
            v = values.get(i)
            if v is not None and v.size == 1 and np.issubdtype(v.dtype, np.integer) \
                    and 1 < abs(int(v.reshape(-1)[0])) < 2**31:
                found.append(abs(int(v.reshape(-1)[0])))
    return found


def _feeds(model: onnx.ModelProto, p: int, named: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Zeros for the subgraph's inputs: a named dim is 1 where its first appearance is an axis 0 (the
    batch), else P, alike in every input (GPT-2's past (2, batch, N, past, H) shares x's batch); ``named``
    sets some dims by name."""
    feeds, named = {}, dict(named or {})
    for v in model.graph.input:
        dims = []
        for axis, d in enumerate(v.type.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            elif d.dim_param:
                dims.append(named.setdefault(d.dim_param, 1 if axis == 0 else p))
            else:
                dims.append(1 if axis == 0 else p)
        check_elements(dims, f"the mask probe's input {v.name!r}")
        feeds[v.name] = np.zeros(dims, helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type))
    return feeds


def allowed_keys(mask: np.ndarray, kind: str, keep_true: bool, fill: float | None) -> np.ndarray | str:
    """The (S, L) bool matrix of keys each query sees under a probed mask: ``kind`` "add" (0 sees, at
    most MASKED hides) or "where" (the condition keeps the score where it is ``keep_true``; ``fill``, the
    value put elsewhere, must hide)."""
    if mask.ndim < 2:
        return "the mask has no (queries, keys) axes"
    rows = mask.reshape(-1, *mask.shape[-2:])
    if not all(np.array_equal(rows[0], r) for r in rows[1:]):
        return "the mask differs between batch rows or heads"
    m = rows[0]
    if kind == "where":
        if fill is None or not fill <= MASKED:
            return f"the masked scores are set to {fill}, which does not hide them"
        return m.astype(bool) if keep_true else ~m.astype(bool)
    m = m.astype(np.float64)
    if not np.all((m == 0) | (m <= MASKED)):
        return "the additive mask holds values other than 0 and a large negative number"
    return m == 0


def band(allowed: np.ndarray) -> float | str:
    """W when query i sees exactly keys 0 <= i - j < W (math.inf: every earlier key), else why not."""
    s, ell = allowed.shape
    if s != ell:
        return f"the mask is {s} x {ell} at a probe, not square (a KV cache or cross-attention)"
    w = int(allowed[-1].sum())
    diff = np.arange(s)[:, None] - np.arange(ell)[None, :]
    if w == 0 or not np.array_equal(allowed, (diff >= 0) & (diff < w)):
        return "the mask is not causal (nor a causal sliding window)"
    return math.inf if w >= s else float(w)


def dim_names(model: onnx.ModelProto) -> list[str]:
    """The named dims of the subgraph's inputs but those first seen at an axis 0 (the batch), in order."""
    names: dict[str, bool] = {}
    for v in model.graph.input:
        for axis, d in enumerate(v.type.tensor_type.shape.dim):
            if d.dim_param:
                names.setdefault(d.dim_param, axis != 0)
    return [n for n, keep in names.items() if keep]


def _probed(weights: Weights, name: str, probes: list[int] | None = None, empty: bool = False):
    """The mask ``name``'s subgraph run by onnxruntime at each probe size (PROBES, plus P = c + 2 for a
    window constant c past them; ``probes`` instead where given): (P, value) pairs, or why not. ``empty``:
    also each named dim at 0 with the rest at the first probe (a KV cache's first step: past = 0)."""
    import onnxruntime as ort  # lazily: the rewrite runs onnxruntime anyway

    model = subgraph(weights, name)
    if isinstance(model, str):
        return model
    wide = [c + 2 for c in _window_constants(model) if c + 2 > max(PROBES)]
    if any(c > MAX_PROBE for c in wide):
        return f"the mask reads a constant past {MAX_PROBE - 2} (a window too wide to probe)"
    probes = list(PROBES) + sorted(set(wide)) if probes is None else probes
    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's own error types
        return f"onnxruntime cannot run the mask's subgraph ({type(e).__name__})"
    runs = [(p, {}) for p in probes]
    runs += [(probes[0], {d: 0}) for d in dim_names(model)] if empty else []
    values = []
    for p, named in runs:
        try:
            values.append((p, np.asarray(sess.run(None, _feeds(model, p, named))[0])))
        except OverBudget:  # a probe over the ARRAY_ELEMENTS budget: refused, not taken for a non-causal mask
            raise
        except Exception as e:
            return f"onnxruntime cannot run the mask's subgraph ({type(e).__name__})"
    return values


def causal_window(weights: Weights, name: str, kind: str, keep_true: bool = True,
                  fill: float | None = None, static_seq: int | None = None) -> float | str:
    """The causal window W of the shape-only mask tensor ``name`` (math.inf: plain causal), or why it is
    no causal mask. ``static_seq``: the query length when the export fixed it (one probe, at that size)."""
    probed = _probed(weights, name, None if static_seq is None else [static_seq])
    if isinstance(probed, str):
        return probed
    window = math.inf
    for p, value in probed:
        allowed = allowed_keys(value, kind, keep_true, fill)
        if isinstance(allowed, str):
            return allowed
        if static_seq is None and allowed.shape[0] != p:
            return f"the mask's query axis is {allowed.shape[0]} at probe size {p}"
        w = band(allowed)
        if isinstance(w, str):
            return w
        if window != math.inf and w != window and not (w == math.inf and window >= p):
            return "the mask's window changes with the sequence length"
        window = min(window, w)
    return window


def rows_kept(weights: Weights, name: str, keep_true: bool) -> str | None:
    """None when the shape-only bool mask ``name`` leaves every query at least one key at every probe size
    (1, a one-token step, PROBES, and each named dim at 0: an empty past; GPT-2's causal rows [L-S, L) of
    a lower triangle always keep key 0),
    else why not. Then Where(m, s, c) and s + Where(m, 0, c) differ only by exp(s + c - max) against
    exp(c - max), both 0 in float32 for c <= -1e4 (MASKED) and scores far above it."""
    probed = _probed(weights, name, [1, *PROBES], empty=True)
    if isinstance(probed, str):
        return probed
    for p, value in probed:
        if value.ndim < 2 or value.dtype != np.bool_:
            return "the mask is no bool (queries, keys) tensor"
        kept = value if keep_true else ~value
        if not kept.any(axis=-1).all():
            return f"a query whose every key is masked at probe size {p}"
    return None
