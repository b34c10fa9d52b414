"""Convs behind tf2onnx's layout Transpose -> FusedConv (or Conv with the bias folded), then the Transpose;
and Keras' Conv2D -> BiasAdd -> BatchNorm (bias folded first, then the BatchNorm's scale and shift).

tf2onnx writes an NHWC conv as Transpose -> Conv (NCHW) -> Transpose(0, 2, 3, 1); the bias Add and the
activation follow in NHWC. Elementwise epilogues commute with a transpose, and a bias along NHWC's last
axis is a per-output-channel bias of the conv: act(transpose(conv(x, W, B)) + b) =
transpose(act(conv(x, W, B + b))). The Transpose moves behind the fused kernel, where ONNX Runtime's
transpose optimizer cancels it against the next conv's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...core.budgets import check_elements
from ..graph.fold import channel_vector, fold_bias, fold_scale_shift
from ..graph.kit import (
    MS,
    Context,
    Emission,
    attr_value,
    attrs_of,
    conv_activation,
    make_node,
    new_initializer,
    out_name,
    param_of,
)
from .conv import conv_family

if TYPE_CHECKING:  # annotations only
    from ...fusion.match import Match

_CONV = ("conv_bias_add_act", "conv_bias_act", "conv_bias", "conv_bn_act", "conv_bn", "conv_squeeze_bias",
         "conv_bias_bn_act", "conv_bias_bn")
_PLAIN = _CONV[:6]  # what conv.conv_family does where no layout Transpose stands after the conv


def through_layout(m: Match, ctx: Context) -> Emission | None:
    """Conv (+ bias) (+ act) seen through the layout Transpose; other conv matches as conv.py does them."""
    if "layout" not in m.roles and m.pattern.name in _PLAIN:
        return conv_family(m, ctx)
    if any(r in m.roles for r in ("act_gate", "add", "squeeze")):
        return None
    bn, scale_node = m.roles.get("bn"), m.roles.get("bn_scale")
    if (bn is not None or scale_node is not None) and (ctx.mode != "inference" or bn is None
                                                        or scale_node is None or bn.kind == "batch_norm"):
        return None  # BatchNorm folds in inference only; here its decomposed (Keras 3) form only
    conv, layout, act, bias = m.roles["conv"], m.roles.get("layout"), m.roles.get("act"), m.roles.get("bias")
    cp = ctx.protos[conv.name]
    w_t = conv.inputs[1]
    if w_t.shape is None or not w_t.is_static or conv.outputs[0].dtype != "float32":
        return None
    c_out, rank = w_t.shape[0], len(w_t.shape)
    perm = None if layout is None else attr_value(ctx.protos[layout.name], "perm")
    if layout is not None and (perm is None or list(perm) != [0, *range(2, rank), 1]):
        return None  # only channels-first -> channels-last moves the channel axis to the end
    axis = 1 if layout is None else rank - 1  # the channel axis of the epilogue's tensors
    inits: list = []
    b_name = cp.input[2] if len(cp.input) > 2 else ""
    if bias is not None:
        value = ctx.weights.value(param_of(bias).name)
        vec = None if value is None else channel_vector(value, rank, c_out, axis=axis)
        B = ctx.weights.value(b_name) if b_name else None
        if vec is None or (b_name and B is None):
            return None
        b_name = new_initializer(ctx, f"{conv.name}_bias_folded", fold_bias(B, vec, vec.dtype), inits)
    w_name = cp.input[1]
    if bn is not None:  # (conv + b) * s + t (Keras 3's decomposed BatchNorm, after the bias)
        st = _scale_shift(m, ctx, scale_node, bn, rank, c_out, axis)
        W, B = ctx.weights.value(w_name), ctx.weights.value(b_name) if b_name else None
        if st is None or W is None or (b_name and B is None):
            return None
        W, B = fold_scale_shift(W, B, *st)
        w_name = new_initializer(ctx, f"{w_name}_bn_folded", W, inits)
        b_name = new_initializer(ctx, f"{conv.name}_bias_bn_folded", B, inits)
    spec = conv_activation(act, ctx) if act is not None else None
    if act is not None and spec is None:
        return None  # an activation FusedConv lacks would have to stay after the transpose: not worth it
    if spec is None and bias is None and bn is None:
        return None
    inner = ctx.names.new(f"{conv.name}_nchw")
    if spec is not None:
        if not b_name and ctx.target == "cuda":
            check_elements((c_out,), f"the zero bias made for {conv.name!r}")
            b_name = new_initializer(ctx, f"{conv.name}_zero_bias", np.zeros(c_out, np.float32), inits)
        kw = {"activation": spec[0]}
        if spec[1]:
            kw["activation_params"] = spec[1]
        inputs = [cp.input[0], w_name, b_name]
        fused = make_node("FusedConv", inputs, inner, conv.name, MS, attrs_of(cp), **kw)
        kernel = f"FusedConv({spec[0]})"
    else:
        fused = make_node("Conv", [cp.input[0], w_name, b_name], inner, conv.name, "", attrs_of(cp))
        folded = [x for x, r in (("bias", bias), ("BatchNorm", bn)) if r is not None]
        kernel = f"Conv({' + '.join(folded)} folded)"
    if layout is None:
        fused.output[0] = out_name(m.root)
        return Emission(m.pattern.name, kernel, [n.name for n in m.nodes], [fused], inits)
    moved = ctx.names.new(f"{layout.name}_moved")
    back = make_node("Transpose", [inner], out_name(m.root), moved, perm=list(perm))
    return Emission(m.pattern.name, kernel + " + layout Transpose", [n.name for n in m.nodes], [fused, back],
                    inits)


def _scale_shift(m: Match, ctx: Context, scale_node, bn, rank: int, c_out: int, axis: int):
    """(s, t) per output channel of x * s + t (or x * s - t), from the match's constants."""
    if scale_node is None:
        return None
    params = [t for t in scale_node.inputs if t is not None and t.kind in ("parameter", "constant")]
    s = ctx.weights.value(params[0].name) if len(params) == 1 else None
    t_t, sign = (bn.inputs[1], -1.0) if bn.kind == "sub" else (param_of(bn), 1.0)
    t = ctx.weights.value(t_t.name)
    if s is None or t is None:
        return None
    s, t = channel_vector(s, rank, c_out, axis=axis), channel_vector(t, rank, c_out, axis=axis)
    return None if s is None or t is None else (s, sign * t)
