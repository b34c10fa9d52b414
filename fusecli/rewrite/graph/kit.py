"""The emitter kit: what a kernel emitter reads (Context) and writes (Emission), and the node, attribute and
initializer helpers every kernel family shares. It imports no emitter, so any family module may import it;
it sits in graph/ because the edits that apply an Emission (edit, sound, shape_reads) read it too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ...core.budgets import check_elements
from ...core.errors import FuseError
from .fold import channel_vector

if TYPE_CHECKING:
    import onnx

    from ...core.ir import Node, Tensor
    from ...fusion.match import Match
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
    sizes: Mapping[str, int] = field(default_factory=dict)  # the analysis's dim values (unk symbols too)


@dataclass
class Emission:
    """New nodes that replace ``remove`` (IR node names); the first node's output order is kept."""

    pattern: str
    kernel: str
    remove: list[str]
    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    at: str = ""  # the match's root node (set by plan), for the messages
    note: str = ""  # where the kernel computes otherwise than the nodes (a padding row), one warning line


def same_dims(a: Sequence | None, b: Sequence | None, sizes: Mapping[str, int]) -> bool:
    """Two shapes of one rank whose dims are equal: the same number or symbol, or two symbols (a dynamo
    export's unnamed copies of one dim: unk54, unk58) whose values at the analysis's sizes are equal."""
    if a is None or b is None or len(a) != len(b):
        return False

    def value(d):
        return d if isinstance(d, int) else sizes.get(d) if isinstance(d, str) else None

    return all(x == y or (value(x) is not None and value(x) == value(y)) for x, y in zip(a, b, strict=True))


# -- reading and writing nodes -----------------------------------------------------------------------------
def out_name(node: Node) -> str:
    return node.outputs[0].name


def dtype_of(m: Match) -> str:
    return m.root.outputs[0].dtype


def attrs_of(proto: onnx.NodeProto) -> list[onnx.AttributeProto]:
    return list(proto.attribute)


def attr_value(proto: onnx.NodeProto, name: str, default=None):
    """An attribute's value, of the kind its default has (a number, a string; a list of ints where the
    default is None); FuseError naming the node when the file holds another kind."""
    a = next((a for a in proto.attribute if a.name == name), None)
    if a is None:
        return default
    from onnx import AttributeProto as A
    from onnx import helper

    kinds = {A.FLOAT: "a float", A.INT: "an int", A.STRING: "a string", A.INTS: "a list of ints",
             A.FLOATS: "a list of floats"}
    want = ((A.FLOAT, A.INT) if isinstance(default, (int, float)) else (A.STRING,) if isinstance(default, str)
            else (A.INTS,))
    if a.type not in want:
        raise FuseError(f"node {proto.name or proto.op_type!r}: attribute {name!r} is "
                        f"{kinds.get(a.type, A.AttributeType.Name(a.type).lower())}, "
                        f"not {' or '.join(kinds[k] for k in want)}")
    value = helper.get_attribute_value(a)
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def make_node(op: str, inputs: list[str], output: str, name: str, domain: str = "",
              attrs: list[onnx.AttributeProto] = (), **kw) -> onnx.NodeProto:
    from onnx import helper

    while inputs and not inputs[-1]:
        inputs = inputs[:-1]  # trailing absent optional inputs
    n = helper.make_node(op, inputs, [output], name, domain=domain or None, **kw)
    n.attribute.extend(attrs)
    return n


def new_initializer(ctx: Context, base: str, value: np.ndarray, out: list[onnx.TensorProto]) -> str:
    from onnx import numpy_helper

    name = ctx.names.new(base)
    out.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
    return name


def other_input(node: Node, t: Tensor) -> Tensor:
    """The input of a two-input node that is not ``t``."""
    a, b = node.inputs[0], node.inputs[1]
    return b if a is t else a


def param_of(node: Node) -> Tensor:
    """The constant operand of a bias_add (the loader records which input it is)."""
    return node.inputs[node.meta.get("bias_input", 1)]


def unused_extra_outputs(node: Node, ctx: Context) -> bool:
    return all(t is None or (not t.consumers and t.name not in ctx.graph_outputs) for t in node.outputs[1:])


def same_shape(a: Tensor, b: Tensor) -> bool:
    return a.shape is not None and b.shape is not None and a.shape_known and tuple(a.shape) == tuple(b.shape)


