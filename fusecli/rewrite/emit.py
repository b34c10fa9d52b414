"""One match -> the ONNX Runtime nodes that replace it (an Emission), or None where no kernel fits.

Kernels (schemas as onnxruntime's ``get_all_operator_schema`` lists them; CPU kernels are float32):
FusedConv(X, W, B?, Z?; activation, activation_params), FusedGemm(A, B, C?; activation,
activation_alpha/beta), FusedMatMul(A, B; alpha), Gelu(X), FastGelu(X, bias?), BiasGelu(A, B),
SkipLayerNormalization(input, skip, gamma, beta?, bias?; epsilon), all com.microsoft; and
LayerNormalization(X, Scale, B?; axis, epsilon) in the ONNX domain (ONNX's from opset 17, onnxruntime's
own registration of the same op below that). ``--target cuda`` keeps to what the CUDA provider has:
FusedConv with Relu only, no FusedGemm. Where the activation has no kernel, the foldable part is still
folded (Conv with BatchNorm or bias folded, Gemm) and the activation kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import FuseError
from ..fusion.match import Match
from ..fusion.patterns import swaps_last_two
from ..ir import Node, Tensor
from .fold import channel_vector, fold_batch_norm, fold_bias, fold_scale_shift
from .values import Names, Weights

MS = "com.microsoft"
FLT_MAX = float(np.finfo(np.float32).max)


@dataclass
class Context:
    """What an emitter may read: the target, the mode, weights, and the IR-name -> NodeProto map."""

    target: str
    mode: str
    opset: int
    weights: Weights
    names: Names
    protos: dict[str, onnx.NodeProto]
    graph_outputs: set[str]
    claimed: set[str] = field(default_factory=set)  # IR node names already rewritten in this pass
    skipped: list[str] = field(default_factory=list)  # matches an emitter could not rewrite, and why
    by_root: dict[str, Match] = field(default_factory=dict)  # this pass's matches by root node name
    excluded: set[str] = field(default_factory=set)  # "pattern at root" failed verification: left unfused


@dataclass
class Emission:
    """New nodes that replace ``remove`` (IR node names); the first node's output order is kept."""

    pattern: str
    kernel: str
    remove: list[str]
    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    at: str = ""  # the match's root node (set by plan), for the messages


def emit(m: Match, ctx: Context) -> Emission | None:
    """The Emission for ``m`` on ctx's target and mode, or None."""
    fn = EMITTERS.get(m.pattern.name)
    if fn is None or any(n.domain not in ("", "ai.onnx") or n.name not in ctx.protos for n in m.nodes):
        return None
    return fn(m, ctx)


# -- helpers ---------------------------------------------------------------------------------------
def _out(node: Node) -> str:
    return node.outputs[0].name


def _dtype(m: Match) -> str:
    return m.root.outputs[0].dtype


def _attrs(proto: onnx.NodeProto) -> list[onnx.AttributeProto]:
    return list(proto.attribute)


_ATTR_KINDS = {onnx.AttributeProto.FLOAT: "a float", onnx.AttributeProto.INT: "an int",
               onnx.AttributeProto.STRING: "a string", onnx.AttributeProto.INTS: "a list of ints",
               onnx.AttributeProto.FLOATS: "a list of floats"}


def _attr(proto: onnx.NodeProto, name: str, default=None):
    """An attribute's value, of the kind its default has (a number, a string; a list of ints where the
    default is None); FuseError naming the node when the file holds another kind."""
    a = next((a for a in proto.attribute if a.name == name), None)
    if a is None:
        return default
    A = onnx.AttributeProto
    want = ((A.FLOAT, A.INT) if isinstance(default, (int, float)) else (A.STRING,) if isinstance(default, str)
            else (A.INTS,))
    if a.type not in want:
        raise FuseError(f"node {proto.name or proto.op_type!r}: attribute {name!r} is "
                        f"{_ATTR_KINDS.get(a.type, A.AttributeType.Name(a.type).lower())}, "
                        f"not {' or '.join(_ATTR_KINDS[k] for k in want)}")
    value = helper.get_attribute_value(a)
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _node(op: str, inputs: list[str], output: str, name: str, domain: str = "",
          attrs: list[onnx.AttributeProto] = (), **kw) -> onnx.NodeProto:
    while inputs and not inputs[-1]:
        inputs = inputs[:-1]  # trailing absent optional inputs
    n = helper.make_node(op, inputs, [output], name, domain=domain or None, **kw)
    n.attribute.extend(attrs)
    return n


