"""Keras's dtype policies applied to a TensorFlow graph (a SavedModel or its tf2onnx conversion, analyzed
under the TensorFlow profile): ``amp-fp16`` / ``amp-bf16`` are ``mixed_float16`` / ``mixed_bfloat16``,
``fp16`` / ``bf16`` the policies ``"float16"`` / ``"bfloat16"`` (Keras 3 source: layers/layer.py,
normalization/, attention/multi_head_attention.py, backend/tensorflow/numpy.py ``mean``).

- Variables keep the policy's variable dtype (float32 under a mixed policy); an AutoCastVariable is cast
  to the compute dtype at each read, so every read by a layer's op is a Cast of its own.
- A layer casts its float inputs to the compute dtype as it is called: a float32 model input is cast
  once per layer argument reading it (MultiHeadAttention(x, x): the query, and the value that key
  defaults to, two casts; a residual Add another).
- In float32, whatever the policy (input cast up, output cast back to the compute dtype):
  BatchNormalization (``result_type(x, float32)``), LayerNormalization, MultiHeadAttention's softmax
  (with its score scaling), and ``ops.mean`` of a float16 / bfloat16 tensor (GlobalAveragePooling's).
  They are found by form: FusedBatchNorm or ``x * (rsqrt(var + eps) * gamma) + shift`` of parameters,
  the moments LayerNorm (``reduce_mean`` and ``squared_difference`` of one x), Softmax, reduce_mean.
- Every other op computes in the compute dtype; the model's output stays in it.
"""

from __future__ import annotations

from ..core.ir import FLOAT_DTYPES, Graph, Node, Tensor
from .rewrite import Precision, Rewrite

_ADDS = frozenset({"add", "bias_add"})
_CHAIN = frozenset({"reshape", "add", "bias_add", "transpose", "identity"})  # a projection's way to attention


def _made_of_parameters(t: Tensor | None) -> bool:
    return t is not None and t.kind in ("parameter", "constant")


def _variable(t: Tensor) -> bool:
    """A variable read (SavedModel) or an initializer (tf2onnx): what Keras's AutoCastVariable wraps."""
    return t.producer is None and t.dtype in FLOAT_DTYPES and (t.kind == "parameter" or "variable" in t.meta)


def _params_reach(t: Tensor, kind: str, depth: int = 6) -> bool:
    """Whether ``t`` is computed from parameters through an op of ``kind`` (BatchNorm's rsqrt)."""
    p = t.producer
    if p is None or depth == 0:
        return False
    return p.kind == kind or any(_params_reach(i, kind, depth - 1)
                                 for i in p.inputs if _made_of_parameters(i))


def _only_reader(t: Tensor) -> Node | None:
    readers = list(dict.fromkeys(t.consumers))
    return readers[0] if len(readers) == 1 else None


def _between(x: Tensor, root: Node) -> list[Node]:
    """The nodes on a path from ``x`` to ``root`` (root included)."""
    above, stack = set(), [root]
    while stack:
        n = stack.pop()
        if id(n) in above:
            continue
        above.add(id(n))
        stack.extend(i.producer for i in n.inputs if i is not None and i.producer is not None)
    out, seen, stack = [], set(), list(x.consumers)
    while stack:
        n = stack.pop()
        if id(n) in seen or id(n) not in above:
            continue
        seen.add(id(n))
        out.append(n)
        stack.extend(c for o in n.outputs if o is not None for c in o.consumers)
    return out


def _layer_norm(mean: Node) -> tuple[Tensor, list[Node], Node] | None:
    """Keras's moments LayerNorm at its first reduce_mean: x * inv + (shift - mean * inv), ``inv`` from
    rsqrt(mean((x - mean)^2) + eps); tf2onnx's spelling (x - mean, d * d, Reciprocal(Sqrt)) too."""
    x = mean.inputs[0]
    kinds = {c.kind for c in x.consumers}
    if not ({"squared_difference", "sub"} & kinds):
        return None
    for m in x.consumers:
        if m.kind != "mul" or not m.outputs:
            continue
        root = _only_reader(m.outputs[0])
        if root is None or root.kind not in _ADDS:
            continue
        nodes = _between(x, root)
        if mean in nodes and any(n.kind in ("rsqrt", "sqrt") for n in nodes):
            return x, nodes, root
    return None


def _batch_norm(mul: Node) -> tuple[Tensor, list[Node], Node] | None:
    """Keras's inference BatchNorm: x * (rsqrt(moving_variance + eps) * gamma) + (beta - ...)."""
    if len(mul.inputs) != 2 or not mul.outputs:
        return None
    for x, s in (mul.inputs, mul.inputs[::-1]):
        if x is None or _made_of_parameters(x) or not _made_of_parameters(s) or not _params_reach(s, "rsqrt"):
            continue
        root = _only_reader(mul.outputs[0])
        if root is not None and root.kind in _ADDS and all(
                i is mul.outputs[0] or _made_of_parameters(i) for i in root.inputs):
            return x, [mul, root], root
    return None


def _softmax(node: Node) -> tuple[Tensor, list[Node], Node]:
    """Softmax, with the score scaling Keras's attention computes in the softmax's float32 (x * c)."""
    nodes, x = [node], node.inputs[0]
    p = x.producer
    while p is not None and p.kind in ("mul", "div") and len(x.consumers) == 1 and len(p.inputs) == 2 \
            and _made_of_parameters(p.inputs[1]) and not _made_of_parameters(p.inputs[0]):
        nodes.insert(0, p)
        x = p.inputs[0]
        p = x.producer
    return x, nodes, node


