"""Attention by its form: softmax(q k^T s + bias) v, however an exporter spells it.

One walker instead of a list of op trees. From P @ V it walks back through the exporters' noise to the
Softmax, and from the Softmax's input through the score terms to Q @ K^T:

- after the softmax: no-op casts, Identity, Dropout and the exporters' NaN guard ``Where(IsNaN(P), 0, P)``
  (torch's scaled_dot_product_attention writes it: TorchScript when there is a mask, dynamo always);
- between the scores and the softmax: any number of additive terms (float masks, ALiBi, relative-position
  and disentangled terms, T5's bias: ``Add``), boolean masks (``Where(m, s, c)``), a scale on the product
  (``Mul``/``Div`` by a constant), a soft-cap ``tanh(s / c) c`` (Gemma2), a floor at the dtype's lowest
  value ``Max(s, finfo.min)`` (XGLM), and layout ops that keep the values (Reshape, Expand, Squeeze,
  Unsqueeze, Cast);
- on Q and K: a scale on each (sdpa writes ``q sqrt(s)`` and ``k^T sqrt(s)``), K's transpose (one Transpose,
  or dynamo's Reshape-Transpose-Reshape), grouped-query repeats (repeat_kv's Unsqueeze-Expand-Reshape, Tile)
  and past keys and values joined by a Concat (a KV cache).

An attention-shaped region (a Softmax between two matmuls) that the walk cannot read is a near miss,
named with the op that broke the form.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..core.ir import FLOAT_DTYPES, Graph, Node, Tensor
from ..core.trees import dataflow_order, is_noop
from .common import ADD

MATMULS = frozenset({"matmul", "einsum"})
# layout ops that keep every value of the scores (exporters put them between terms: BLOOM's Reshape)
LAYOUT = frozenset({"reshape", "expand", "squeeze", "unsqueeze", "identity", "cast", "flatten"})
PROB_LAYOUT = frozenset({"reshape", "squeeze", "unsqueeze", "flatten"})  # P viewed for a batched matmul
_MAX_STEPS = 64  # a score chain longer than this is no attention the exporters write
# max(s, c) with c at or below float16's lowest finite value (-65504) is no clamp any score meets: it only
# lifts a masked -inf to the dtype's lowest value (XGLM's and eager OPT's ``torch.max(s, finfo.min)``)
MASK_FLOOR = -65504.0


@dataclass
class AttentionForm:
    """One attention read from the graph: its nodes (data-flow order, P @ V last) and what they compute."""

    nodes: list[Node]
    roles: dict[str, Node]
    bound: dict[str, Tensor]
    q: Tensor  # the query as the attention reads it (before sdpa's sqrt-scale)
    k: Tensor  # the key, untransposed (after a grouped-query repeat)
    v: Tensor  # the value (after a grouped-query repeat)
    k_kv: Tensor | None = None  # K and V before their grouped-query repeat, when there is one
    v_kv: Tensor | None = None
    terms: list[Tensor] = field(default_factory=list)  # additive score terms (masks, position biases)
    bool_masks: list[Tensor] = field(default_factory=list)  # Where conditions
    scales: list[float] = field(default_factory=list)  # constant scales on q, k and the product
    softcap: float | None = None
    guard: bool = False  # the NaN guard after the softmax
    kv_cache: bool = False  # K and V joined with past keys and values

    @property
    def sdpa(self) -> bool:
        """Written by torch's scaled_dot_product_attention: the NaN guard, q and k^T scaled alike, K^T as
        dynamo's decomposition writes it (Reshape-Transpose-Reshape), or P @ V named after the aten op."""
        return self.guard or ("q_scale" in self.roles and "k_scale" in self.roles) \
            or "k_transpose_3d" in self.roles or "scaled_dot_product_attention" in self.roles["pv"].name

    @property
    def scale(self) -> float:
        return math.prod(self.scales)