def _new_init(ctx: Context, base: str, value: np.ndarray, out: list[onnx.TensorProto]) -> str:
    name = ctx.names.new(base)
    out.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
    return name


# the helpers the kernel family modules use, by their public names
attr_value, make_node, new_initializer = _attr, _node, _new_init


def _other(node: Node, t: Tensor) -> Tensor:
    """The input of a two-input node that is not ``t``."""
    a, b = node.inputs[0], node.inputs[1]
    return b if a is t else a


def _param_of(node: Node) -> Tensor:
    """The constant operand of a bias_add (the loader records which input it is)."""
    return node.inputs[node.meta.get("bias_input", 1)]


def _unused_extra_outputs(node: Node, ctx: Context) -> bool:
    return all(t is None or (not t.consumers and t.name not in ctx.graph_outputs) for t in node.outputs[1:])


def _same_shape(a: Tensor, b: Tensor) -> bool:
    return a.shape is not None and b.shape is not None and a.shape_known and tuple(a.shape) == tuple(b.shape)


def _clip_bounds(act: Node, ctx: Context) -> tuple[float, float] | None:
    """Clip's (min, max) as numbers (absent bounds are -/+FLT_MAX), None when they are not constants."""
    p = ctx.protos[act.name]
    if ctx.opset < 11:
        return float(_attr(p, "min", -FLT_MAX)), float(_attr(p, "max", FLT_MAX))
    bounds = []
    for i, default in ((1, -FLT_MAX), (2, FLT_MAX)):
        name = p.input[i] if len(p.input) > i else ""
        if not name:
            bounds.append(default)
            continue
        v = ctx.weights.value(name)
        if v is None or v.size != 1:
            return None
        bounds.append(float(v.reshape(-1)[0]))
    return bounds[0], bounds[1]


def conv_activation(act: Node, ctx: Context) -> tuple[str, list[float]] | None:
    """FusedConv's activation and activation_params for ``act``, or None where the target has none."""
    p = ctx.protos[act.name]
    if act.kind == "relu" and (act.op_type == "Relu" or _clip_bounds(act, ctx) == (0.0, FLT_MAX)):
        return "Relu", []
    if ctx.target == "cuda":
        return None  # the CUDA FusedConv kernel takes Relu only
    if act.kind == "leaky_relu":
        return "LeakyRelu", [float(_attr(p, "alpha", 0.01))]
    if act.kind in ("sigmoid", "tanh"):
        return act.op_type, []
    if act.kind == "hard_sigmoid":
        return "HardSigmoid", [float(_attr(p, "alpha", 0.2)), float(_attr(p, "beta", 0.5))]
    if act.kind in ("relu6", "clip", "relu") and act.op_type == "Clip":
        bounds = _clip_bounds(act, ctx)
        return None if bounds is None else ("Clip", list(bounds))
    return None


def gemm_activation(act: Node, ctx: Context) -> dict | None:
    """FusedGemm's activation attributes for ``act`` (CPU only), or None."""
    p = ctx.protos[act.name]
    if ctx.target != "cpu":
        return None
    if act.kind == "relu" and (act.op_type == "Relu" or _clip_bounds(act, ctx) == (0.0, FLT_MAX)):
        return {"activation": "Relu"}
    if act.kind in ("sigmoid", "tanh"):
        return {"activation": act.op_type}
    if act.kind == "leaky_relu":
        return {"activation": "LeakyRelu", "activation_alpha": float(_attr(p, "alpha", 0.01))}
    if act.kind == "elu":
        return {"activation": "Elu", "activation_alpha": float(_attr(p, "alpha", 1.0))}
    if act.kind == "hard_sigmoid":
        return {"activation": "HardSigmoid", "activation_alpha": float(_attr(p, "alpha", 0.2)),
                "activation_beta": float(_attr(p, "beta", 0.5))}
    return None