def float32_regions(graph: Graph) -> list[tuple[Tensor, list[Node], Node]]:
    """Each part Keras computes in float32: (its input x, its nodes, the node whose output leaves it)."""
    regions, claimed = [], set()

    def take(r) -> None:
        if r is not None and not any(id(n) in claimed for n in r[1]):
            claimed.update(id(n) for n in r[1])
            regions.append(r)

    nodes = [n for n in graph.nodes if not n.meta.get("constant") and n.inputs and n.inputs[0] is not None]
    for n in nodes:
        if n.kind == "batch_norm":
            take((n.inputs[0], [n], n))
        elif n.kind == "mul":
            take(_batch_norm(n))
        elif n.kind == "reduce_mean" and not _made_of_parameters(n.inputs[0]):
            take(_layer_norm(n))
    for n in nodes:
        if n.kind == "softmax" and id(n) not in claimed:
            take(_softmax(n))
        elif n.kind == "reduce_mean" and id(n) not in claimed and not _made_of_parameters(n.inputs[0]):
            take((n.inputs[0], [n], n))  # ops.mean of float16 / bfloat16 computes in float32
    return regions


def _attention_argument(reader: Node) -> tuple | None:
    """MultiHeadAttention(query, value) reads a tensor through a query projection and a value projection
    that the key's defaults to: (the attention, "query" | "value") for a projection ``reader``."""
    t = reader.outputs[0] if reader.kind == "matmul" and reader.outputs else None
    for _ in range(6):
        nxt = _only_reader(t) if t is not None else None
        if nxt is None:
            return None
        if nxt.kind in ("einsum", "matmul") and all(not _made_of_parameters(i) for i in nxt.inputs):
            others = [i for i in nxt.inputs if i is not t]
            probs = others[0].producer if others else None
            if probs is not None and probs.kind == "cast" and probs.inputs[0].producer is not None:
                probs = probs.inputs[0].producer
            if probs is not None and probs.kind == "softmax":
                return id(probs), "value"
            s = _only_reader(nxt.outputs[0])
            while s is not None and s.kind in ("mul", "div", "cast"):
                s = _only_reader(s.outputs[0])
            if s is not None and s.kind == "softmax":  # scores = einsum(query, key)
                return id(s), ("query" if nxt.inputs[0] is t else "value")
            return None
        if nxt.kind not in _CHAIN:
            return None
        t = nxt.outputs[0]
    return None


def _cast(rw: Rewrite, x: Tensor, dtype: str, readers: list[Node]) -> Tensor:
    """A Cast as TensorFlow's graph has it: its shape as the graph knows it (a dim unknown there makes
    backward keep the tensor for its shape); a variable's cast is a weight-only op, made at each step."""
    y = rw.cast(x, dtype, readers)
    if "graph_shape" in x.meta:
        y.meta["graph_shape"] = x.meta["graph_shape"]
    elif x.kind == "input" and x.shape is not None:  # a signature's dims are numbers or None (named here)
        y.meta["graph_shape"] = tuple(d if isinstance(d, int) else None for d in x.shape)
    if _variable(x):
        y.kind, y.producer.meta["constant"] = "parameter", True
    return y


def apply_keras_policy(graph: Graph, name: str, low: str, rw: Rewrite, p: Precision) -> None:
    """Rewrite ``graph`` (a TensorFlow forward graph, in place) as Keras runs it under ``name``'s policy."""
    mixed = name.startswith("amp-")
    policy = ("mixed_" if mixed else "") + low
    if low == "float32":
        p.assumed.append("Keras float32 policy: the graph as exported; --device plays no part")
        return
    regions = float32_regions(graph)
    f32 = {id(n) for _, nodes, _ in regions for n in nodes}
    for node in reversed(graph.nodes):  # BatchNorm's and LayerNorm's parameter math feeds only float32
        readers = [c for o in node.outputs if o is not None for c in o.consumers]
        if id(node) not in f32 and readers and all(id(c) in f32 for c in readers) \
                and all(_made_of_parameters(i) for i in node.inputs if i is not None):
            f32.add(id(node))
    variables = [t for t in graph.tensors.values() if _variable(t)]
    if not mixed:
        for v in variables:
            v.dtype = low
    for v in variables:  # an AutoCastVariable: a cast at each read
        for reader in list(dict.fromkeys(v.consumers)):
            want = "float32" if id(reader) in f32 else low
            if v.dtype != want and reader.kind != "cast":
                _cast(rw, v, want, [reader])
    for x in graph.inputs:  # each layer argument that reads a float32 input casts it
        if x.dtype != "float32":
            continue
        groups: dict = {}
        for reader in dict.fromkeys(x.consumers):
            if id(reader) in f32 or reader.kind == "cast":
                continue
            role = _attention_argument(reader)
            groups.setdefault(role if role is not None else id(reader), []).append(reader)
        for readers in groups.values():
            _cast(rw, x, low, readers)
    for node in list(graph.nodes):
        if node.meta.get("precision_cast") or node.kind == "cast":
            continue
        dtype = "float32" if id(node) in f32 else low
        for t in node.outputs:
            if t is not None and t.dtype in FLOAT_DTYPES:
                t.dtype = dtype
    for x, nodes, root in regions:  # cast up on the way in, back to the compute dtype on the way out
        inside = {id(n) for n in nodes}
        if x.dtype != "float32":
            _cast(rw, x, "float32", [c for c in dict.fromkeys(x.consumers) if id(c) in inside])
        out = root.outputs[0]
        readers = [c for c in dict.fromkeys(out.consumers) if id(c) not in f32]
        if readers:
            _cast(rw, out, low, readers)
    p.assumed.append(f"Keras {policy} policy: variables {'float32' if mixed else low}, cast to {low} at "
                     f"each read; layer inputs cast to {low}; {len(regions)} BatchNorm, LayerNorm, "
                     "softmax and mean op(s) compute in float32 (cast up, cast back); --device plays no part")