@dataclass
class NearMiss:
    """An attention-shaped region that is no attention match, and what broke the form."""

    softmax: Node
    node: Node  # the op that broke it
    reason: str

    def to_json(self) -> dict:
        return {"softmax": self.softmax.name, "node": self.node.name, "op": self.node.op_type,
                "reason": self.reason}


def scalar_value(t: Tensor | None) -> float | None:
    """The value of a one-element constant, else None."""
    if t is None or t.kind not in ("parameter", "constant"):
        return None
    v = t.meta.get("value")
    if v is None or np.size(v) != 1:
        return None
    x = float(np.reshape(v, -1)[0])
    return x if math.isfinite(x) or x == -math.inf else None


def depends_on_input(t: Tensor, memo: dict[int, bool], limit: int = 4096) -> bool:
    """Whether ``t``'s value depends on a graph input's values (not only on shapes and constants)."""
    stack, seen, found = [t], [], False
    visited: set[int] = set()
    while stack and len(visited) < limit:
        x = stack.pop()
        if id(x) in visited:
            continue
        if id(x) in memo:
            if memo[id(x)]:
                found = True
                break
            continue
        visited.add(id(x))
        seen.append(x)
        if x.kind == "input":
            found = True
            break
        p = x.producer
        if p is None or p.kind in ("shape", "size"):
            continue
        stack.extend(i for i in p.inputs if i is not None)
    if not found:
        for x in seen:
            memo[id(x)] = False
    return found


def scale_value(t: Tensor | None) -> float | None:
    """A scale's value: a one-element constant's, NaN for a scalar computed from shapes alone (1 / sqrt(d)
    from Shape when the exporter did not fold it), None for anything else."""
    v = scalar_value(t)
    if v is not None or t is None or t.kind in ("parameter", "constant"):
        return v
    if t.shape is None or any(d != 1 for d in t.shape) or not t.is_float:
        return None
    return None if depends_on_input(t, {}, limit=64) else math.nan


def _arg(node: Node, i: int) -> Tensor | None:
    """``node``'s input ``i``, None when it has none there (a damaged file)."""
    return node.inputs[i] if i < len(node.inputs) else None


def _float(t: Tensor | None) -> bool:
    return t is not None and t.is_float


def _other(node: Node, t: Tensor) -> Tensor | None:
    ins = [x for x in node.inputs if x is not None]
    if len(ins) != 2:
        return None
    return ins[1] if ins[0] is t else ins[0] if ins[1] is t else None


def _is_nan_guard(node: Node) -> Tensor | None:
    """Where(IsNaN(x), c, x) -> x (the exporters' guard after SDPA's softmax), else None."""
    if node.kind != "where" or len(node.inputs) != 3 or any(t is None for t in node.inputs):
        return None
    cond, a, b = node.inputs
    p = cond.producer
    if p is None or p.op_type != "IsNaN" or not p.inputs or p.inputs[0] is not b:
        return None
    return b if scalar_value(a) is not None else None