# -- Conv family: conv_bias(_add)_act, conv_bias, conv_bn(_act), conv_squeeze_bias ------------------------
def _fold_bn(m: Match, W: np.ndarray, B: np.ndarray | None, rank: int, ctx: Context):
    bn = m.roles["bn"]
    if bn.kind == "batch_norm":
        p = ctx.protos[bn.name]
        if _attr(p, "training_mode", 0) or _attr(p, "spatial", 1) != 1 or not _unused_extra_outputs(bn, ctx):
            return None
        params = [ctx.weights.value(n) for n in p.input[1:5]]
        if len(params) != 4 or any(v is None for v in params):
            return None
        vecs = [channel_vector(v, 1, W.shape[0], axis=0) for v in params]
        if any(v is None for v in vecs):
            return None
        return fold_batch_norm(W, B, *vecs, float(_attr(p, "epsilon", 1e-5)))
    scale_node = m.roles["bn_scale"]  # Keras 3: x * (gamma rsqrt(var + eps)) + (beta - mean * scale)
    s = ctx.weights.value(_other(scale_node, m.roles["conv"].outputs[0]).name)
    if bn.kind == "sub":
        shift_t, sign = bn.inputs[1], -1.0
    else:
        shift_t, sign = _param_of(bn), 1.0
    t = ctx.weights.value(shift_t.name)
    if s is None or t is None:
        return None
    s, t = channel_vector(s, rank, W.shape[0]), channel_vector(t, rank, W.shape[0])
    if s is None or t is None:
        return None
    return fold_scale_shift(W, B, s, sign * t)


def _squeeze_axes(sq: Node, ctx: Context) -> list[int] | None:
    p = ctx.protos[sq.name]
    axes = _attr(p, "axes")
    if axes is None and len(p.input) > 1 and p.input[1]:
        v = ctx.weights.value(p.input[1])
        axes = None if v is None else [int(a) for a in v.reshape(-1)]
    return None if axes is None else list(axes)


