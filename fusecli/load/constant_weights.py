"""Weights held in Constant nodes: recognised by the role they play, made trainable parameters.

Graphs built with the ONNX tool chain itself (onnxscript, onnx_ir) often hold every weight in a
``Constant`` node and have no initializer at all. A float Constant of at least MIN_WEIGHT_ELEMENTS
elements that reaches, directly or through weight-only ops (Transpose, Cast, Reshape of constants), an
operand in a weight's role below is a parameter, as an initializer would be:

- the weight (and bias) of a conv, conv-transpose or Gemm; either operand of a MatMul whose other
  operand is computed from the graph inputs (looking through CastLike, which exporters put in front
  of weights);
- the scale and shift of a batch, layer, instance or group norm (and of com.microsoft's norms);
- a bias (a ``bias_add``) or a per-channel scale (a Mul by a vector along one axis, a decomposed
  norm's gamma);
- an embedding table (the data of a Gather or GatherND whose indices come from the inputs).
"""

from __future__ import annotations

import numpy as np

from ..core.ir import Graph, Node, Tensor
from ..core.kinds import is_channel_vector

# onnx_ir lifts Constants of at least 16 elements to initializers (LiftConstantsToInitializersPass);
# below that a float Constant is a hyper-parameter (eps, 1/sqrt(d), a clip bound), not a weight
MIN_WEIGHT_ELEMENTS = 16

# kind -> input positions that hold weights (the data operand is always input 0 of these)
_WEIGHT_INPUTS = {
    "conv": (1, 2), "conv_transpose": (1, 2), "gemm": (0, 1, 2), "fused_conv": (1, 2),
    "fused_gemm": (0, 1, 2), "batch_norm": (1, 2), "layer_norm": (1, 2), "instance_norm": (1, 2),
    "group_norm": (1, 2), "skip_layer_norm": (2, 3, 4),
}
_CASTS = ("CastLike", "Cast", "Identity")  # value-preserving, made activations by CastLike's target
_MS_NORMS = {"SimplifiedLayerNormalization": (1,), "SkipSimplifiedLayerNormalization": (2, 3),
             "RMSNormalization": (1,)}  # com.microsoft and ONNX (opset 23) ops without a kind here


def _live(t: Tensor | None) -> bool:
    """Computed from the graph inputs (not a weight itself)."""
    return t is not None and t.kind in ("input", "activation")


def is_weight_role(node: Node, index: int) -> bool:
    """Whether ``node``'s input ``index`` is an operand in a weight's role."""
    kind, inputs = node.kind, node.inputs
    positions = _WEIGHT_INPUTS.get(kind) or _MS_NORMS.get(node.op_type)
    if positions is not None:
        return index in positions and (kind not in ("gemm", "fused_gemm") or any(
            _live(t) for i, t in enumerate(inputs[:2]) if i != index))
    if kind == "matmul":
        return index in (0, 1) and _live(node.input(1 - index))
    if kind == "gather" or node.op_type == "GatherND":
        return index == 0 and _live(node.input(1))
    if kind == "bias_add":
        return index == node.meta.get("bias_input", 1)
    if kind in ("mul", "add") and len(inputs) == 2 and index in (0, 1):
        x, w = inputs[1 - index], inputs[index]
        return _live(x) and w is not None and is_channel_vector(w, x)
    return False


def _numel(t: Tensor) -> int:
    return int(np.prod(t.shape)) if t.is_static else 0


def _reaches_weight_role(t: Tensor) -> bool:
    """``t`` (or what weight-only ops make of it) is an operand in a weight's role somewhere."""
    stack, seen = [t], set()
    while stack:
        u = stack.pop()
        if id(u) in seen:
            continue
        seen.add(id(u))
        for c in u.consumers:
            if c.meta.get("constant") or (c.op_type in _CASTS and c.inputs and c.inputs[0] is u):
                # Transpose/Cast/Reshape of weights, CastLike(w, x) to x's dtype: follow what they make
                stack.extend(o for o in c.outputs if o is not None and o.is_float)
                continue
            if any(is_weight_role(c, i) for i, x in enumerate(c.inputs) if x is u):
                return True
    return False


def constant_weights(graph: Graph) -> list[Tensor]:
    """Outputs of float Constant nodes (MIN_WEIGHT_ELEMENTS or more) that are in a weight's role. None in
    a torch export that has float parameters as initializers: torch writes parameters (and persistent
    buffers) as initializers and inlines only non-persistent buffers as Constant nodes (GPT-J's rotary
    ``embed_positions``), which autograd never differentiates."""
    if graph.meta.get("producer") == "pytorch" and any(
            t.kind == "parameter" and t.is_float and t.producer is None for t in graph.tensors.values()):
        return []
    found = []
    for node in graph.nodes:
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or not node.outputs:
            continue
        t = node.outputs[0]
        if t is not None and t.kind == "constant" and t.is_float and _numel(t) >= MIN_WEIGHT_ELEMENTS \
                and _reaches_weight_role(t):
            found.append(t)
    return found


def promote_constant_weights(graph: Graph, enabled: bool = True) -> int:
    """Make float Constant nodes in a weight's role trainable parameters (and what weight-only ops
    compute from them), unless not ``enabled``; their count goes to ``graph.meta['constant_weights']``
    (or ``['constant_weights_kept']``) and is returned."""
    weights = constant_weights(graph)
    if not enabled:
        graph.meta["constant_weights_kept"] = len(weights)
        graph.meta["constant_weights"] = 0
        return 0
    for t in weights:
        t.kind = "parameter"
        t.meta["constant_weight"] = True
    if weights:
        for node in graph.nodes:  # nodes are in topological order: one pass carries it downstream
            if node.meta.get("constant") and any(x is not None and x.kind == "parameter"
                                                 for x in node.inputs):
                for o in node.outputs:
                    if o is not None and o.is_float:
                        o.kind = "parameter"
    graph.meta["constant_weights"] = len(weights)
    return len(weights)


def float_constants(graph: Graph) -> list[Tensor]:
    """Float constants of at least MIN_WEIGHT_ELEMENTS elements, largest first (what a model without
    parameters holds instead)."""
    found = [t for t in graph.tensors.values()
             if t.kind == "constant" and t.is_float and _numel(t) >= MIN_WEIGHT_ELEMENTS]
    return sorted(found, key=lambda t: -_numel(t))


def no_parameter_warning(graph: Graph) -> str | None:
    """The warning for a model with no trainable parameter at all (None when it has one)."""
    if any(t.kind == "parameter" and t.is_float for t in graph.tensors.values()):
        return None
    kept = graph.meta.get("constant_weights_kept", 0)
    big = float_constants(graph)
    if kept:
        found = (f"{kept} Constant node{'s' if kept != 1 else ''} in a weight's role "
                 "kept as constants (--constant-weights constants)")
    elif big:
        t = big[0]
        found = (f"{len(big)} float constant{'s' if len(big) != 1 else ''} of {MIN_WEIGHT_ELEMENTS} or "
                 f"more elements (largest {t.name!r} [{'x'.join(str(d) for d in t.shape)}]), none in a "
                 "weight's role")
    else:
        found = "no float weight at all"
    hint = ", or make Constant-node weights parameters with --constant-weights parameters" if kept else ""
    return (f"the model has no trainable parameter ({found}): the backward graph of --wrt parameters is "
            f"empty; differentiate w.r.t. the float inputs anyway with --wrt inputs{hint}")