class _Walk:
    """The nodes and roles collected while reading one attention."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.roles: dict[str, Node] = {}

    def take(self, node: Node, role: str | None = None) -> None:
        self.nodes.append(node)
        if role is not None and role not in self.roles:
            self.roles[role] = node


def _probs(pv: Node, w: _Walk) -> tuple[Node | None, bool]:
    """From P @ V back to the Softmax (through casts, Dropout and the NaN guard): (softmax, guarded)."""
    t, guard = pv.inputs[0], False
    for _ in range(8):
        p = t.producer if t is not None else None
        if p is None or p.outputs[0] is not t or p.meta.get("constant"):
            return None, guard
        if p.kind == "softmax":
            return p, guard
        x = _is_nan_guard(p)
        if x is not None:
            w.take(p, "guard")
            w.take(p.inputs[0].producer, "isnan")
            guard, t = True, x
        elif p.kind == "dropout" or is_noop(p) or _float_cast(p) or p.kind in PROB_LAYOUT:
            w.take(p, "dropout" if p.kind == "dropout" else None)
            t = _arg(p, 0)
        else:
            return None, guard
    return None, guard


def _float_cast(node: Node) -> bool:
    """A Cast of float probabilities to another float dtype: P in the dtype P @ V runs in (autocast's bf16
    copy of softmax's float32 output; ``softmax(x, dtype=float32).to(x.dtype)``)."""
    x = node.inputs[0] if node.kind == "cast" and node.inputs else None
    return x is not None and x.dtype in FLOAT_DTYPES and node.outputs[0].dtype in FLOAT_DTYPES


def _leads_to_product(t: Tensor, depth: int = 12) -> bool:
    """Whether the score chain from ``t`` reaches a product of two activations (q k^T)."""
    for _ in range(depth):
        p = None if t is None else t.producer
        if p is None or p.meta.get("constant") or p.outputs[0] is not t:
            return False
        if p.kind in MATMULS:
            return _is_product(p)
        if p.kind in LAYOUT or p.kind in ("mul", "div", "tanh"):
            t = _arg(p, 0) if p.kind not in ("mul",) else next(
                (x for x in p.inputs if x is not None and scale_value(x) is None), _arg(p, 0))
        elif p.kind in ADD:
            return any(x is not None and _leads_to_product(x, depth - 1) for x in p.inputs[:2])
        elif p.kind == "where" and len(p.inputs) == 3:
            t = p.inputs[1] if scalar_value(p.inputs[2]) is not None else p.inputs[2]
        else:
            return False
    return False


def _is_product(node: Node) -> bool:
    """A matmul of two activations (not a projection by a weight)."""
    ins = node.inputs
    return len(ins) == 2 and all(t is not None and t.kind in ("input", "activation") for t in ins)


def _scores(sm: Node, w: _Walk, form: dict) -> tuple[Node | None, Node, str]:
    """From the Softmax's input back to Q @ K^T, collecting terms, masks, scale and soft-cap.
    Returns (qk, the last node looked at, why it stopped when qk is None)."""
    t = _arg(sm, 0)
    node = sm
    for _ in range(_MAX_STEPS):
        if t is None:
            return None, node, f"{node.op_type} {node.name} reads no scores"
        p = t.producer
        if p is None or p.meta.get("constant"):
            return None, node, f"the scores {t.name} come from no op"
        node = p
        if p.outputs[0] is not t:
            return None, p, f"{p.op_type} {p.name} writes the scores as a second output"
        if p.kind in MATMULS:
            if not _is_product(p):
                return None, p, f"{p.op_type} {p.name} multiplies by a weight, not q by k^T"
            return p, p, ""
        if p.kind in LAYOUT:
            w.take(p)
            t = _arg(p, 0)
        elif p.kind in ADD:
            ins = [x for x in p.inputs if x is not None]
            main = next((x for x in ins if _leads_to_product(x)), None)
            if main is None:
                return None, p, f"no operand of {p.op_type} {p.name} leads to the q k^T product"
            w.take(p, "mask" if "mask" not in w.roles else "position_bias")
            form["terms"].extend(x for x in ins if x is not main)
            t = main
        elif p.kind == "where":
            cond, a, b = (p.inputs + [None] * 3)[:3]
            if scalar_value(b) is not None:
                t = a
            elif scalar_value(a) is not None:
                t = b
            else:
                return None, p, f"Where {p.name} selects between two tensors, not a score and a fill value"
            w.take(p, "mask")
            form["bool_masks"].append(cond)
        elif p.kind in ("mul", "div"):
            ins = [x for x in p.inputs if x is not None]
            c = scale_value(ins[1]) if len(ins) == 2 else None
            x = ins[0]
            if c is None and p.kind == "mul" and len(ins) == 2:
                c, x = scale_value(ins[0]), ins[1]
            if c is None or x is None:
                return None, p, f"{p.op_type} {p.name} scales the scores by a tensor, not a constant"
            tanh = x.producer
            if p.kind == "mul" and tanh is not None and tanh.kind == "tanh" and form["softcap"] is None:
                w.take(p, "softcap")  # tanh(s / c) * c: Gemma2's logit soft-capping
                w.take(tanh)
                form["softcap"] = c
                t = _arg(tanh, 0)
                continue
            if c == 0:
                return None, p, f"{p.op_type} {p.name} scales the scores by 0"
            w.take(p, "scale")
            form["scales"].append(c if p.kind == "mul" else 1.0 / c)
            t = x
        elif p.kind == "maximum" and _mask_floor(p) is not None:
            w.take(p, "mask_floor")
            t = _mask_floor(p)
        else:
            return None, p, f"{p.op_type} {p.name} between the scores and Softmax is no mask, bias or scale"
    return None, node, "the score chain is longer than any attention the exporters write"


def _mask_floor(node: Node) -> Tensor | None:
    """The scores of ``max(s, c)`` with a one-element constant c <= MASK_FLOOR, else None."""
    ins = [x for x in node.inputs if x is not None]
    if len(ins) != 2:
        return None
    for s, c in (ins, ins[::-1]):
        floor = scalar_value(c)
        if floor is not None and floor <= MASK_FLOOR and s.shape is not None and len(s.shape) >= 2:
            return s
    return None


def _scaled(t: Tensor, w: _Walk, role: str, form: dict) -> Tensor:
    """``t`` through a constant scale (sdpa's sqrt(s) on q and on k^T) and no-op casts."""
    for _ in range(4):
        p = t.producer
        if p is None or p.outputs[0] is not t or p.meta.get("constant"):
            return t
        if is_noop(p):
            w.take(p)
            t = p.inputs[0]
            continue
        if p.kind in ("mul", "div") and len(p.inputs) == 2:
            a, b = p.inputs
            c = scale_value(b)
            x = a
            if c is None and p.kind == "mul":
                c, x = scale_value(a), b
            if c is None or c == 0 or not _float(x):
                return t
            w.take(p, role)
            form["scales"].append(c if p.kind == "mul" else 1.0 / c)
            t = x
            continue
        return t
    return t


def _untransposed(kt: Tensor, w: _Walk) -> Tensor:
    """K from K^T: one Transpose, or dynamo's Reshape(Transpose(Reshape(k)))."""
    p = kt.producer
    if p is None or p.meta.get("constant"):
        return kt
    if p.kind == "transpose" and _arg(p, 0) is not None:
        w.take(p, "k_transpose")
        return p.inputs[0]
    if p.kind == "reshape":
        t = p.inputs[0].producer if _arg(p, 0) is not None else None
        ok = t is not None and t.kind == "transpose" and _arg(t, 0) is not None
        r = t.inputs[0].producer if ok else None
        if r is not None and r.kind == "reshape" and not r.meta.get("constant") and _arg(r, 0) is not None:
            w.take(p)
            w.take(t, "k_transpose_3d")
            w.take(r)
            return r.inputs[0]
    return kt


def _repeat(t: Tensor, w: _Walk, role: str) -> Tensor | None:
    """The tensor before a grouped-query repeat (Reshape(Expand(Unsqueeze(x))) or Tile), else None. A cast
    after the repeat (sdpa's autocast: enable_gqa's eager call casts K unrepeated) is looked through."""
    p = t.producer
    cast = None
    if p is not None and p.kind == "cast" and _arg(p, 0) is not None and p.inputs[0].producer is not None:
        cast, p = p, p.inputs[0].producer
    if p is None or p.meta.get("constant"):
        return None
    if p.kind == "tile":
        if _arg(p, 0) is None:
            return None
        for n in (p, cast):
            if n is not None:
                w.take(n, role if n is p else None)
        return p.inputs[0]
    if p.kind != "reshape" or _arg(p, 0) is None or p.inputs[0].producer is None:
        return None
    e = p.inputs[0].producer
    if e.kind not in ("expand", "tile") or _arg(e, 0) is None or e.inputs[0].producer is None:
        return None
    u = e.inputs[0].producer
    if u.kind != "unsqueeze" or u.meta.get("constant") or _arg(u, 0) is None:
        return None
    for n in (cast, p, e, u):
        if n is not None:
            w.take(n, role if n is e else None)
    return u.inputs[0]


# what an export reads a past key or value out of its input with: one of a packed (2, B, N, P, H) past
# (GPT-2's Gather(past, 0), a Split), the past key transposed, or a layout op
_PAST_VIEWS = LAYOUT | {"gather", "slice", "split", "transpose"}


def _cached(t: Tensor) -> bool:
    """K or V joined with past keys or values read from a graph input (a KV cache), directly or through
    up to three views of it."""
    p = t.producer
    return p is not None and p.kind == "concat" and any(_from_input(x) for x in p.inputs)


def _from_input(t: Tensor | None, depth: int = 3) -> bool:
    if t is None or t.kind == "input":
        return t is not None
    p = t.producer
    return depth > 0 and p is not None and p.kind in _PAST_VIEWS and not p.meta.get("constant") \
        and _arg(p, 0) is not None and _from_input(p.inputs[0], depth - 1)


def read_attention(pv: Node) -> AttentionForm | NearMiss | None:
    """The attention whose P @ V is ``pv``; a NearMiss when its form breaks; None when ``pv`` reads no
    softmax at all (not attention-shaped)."""
    if pv.kind not in MATMULS or pv.meta.get("constant") or len(pv.inputs) < 2 or pv.inputs[1] is None:
        return None
    w = _Walk()
    sm, guard = _probs(pv, w)
    if sm is None:
        return None
    form: dict = {"terms": [], "bool_masks": [], "scales": [], "softcap": None}
    w.take(sm, "softmax")
    qk, last, why = _scores(sm, w, form)
    if qk is None:
        return NearMiss(sm, last, why)
    w.take(qk, "qk")
    q = _scaled(qk.inputs[0], w, "q_scale", form)
    kt = _scaled(qk.inputs[1], w, "k_scale", form)
    k = _untransposed(kt, w) if qk.kind == "matmul" else kt
    v = pv.inputs[1]
    k_kv, v_kv = _repeat(k, w, "repeat_k"), _repeat(v, w, "repeat_v")
    w.take(pv, "pv")
    if not (_float(q) and _float(k) and _float(v)):
        return NearMiss(sm, qk, f"{qk.op_type} {qk.name} multiplies tensors that are not float")
    nodes = dataflow_order(w.nodes)
    bound = {"q": q, "k": k, "v": v}
    mask_role = w.roles.get("mask")
    if mask_role is not None:
        bound["mask"] = form["bool_masks"][0] if mask_role.kind == "where" else form["terms"][0]
    first_term = 0 if mask_role is None or mask_role.kind == "where" else 1
    if "position_bias" in w.roles and len(form["terms"]) > first_term:
        bound["position_bias"] = form["terms"][-1]
    return AttentionForm(nodes, w.roles, bound, q, k, v, k_kv, v_kv, form["terms"], form["bool_masks"],
                         form["scales"], form["softcap"], guard, _cached(k_kv or k) or _cached(v_kv or v))


def attention_match(pv: Node):
    """find_matches' finder: (nodes, roles, bound) of the attention at ``pv``, or None."""
    form = read_attention(pv)
    if not isinstance(form, AttentionForm):
        return None
    return form.nodes, form.roles, form.bound


def near_misses(graph: Graph, matched: set[int]) -> list[NearMiss]:
    """Attention-shaped regions (a Softmax whose probabilities a matmul reads) that are no attention match:
    why each broke. ``matched``: ids of the Softmax nodes of attention matches."""
    out: list[NearMiss] = []
    for node in graph.nodes:
        if node.kind != "softmax" or node.phase != "forward" or id(node) in matched \
                or node.meta.get("constant"):
            continue
        pv = _reader_matmul(node)
        if pv is None:
            continue
        form = read_attention(pv)
        if isinstance(form, NearMiss):
            out.append(form)
        elif form is None:
            out.append(NearMiss(node, pv, f"{pv.op_type} {pv.name} reads the probabilities through an op "
                                "that is no cast, dropout or NaN guard"))
        else:  # read, but not taken by the matcher (another pattern claimed it, or overlap)
            out.append(NearMiss(node, pv, "the form was read but not matched"))
    return out


_ELEMENTWISE = frozenset({"where", "cast", "identity", "dropout", "reshape", "mul", "div", "add"})


def _reader_matmul(sm: Node) -> Node | None:
    """The matmul that reads the softmax's output as its first operand, within a few elementwise steps."""
    frontier, seen = [sm.outputs[0]], 0
    while frontier and seen < 16:
        t = frontier.pop()
        seen += 1
        for c in t.consumers:
            if c.kind in MATMULS and c.inputs and c.inputs[0] is t:
                return c
            if c.kind in _ELEMENTWISE and c.outputs:
                frontier.append(c.outputs[0])
    return None


# -- what an additive attention_bias can take of the score terms (the kernels' and the labels' judge) -------
ABSORBING = -1e30  # a fill at or below this absorbs any score term added to it in float32 (ulp ~ 1e23)
MASKED = -1e4  # an additive term at or below this zeroes the probability (exp(-1e4) is 0 in float32)


def terms_refusal(form: AttentionForm, merged: bool,
                  kept: Callable[[Node], str | None] | None = None) -> str | None:
    """Why the score terms are more than the bias takes, else None: a mask and a position bias, one bool
    mask alone, or one bool mask with up to two terms where the mask's fill absorbs the scores (-inf or
    float32's lowest: s + c == c, so where(m, s, c) + t == s + where(m, 0, c) + t, GPT-2's causal Where
    with its padding mask). A fill that does not absorb (GPT-2's older -10000) differs where a row's every
    key is masked: the Where puts c in place of the score, an additive bias keeps s + c; so it is taken
    only where ``kept`` (the Where -> why not, else None) proves that no row is."""
    terms, wheres = len(form.terms), len(form.bool_masks)
    if (wheres == 0 and terms <= 2) or (wheres == 1 and terms == 0):
        return None
    where, fill = where_fill(form)
    if where is not None and terms <= 2 and fill is not None and fill <= ABSORBING:
        return None
    if where is not None and terms <= 2 and fill is not None:
        why = "its rows are not checked" if kept is None else kept(where)
        if why is None and fill <= MASKED:
            return None
        why = why or f"the fill {fill:g} does not hide a score (exp({fill:g}) is not 0 in float32)"
        plural = "s" if terms > 1 else ""
        return (f"a bool mask Where(m, s, {fill:g}) and {terms} additive term{plural}: where a row's every "
                f"key is masked the Where puts {fill:g} in place of the score, which an additive "
                f"attention_bias cannot (it keeps s + {fill:g}); a fill that absorbs the scores (-inf, "
                f"float32's lowest) is emitted, another only where no row is fully masked ({why})")
    return (f"{terms} additive terms and {wheres} bool masks: the emitter takes a mask and a position bias, "
            "or one bool mask whose fill absorbs up to two terms")


def where_fill(form: AttentionForm) -> tuple[Node | None, float | None]:
    """The one bool mask's Where and the constant it puts in place of masked scores (None, None: not one)."""
    if len(form.bool_masks) != 1:
        return None, None
    where = next((n for n in form.nodes if n.kind == "where" and n.inputs[0] is form.bool_masks[0]), None)
    if where is None:
        return None, None
    fill = scalar_value(where.inputs[2])
    return where, scalar_value(where.inputs[1]) if fill is None else fill