def _conv_family(m: Match, ctx: Context) -> Emission | None:
    if "layout" in m.roles or "act_gate" in m.roles:
        return None  # through a layout Transpose, or a silu-family act: no FusedConv form for it yet
    conv = m.roles["conv"]
    cp = ctx.protos[conv.name]
    w_t = conv.inputs[1]
    if w_t.shape is None or not w_t.is_static:
        return None
    c_out, rank, dtype = w_t.shape[0], len(w_t.shape), conv.outputs[0].dtype
    w_name, b_name = cp.input[1], (cp.input[2] if len(cp.input) > 2 else "")
    bn, bias, squeeze = m.roles.get("bn"), m.roles.get("bias"), m.roles.get("squeeze")
    inits: list[onnx.TensorProto] = []
    folded, last = [], conv  # what was folded in, and the last node folded
    if bn is not None:
        if ctx.mode != "inference":
            return None  # BatchNorm is never folded for training
        W = ctx.weights.value(w_name)
        B = ctx.weights.value(b_name) if b_name else None
        if W is None or (b_name and B is None):
            return None
        wb = _fold_bn(m, W, B, rank, ctx)
        if wb is None:
            return None
        w_name = _new_init(ctx, f"{cp.input[1]}_bn_folded", wb[0], inits)
        b_name = _new_init(ctx, f"{conv.name}_bias_bn_folded", wb[1], inits)
        folded.append("BatchNorm")
        last = bn
    if bias is not None:
        out_rank, ok = rank, True
        if squeeze is not None:
            axes = _squeeze_axes(squeeze, ctx)
            ok = axes is not None and all(a % rank >= 2 for a in axes)
            out_rank = rank - len(axes or ())
        value = ctx.weights.value(_param_of(bias).name)
        vec = None if value is None or not ok else channel_vector(value, out_rank, c_out)
        B = ctx.weights.value(b_name) if b_name else None
        if vec is None or (b_name and B is None):
            return None
        b_name = _new_init(ctx, f"{conv.name}_bias_folded", fold_bias(B, vec, vec.dtype), inits)
        folded.append("bias")
        last = bias
    act, add = m.roles.get("act"), m.roles.get("add")
    spec = conv_activation(act, ctx) if act is not None else None
    fuse = spec is not None and dtype == "float32" and (ctx.target == "cpu" or rank == 4)
    z = ""
    if fuse and add is not None:
        z_t = _other(add, _out_tensor(last))
        fuse = _same_shape(z_t, add.outputs[0]) and z_t.dtype == dtype
        z = z_t.name
    attrs = _attrs(cp)
    if fuse:
        if not b_name and ctx.target == "cuda":  # give the cuDNN path its bias
            b_name = _new_init(ctx, f"{conv.name}_zero_bias", np.zeros(c_out, np.float32), inits)
        kw = {"activation": spec[0]}
        if spec[1]:
            kw["activation_params"] = spec[1]
        node = _node("FusedConv", [cp.input[0], w_name, b_name, z], _out(m.root), conv.name, MS, attrs, **kw)
        return Emission(m.pattern.name, f"FusedConv({spec[0]}{', Z' if z else ''})",
                        [n.name for n in m.nodes], [node], inits)
    if not folded:
        return None
    remove = [n.name for n in m.nodes if n is conv or n is bias or n is bn or n is m.roles.get("bn_scale")]
    kernel = f"Conv({' + '.join(folded)} folded)"
    if squeeze is not None:
        sp = ctx.protos[squeeze.name]
        nodes = [_node("Conv", [cp.input[0], w_name, b_name], _out(conv), conv.name, "", attrs),
                 _node("Squeeze", list(sp.input), _out(bias), squeeze.name, "", _attrs(sp))]
        return Emission(m.pattern.name, kernel, remove + [squeeze.name], nodes, inits)
    node = _node("Conv", [cp.input[0], w_name, b_name], _out(last), conv.name, "", attrs)
    return Emission(m.pattern.name, kernel, remove, [node], inits)


def _out_tensor(node: Node) -> Tensor:
    return node.outputs[0]


# -- MatMul family: matmul_bias(_act) -> Gemm / FusedGemm, matmul_scale -> FusedMatMul ----------------------
def _matmul_family(m: Match, ctx: Context) -> Emission | None:
    if "act_gate" in m.roles:
        return None  # a silu-family act spans two nodes: no FusedGemm activation for it
    mm, act, bias = m.roles["matmul"], m.roles.get("act"), m.roles.get("bias")
    p = ctx.protos[mm.name]
    spec = gemm_activation(act, ctx) if act is not None and _dtype(m) == "float32" else None
    if mm.kind == "gemm":
        if spec is None:
            return None
        node = _node("FusedGemm", list(p.input), _out(m.root), mm.name, MS, _attrs(p), **spec)
        return Emission(m.pattern.name, f"FusedGemm({spec['activation']})", [n.name for n in m.nodes], [node])
    a, b = mm.inputs[0], mm.inputs[1]
    param = _param_of(bias)
    two_d = a.shape is not None and len(a.shape) == 2 and b.shape is not None and len(b.shape) == 2 \
        and param.shape is not None and len(param.shape) <= 2 and _same_shape(bias.outputs[0], mm.outputs[0])
    inputs = [p.input[0], p.input[1], param.name]
    if two_d and spec is not None:
        node = _node("FusedGemm", inputs, _out(m.root), mm.name, MS, **spec)
        return Emission(m.pattern.name, f"FusedGemm({spec['activation']})", [n.name for n in m.nodes], [node])
    if act is not None and act.op_type == "Gelu" and _dtype(m) == "float32":  # ONNX's Gelu op (opset 20)
        inits: list = []
        vec = _last_axis_vector(ctx, param, bias.outputs[0], inits)
        if vec is not None:  # MatMul kept; bias + Gelu -> BiasGelu (FastGelu for the tanh approximation)
            op = "FastGelu" if _attr(ctx.protos[act.name], "approximate", "none") == "tanh" else "BiasGelu"
            node = _node(op, [_out(mm), vec], _out(m.root), act.name, MS)
            return Emission(m.pattern.name, op, [bias.name, act.name], [node], inits)
    if not two_d:
        return None
    node = _node("Gemm", inputs, _out(bias), mm.name)
    return Emission(m.pattern.name, "Gemm", [mm.name, bias.name], [node])


