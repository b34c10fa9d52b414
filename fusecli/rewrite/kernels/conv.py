"""Conv family -> FusedConv (X, W, B?, Z?; activation, activation_params; com.microsoft), or Conv with
BatchNorm, bias or scale folded:
conv_bias_add_act, conv_bias_act, conv_bias, conv_bn(_act), conv_squeeze_bias.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx

from ...core.budgets import check_elements
from ...core.ir import Node, Tensor
from ..graph.fold import channel_vector, fold_batch_norm, fold_bias, fold_scale_shift
from ..graph.kit import (
    MS,
    Context,
    Emission,
    attr_value,
    attrs_of,
    conv_activation,
    make_node,
    new_initializer,
    other_input,
    out_name,
    param_of,
    same_shape,
    unused_extra_outputs,
)

if TYPE_CHECKING:  # annotations only
    from ...fusion.match import Match


# -- Conv family: conv_bias(_add)_act, conv_bias, conv_bn(_act), conv_squeeze_bias ------------------------
def _fold_bn(m: Match, W: np.ndarray, B: np.ndarray | None, rank: int, ctx: Context):
    bn = m.roles["bn"]
    if bn.kind == "batch_norm":
        p = ctx.protos[bn.name]
        if attr_value(p, "training_mode", 0) or attr_value(p, "spatial", 1) != 1 \
                or not unused_extra_outputs(bn, ctx):
            return None
        params = [ctx.weights.value(n) for n in p.input[1:5]]
        if len(params) != 4 or any(v is None for v in params):
            return None
        vecs = [channel_vector(v, 1, W.shape[0], axis=0) for v in params]
        if any(v is None for v in vecs):
            return None
        return fold_batch_norm(W, B, *vecs, float(attr_value(p, "epsilon", 1e-5)))
    scale_node = m.roles["bn_scale"]  # Keras 3: x * (gamma rsqrt(var + eps)) + (beta - mean * scale)
    s = ctx.weights.value(other_input(scale_node, m.roles["conv"].outputs[0]).name)
    if bn.kind == "sub":
        shift_t, sign = bn.inputs[1], -1.0
    else:
        shift_t, sign = param_of(bn), 1.0
    t = ctx.weights.value(shift_t.name)
    if s is None or t is None:
        return None
    s, t = channel_vector(s, rank, W.shape[0]), channel_vector(t, rank, W.shape[0])
    if s is None or t is None:
        return None
    return fold_scale_shift(W, B, s, sign * t)


def _squeeze_axes(sq: Node, ctx: Context) -> list[int] | None:
    p = ctx.protos[sq.name]
    axes = attr_value(p, "axes")
    if axes is None and len(p.input) > 1 and p.input[1]:
        v = ctx.weights.value(p.input[1])
        axes = None if v is None else [int(a) for a in v.reshape(-1)]
    return None if axes is None else list(axes)


def conv_family(m: Match, ctx: Context) -> Emission | None:
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
        w_name = new_initializer(ctx, f"{cp.input[1]}_bn_folded", wb[0], inits)
        b_name = new_initializer(ctx, f"{conv.name}_bias_bn_folded", wb[1], inits)
        folded.append("BatchNorm")
        last = bn
    if bias is not None:
        out_rank, ok = rank, True
        if squeeze is not None:
            axes = _squeeze_axes(squeeze, ctx)
            ok = axes is not None and all(a % rank >= 2 for a in axes)
            out_rank = rank - len(axes or ())
        value = ctx.weights.value(param_of(bias).name)
        vec = None if value is None or not ok else channel_vector(value, out_rank, c_out)
        B = ctx.weights.value(b_name) if b_name else None
        if vec is None or (b_name and B is None):
            return None
        b_name = new_initializer(ctx, f"{conv.name}_bias_folded", fold_bias(B, vec, vec.dtype), inits)
        folded.append("bias")
        last = bias
    act, add = m.roles.get("act"), m.roles.get("add")
    spec = conv_activation(act, ctx) if act is not None else None
    fuse = spec is not None and dtype == "float32" and (ctx.target == "cpu" or rank == 4)
    z = ""
    if fuse and add is not None:
        z_t = other_input(add, _out_tensor(last))
        fuse = same_shape(z_t, add.outputs[0]) and z_t.dtype == dtype
        z = z_t.name
    attrs = attrs_of(cp)
    if fuse:
        if not b_name and ctx.target == "cuda":  # give the cuDNN path its bias
            check_elements((c_out,), f"the zero bias made for {conv.name!r}")
            b_name = new_initializer(ctx, f"{conv.name}_zero_bias", np.zeros(c_out, np.float32), inits)
        kw = {"activation": spec[0]}
        if spec[1]:
            kw["activation_params"] = spec[1]
        inputs = [cp.input[0], w_name, b_name, z]
        node = make_node("FusedConv", inputs, out_name(m.root), conv.name, MS, attrs, **kw)
        return Emission(m.pattern.name, f"FusedConv({spec[0]}{', Z' if z else ''})",
                        [n.name for n in m.nodes], [node], inits)
    if not folded:
        return None
    remove = [n.name for n in m.nodes if n is conv or n is bias or n is bn or n is m.roles.get("bn_scale")]
    kernel = f"Conv({' + '.join(folded)} folded)"
    if squeeze is not None:
        sp = ctx.protos[squeeze.name]
        nodes = [make_node("Conv", [cp.input[0], w_name, b_name], out_name(conv), conv.name, "", attrs),
                 make_node("Squeeze", list(sp.input), out_name(bias), squeeze.name, "", attrs_of(sp))]
        return Emission(m.pattern.name, kernel, remove + [squeeze.name], nodes, inits)
    node = make_node("Conv", [cp.input[0], w_name, b_name], out_name(last), conv.name, "", attrs)
    return Emission(m.pattern.name, kernel, remove, [node], inits)


def _out_tensor(node: Node) -> Tensor:
    return node.outputs[0]