def clip_bounds(act: Node, ctx: Context) -> tuple[float, float] | None:
    """Clip's (min, max) as numbers (absent bounds are -/+FLT_MAX), None when they are not constants."""
    p = ctx.protos[act.name]
    if ctx.opset < 11:
        return float(attr_value(p, "min", -FLT_MAX)), float(attr_value(p, "max", FLT_MAX))
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
    if act.kind == "relu" and (act.op_type == "Relu" or clip_bounds(act, ctx) == (0.0, FLT_MAX)):
        return "Relu", []
    if ctx.target == "cuda":
        return None  # the CUDA FusedConv kernel takes Relu only
    if act.kind == "leaky_relu":
        return "LeakyRelu", [float(attr_value(p, "alpha", 0.01))]
    if act.kind in ("sigmoid", "tanh"):
        return act.op_type, []
    if act.kind == "hard_sigmoid":
        return "HardSigmoid", [float(attr_value(p, "alpha", 0.2)), float(attr_value(p, "beta", 0.5))]
    if act.kind in ("relu6", "clip", "relu") and act.op_type == "Clip":
        bounds = clip_bounds(act, ctx)
        return None if bounds is None else ("Clip", list(bounds))
    return None


def gemm_activation(act: Node, ctx: Context) -> dict | None:
    """FusedGemm's activation attributes for ``act`` (CPU only), or None."""
    p = ctx.protos[act.name]
    if ctx.target != "cpu":
        return None
    if act.kind == "relu" and (act.op_type == "Relu" or clip_bounds(act, ctx) == (0.0, FLT_MAX)):
        return {"activation": "Relu"}
    if act.kind in ("sigmoid", "tanh"):
        return {"activation": act.op_type}
    if act.kind == "leaky_relu":
        return {"activation": "LeakyRelu", "activation_alpha": float(attr_value(p, "alpha", 0.01))}
    if act.kind == "elu":
        return {"activation": "Elu", "activation_alpha": float(attr_value(p, "alpha", 1.0))}
    if act.kind == "hard_sigmoid":
        return {"activation": "HardSigmoid", "activation_alpha": float(attr_value(p, "alpha", 0.2)),
                "activation_beta": float(attr_value(p, "beta", 0.5))}
    return None


# -- shared readers ----------------------------------------------------------------------------------------
def last_axis_vector(ctx: Context, param: Tensor, x: Tensor, inits: list) -> str | None:
    """A 1-D bias along x's last axis: the param's own name, or a reshaped copy; None if it is not one."""
    if x.shape is None or not x.shape or not isinstance(x.shape[-1], int):
        return None
    value = ctx.weights.value(param.name)
    vec = None if value is None else channel_vector(value, len(x.shape), x.shape[-1], len(x.shape) - 1)
    if vec is None:
        return None
    return param.name if value.shape == vec.shape else new_initializer(ctx, f"{param.name}_1d", vec, inits)


def reduce_axes(node: Node, ctx: Context) -> list[int] | None:
    p = ctx.protos[node.name]
    if attr_value(p, "keepdims", 1) != 1:
        return None
    axes = attr_value(p, "axes")
    if axes is None and len(p.input) > 1 and p.input[1]:
        v = ctx.weights.value(p.input[1])
        axes = None if v is None else [int(a) for a in v.reshape(-1)]
    return None if axes is None else list(axes)


def affine_param(ctx: Context, t: Tensor | None, x: Tensor, axis: int, fill: float | None,
                  inits: list) -> str | None:
    """gamma or beta shaped as x.shape[axis:] (the param's own name when it already is); '' if absent."""
    norm_shape = tuple(x.shape[axis:])
    if not all(isinstance(d, int) for d in norm_shape):
        return None
    if t is None:
        if fill is None:
            return ""
        check_elements(norm_shape, f"the normalization scale made for {x.name!r}")
        return new_initializer(ctx, f"{x.name}_ln_scale", np.full(norm_shape, fill, np.float32), inits)
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
    check_elements(norm_shape, f"{t.name!r} broadcast to a full normalization parameter")
    return new_initializer(ctx, f"{t.name}_ln", np.ascontiguousarray(full), inits)


def skip_operands(add: Node, sizes: Mapping[str, int] | None = None) -> tuple[Tensor, Tensor] | None:
    """(input, skip) of the residual Add: input has the full shape, skip the same or (1, S, H) / (S, H);
    dims equal by symbol, or by value at the analysis's ``sizes`` (a conv stack's frame count, which shape
    inference names anew on each operand: unk105, unk3)."""
    out = add.outputs[0]
    a, b = add.inputs[0], add.inputs[1]
    sizes = sizes or {}
    for x, s in ((a, b), (b, a)):
        if not x.shape_known or not same_dims(x.shape, out.shape, sizes) or s.shape is None \
                or not s.shape_known:
            continue
        full = tuple(out.shape)
        if same_dims(s.shape, full, sizes) or (len(full) == 3 and (same_dims(s.shape, (1, *full[1:]), sizes)
                                                                   or same_dims(s.shape, full[1:], sizes))):
            return x, s
    return None