def _matmul_scale(m: Match, ctx: Context) -> Emission | None:
    mm, sc = m.roles["matmul"], m.roles["scale"]
    if _dtype(m) != "float32":
        return None
    consts = [i for i, t in enumerate(sc.inputs[:2]) if t.kind in ("parameter", "constant")]
    if len(consts) != 1 or (sc.kind == "div" and consts != [1]):
        return None
    c_t = sc.inputs[consts[0]]
    c, x_t = ctx.weights.value(c_t.name), sc.inputs[1 - consts[0]]
    if c is None or c.size != 1 or float(c.reshape(-1)[0]) == 0.0:
        return None
    alpha = float(c.reshape(-1)[0])
    alpha = 1.0 / alpha if sc.kind == "div" else alpha
    a, b = mm.inputs[0], mm.inputs[1]
    scaled = sc.outputs[0]
    if a is scaled and b is scaled:
        return None
    if a is scaled:
        a = x_t
    elif b is scaled:
        b = x_t
    if any(t.shape is None or len(t.shape) < 2 for t in (a, b)) or c.ndim > len(x_t.shape or ()):
        return None
    # a swap of the last two axes on the scaled operand (q @ (k^T / sqrt d)) is read in place too, as ONNX
    # Runtime's MatMulScaleFusion + MatMulTransposeFusion make one FusedMatMul; the Transpose, if nothing
    # else reads it, is pruned
    flags = {}
    for key, t in (("transA", a), ("transB", b)):
        p = t.producer
        if t is x_t and p is not None and p.kind == "transpose" and swaps_last_two(p) and p.inputs \
                and p.inputs[0] is not None and p.inputs[0].shape is not None and len(p.inputs[0].shape) >= 2:
            flags[key] = 1
    a = a.producer.inputs[0] if "transA" in flags else a
    b = b.producer.inputs[0] if "transB" in flags else b
    node = _node("FusedMatMul", [a.name, b.name], _out(m.root), mm.name, MS, alpha=alpha, **flags)
    kernel = "FusedMatMul" + "".join(f"({k})" for k in flags)
    return Emission(m.pattern.name, kernel, [n.name for n in m.nodes], [node])


def _matmul_transpose(m: Match, ctx: Context) -> Emission | None:
    """x @ Transpose(w) -> FusedMatMul(x, w, transB=1): the GEMM reads w in place (the Transpose, no
    longer read, is pruned)."""
    mm = m.roles["matmul"]
    a, w = mm.inputs[0], mm.inputs[1].producer.inputs[0]  # the Transpose: a weight's view, or in the match
    if _dtype(m) != "float32" or any(t.shape is None or len(t.shape) < 2 for t in (a, w)):
        return None
    node = _node("FusedMatMul", [a.name, w.name], _out(m.root), mm.name, MS, transB=1)
    return Emission(m.pattern.name, "FusedMatMul(transB)", [n.name for n in m.nodes], [node])


# -- GELU ----------------------------------------------------------------------------------------------
def _last_axis_vector(ctx: Context, param: Tensor, x: Tensor, inits: list) -> str | None:
    """A 1-D bias along x's last axis: the param's own name, or a reshaped copy; None if it is not one."""
    if x.shape is None or not x.shape or not isinstance(x.shape[-1], int):
        return None
    value = ctx.weights.value(param.name)
    vec = None if value is None else channel_vector(value, len(x.shape), x.shape[-1], len(x.shape) - 1)
    if vec is None:
        return None
    return param.name if value.shape == vec.shape else _new_init(ctx, f"{param.name}_1d", vec, inits)


def _gelu(m: Match, ctx: Context) -> Emission | None:
    if _dtype(m) != "float32":
        return None
    tanh = any(n.kind == "tanh" for n in m.nodes)
    x = m.bound["x"]
    remove = [n.name for n in m.nodes]
    name = m.roles["gelu"].name
    if m.pattern.name == "bias_gelu":
        bnode, inits = x.producer, []
        bias = _last_axis_vector(ctx, _param_of(bnode), x, inits)
        if bias is not None:
            a = _other(bnode, _param_of(bnode)).name
            op = "FastGelu" if tanh else "BiasGelu"
            return Emission(m.pattern.name, op, remove, [_node(op, [a, bias], _out(m.root), name, MS)], inits)
        remove = [n for n in remove if n != bnode.name]  # a bias off the last axis stays an Add
    op = "FastGelu" if tanh else "Gelu"
    return Emission(m.pattern.name, op, remove, [_node(op, [x.name], _out(m.root), name, MS)])


# -- LayerNorm -----------------------------------------------------------------------------------------
def _reduce_axes(node: Node, ctx: Context) -> list[int] | None:
    p = ctx.protos[node.name]
    if _attr(p, "keepdims", 1) != 1:
        return None
    axes = _attr(p, "axes")
    if axes is None and len(p.input) > 1 and p.input[1]:
        v = ctx.weights.value(p.input[1])
        axes = None if v is None else [int(a) for a in v.reshape(-1)]
    return None if axes is None else list(axes)


@dataclass
class _Norm:
    x: Tensor
    axis: int  # first normalized axis, non-negative
    eps: float
    gamma: Tensor | None
    beta: Tensor | None


def _decomposed(m: Match, ctx: Context) -> _Norm | None:
    """x, axis, eps, gamma and beta of a decomposed LayerNorm match ((x - mean) / sqrt(var + eps) forms)."""
    x, d = m.bound.get("x"), m.bound.get("d")
    if "ln_inv" in m.roles:
        return _moments(m, ctx)
    if x is None or d is None or "normalize" not in m.roles or x.shape is None:
        return None  # TensorFlow's own moments form (Rsqrt, SquaredDifference) never comes out of ONNX
    first = _normalized_axis(m, ctx, len(x.shape))
    if first is None:
        return None
    normalize = m.roles["normalize"]
    eps_add = normalize.inputs[1].producer.inputs[0].producer
    eps_t = next((t for t in eps_add.inputs if t.kind in ("parameter", "constant")), None)
    eps = None if eps_t is None else ctx.weights.value(eps_t.name)
    if eps is None or eps.size != 1 or d.producer is None:
        return None
    gamma = beta = None
    affine = m.roles.get("layer_norm")
    if affine is not None:
        mul = next(t.producer for t in affine.inputs if t.producer is not None and t.producer.kind == "mul")
        gamma, beta = _other(mul, normalize.outputs[0]), _other(affine, mul.outputs[0])
    return _Norm(x, first, float(eps.reshape(-1)[0]), gamma, beta)


def _normalized_axis(m: Match, ctx: Context, rank: int) -> int | None:
    """The first normalized axis when the match's two ReduceMeans (mean, variance) both reduce the same
    trailing axes, else None."""
    means = [n for n in m.nodes if n.kind == "reduce_mean"]
    axes = [_reduce_axes(n, ctx) for n in means]
    if len(means) != 2 or any(a is None for a in axes):
        return None
    norm_axes = [sorted(a % rank for a in ax) for ax in axes]
    first = norm_axes[0][0] if norm_axes[0] else rank
    if norm_axes[0] != norm_axes[1] or norm_axes[0] != list(range(first, rank)) or first >= rank:
        return None
    return first


def _moments(m: Match, ctx: Context) -> _Norm | None:
    """x, axis, eps, gamma and beta of tf2onnx's moments LayerNorm: x * inv + (beta - mean * inv),
    inv = gamma / sqrt(mean((x - mean)^2) + eps), both means over the same trailing axes."""
    x = m.bound.get("x")
    if x is None or x.shape is None:
        return None
    first = _normalized_axis(m, ctx, len(x.shape))
    if first is None:
        return None
    eps_add, inv = m.roles["ln_eps"], m.roles["ln_inv"]
    eps_t = next((t for t in eps_add.inputs if t.kind in ("parameter", "constant")), None)
    eps = None if eps_t is None else ctx.weights.value(eps_t.name)
    if eps is None or eps.size != 1:
        return None
    gamma = next((t for t in inv.inputs if t.kind == "parameter" or t.kind == "constant"), None) \
        if inv.kind == "mul" else None
    shift = m.roles.get("ln_shift")
    beta = None if shift is None else next(t for t in shift.inputs if t.kind in ("parameter", "constant"))
    return _Norm(x, first, float(eps.reshape(-1)[0]), gamma, beta)


def _affine_param(ctx: Context, t: Tensor | None, x: Tensor, axis: int, fill: float | None,
                  inits: list) -> str | None:
    """gamma or beta shaped as x.shape[axis:] (the param's own name when it already is); '' if absent."""
    norm_shape = tuple(x.shape[axis:])
    if not all(isinstance(d, int) for d in norm_shape):
        return None
    if t is None:
        if fill is None:
            return ""
        return _new_init(ctx, f"{x.name}_ln_scale", np.full(norm_shape, fill, np.float32), inits)
    value = ctx.weights.value(t.name)
    if value is None or value.ndim > len(x.shape):
        return None
    lead = value.ndim - len(norm_shape)
    if lead > 0 and any(d != 1 for d in value.shape[:lead]):
        return None
    core = value.reshape(value.shape[lead:]) if lead > 0 else value
    try:
        full = np.broadcast_to(core, norm_shape)
    except ValueError:
        return None
    if value.shape == norm_shape:
        return t.name
    return _new_init(ctx, f"{t.name}_ln", np.ascontiguousarray(full), inits)


def _layer_norm(m: Match, ctx: Context) -> Emission | None:
    if _dtype(m) != "float32":
        return None
    n = _decomposed(m, ctx)
    if n is None:
        return None
    inits: list = []
    scale = _affine_param(ctx, n.gamma, n.x, n.axis, 1.0, inits)
    bias = _affine_param(ctx, n.beta, n.x, n.axis, None, inits)
    if scale is None or bias is None:
        return None
    node = _node("LayerNormalization", [n.x.name, scale, bias], _out(m.root), m.root.name,
                 axis=n.axis - len(n.x.shape), epsilon=n.eps)
    return Emission(m.pattern.name, "LayerNormalization", [x.name for x in m.nodes], [node], inits)


def _skip_operands(add: Node) -> tuple[Tensor, Tensor] | None:
    """(input, skip) of the residual Add: input has the full shape, skip the same or (1, S, H) / (S, H)."""
    out = add.outputs[0]
    a, b = add.inputs[0], add.inputs[1]
    for x, s in ((a, b), (b, a)):
        if not _same_shape(x, out) or s.shape is None or not s.shape_known:
            continue
        full = tuple(out.shape)
        if tuple(s.shape) == full or (len(full) == 3 and tuple(s.shape) in ((1, *full[1:]), full[1:])):
            return x, s
    return None


def _absorb_bias(ctx: Context, m: Match, x: Tensor, inits: list) -> tuple[Tensor, str, str] | None:
    """(y, bias name, bias node name) when x = y + bias (last axis) can join the kernel."""
    p = x.producer
    if p is None or p.kind != "bias_add" or p.domain not in ("", "ai.onnx") or p.name in ctx.claimed \
            or p.name not in ctx.protos or any(n is p for n in m.nodes) or len(x.consumers) != 1 \
            or x.name in ctx.graph_outputs:
        return None
    y = _other(p, _param_of(p))
    if not _same_shape(y, x):
        return None
    bias = _last_axis_vector(ctx, _param_of(p), x, inits)
    return None if bias is None else (y, bias, p.name)


def _skip_layer_norm(m: Match, ctx: Context) -> Emission | None:
    if _dtype(m) != "float32" or "skip_layout" in m.roles:
        return None  # a Reshape between the sum and the norm: the kernel's sum output has another shape
    inits: list = []
    if "add" in m.roles:  # Add + LayerNormalization op
        add, ln = m.roles["add"], m.roles["layer_norm"]
        p = ctx.protos[ln.name]
        x = add.outputs[0]
        if x.shape is None or _attr(p, "axis", -1) % len(x.shape) != len(x.shape) - 1 \
                or not _unused_extra_outputs(ln, ctx):
            return None
        norm = _Norm(x, len(x.shape) - 1, float(_attr(p, "epsilon", 1e-5)), ln.inputs[1], ln.input(2))
    else:
        norm = _decomposed(m, ctx)
        if norm is None or norm.axis != len(norm.x.shape) - 1:
            return None
        add = norm.x.producer
    operands = _skip_operands(add)
    gamma = _affine_param(ctx, norm.gamma, norm.x, norm.axis, 1.0, inits)
    beta = _affine_param(ctx, norm.beta, norm.x, norm.axis, None, inits)
    if gamma is None or beta is None:
        return None
    if operands is None:  # shapes do not prove the skip's broadcast: LayerNorm alone, the Add kept
        if "add" in m.roles:
            return None  # already a LayerNormalization op
        node = _node("LayerNormalization", [norm.x.name, gamma, beta], _out(m.root), m.root.name,
                     axis=-1, epsilon=norm.eps)
        return Emission(m.pattern.name, "LayerNormalization", [n.name for n in m.nodes if n is not add],
                        [node], inits)
    inp, skip = operands
    remove = [n.name for n in m.nodes]
    bias, kernel = "", "SkipLayerNormalization"
    absorbed = _absorb_bias(ctx, m, inp, inits)
    if absorbed is None and _same_shape(skip, inp):
        absorbed = _absorb_bias(ctx, m, skip, inits)
        if absorbed is not None:
            inp, skip = skip, inp
    if absorbed is not None:
        inp, bias, bias_node = absorbed
        remove.append(bias_node)
        kernel += " (bias)"
    node = _node("SkipLayerNormalization", [inp.name, skip.name, gamma, beta, bias], _out(m.root),
                 m.root.name, MS, epsilon=norm.eps)
    inside = {id(n) for n in m.nodes}
    total = add.outputs[0]
    if total.name in ctx.graph_outputs or any(id(c) not in inside for c in total.consumers):
        node.output.extend(["", "", total.name])  # pre-LN: the sum is read again, the kernel's 4th output
    return Emission(m.pattern.name, kernel, remove, [node], inits)


EMITTERS: dict[str, Callable[[Match, Context], Emission | None]] = {
    "conv_bias_add_act": _conv_family, "conv_bias_act": _conv_family, "conv_bias": _conv_family,
    "conv_bn_act": _conv_family, "conv_bn": _conv_family, "conv_squeeze_bias": _conv_family,
    "matmul_bias_act": _matmul_family, "matmul_bias": _matmul_family, "matmul_scale": _matmul_scale,
    "matmul_transpose": _matmul_transpose,
    "gelu": _gelu, "bias_gelu": _gelu, "layer_norm": _layer_norm, "skip_layer_norm": _skip_layer_norm,
}


def _register() -> None:
    """The kernel families in their own modules (they import this one's helpers) join the table."""
    from . import emit_acts, emit_attention, emit_layout, emit_norms, emit_rotary

    for module in (emit_acts, emit_attention, emit_norms, emit_layout, emit_rotary):
        EMITTERS.update(module.EMITTERS)


_register()
