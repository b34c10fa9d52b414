"""Convs behind tf2onnx's layout Transpose -> FusedConv (or Conv with the bias folded), then the Transpose;
and Keras' Conv2D -> BiasAdd -> BatchNorm (bias folded first, then the BatchNorm's scale and shift).

tf2onnx writes an NHWC conv as Transpose -> Conv (NCHW) -> Transpose(0, 2, 3, 1); the bias Add and the
activation follow in NHWC. Elementwise epilogues commute with a transpose, and a bias along NHWC's last
axis is a per-output-channel bias of the conv: act(transpose(conv(x, W, B)) + b) =
transpose(act(conv(x, W, B + b))). The Transpose moves behind the fused kernel, where ONNX Runtime's
transpose optimizer cancels it against the next conv's.
"""

from __future__ import annotations

import numpy as np

from ..fusion.match import Match
from .emit import EMITTERS as _BASE
from .emit import (
    MS,
    Context,
    Emission,
    _attr,
    _attrs,
    _new_init,
    _node,
    _out,
    _param_of,
    conv_activation,
)
from .fold import channel_vector, fold_bias, fold_scale_shift

_CONV = ("conv_bias_add_act", "conv_bias_act", "conv_bias", "conv_bn_act", "conv_bn", "conv_squeeze_bias",
         "conv_bias_bn_act", "conv_bias_bn")
_PLAIN = {name: _BASE[name] for name in _CONV if name in _BASE}  # emit.py's, before this module's


def through_layout(m: Match, ctx: Context) -> Emission | None:
    """Conv (+ bias) (+ act) seen through the layout Transpose; other conv matches as emit.py does them."""
    if "layout" not in m.roles and m.pattern.name in _PLAIN:
        return _PLAIN[m.pattern.name](m, ctx)
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
    perm = None if layout is None else _attr(ctx.protos[layout.name], "perm")
    if layout is not None and (perm is None or list(perm) != [0, *range(2, rank), 1]):
        return None  # only channels-first -> channels-last moves the channel axis to the end
    axis = 1 if layout is None else rank - 1  # the channel axis of the epilogue's tensors
    inits: list = []
    b_name = cp.input[2] if len(cp.input) > 2 else ""
    if bias is not None:
        value = ctx.weights.value(_param_of(bias).name)
        vec = None if value is None else channel_vector(value, rank, c_out, axis=axis)
        B = ctx.weights.value(b_name) if b_name else None
        if vec is None or (b_name and B is None):
            return None
        b_name = _new_init(ctx, f"{conv.name}_bias_folded", fold_bias(B, vec, vec.dtype), inits)
    w_name = cp.input[1]
    if bn is not None:  # (conv + b) * s + t (Keras 3's decomposed BatchNorm, after the bias)
        st = _scale_shift(m, ctx, scale_node, bn, rank, c_out, axis)
        W, B = ctx.weights.value(w_name), ctx.weights.value(b_name) if b_name else None
        if st is None or W is None or (b_name and B is None):
            return None
        W, B = fold_scale_shift(W, B, *st)
        w_name = _new_init(ctx, f"{w_name}_bn_folded", W, inits)
        b_name = _new_init(ctx, f"{conv.name}_bias_bn_folded", B, inits)
    spec = conv_activation(act, ctx) if act is not None else None
    if act is not None and spec is None:
        return None  # an activation FusedConv lacks would have to stay after the transpose: not worth it
    if spec is None and bias is None and bn is None:
        return None
    inner = ctx.names.new(f"{conv.name}_nchw")
    if spec is not None:
        if not b_name and ctx.target == "cuda":
            b_name = _new_init(ctx, f"{conv.name}_zero_bias", np.zeros(c_out, np.float32), inits)
        kw = {"activation": spec[0]}
        if spec[1]:
            kw["activation_params"] = spec[1]
        fused = _node("FusedConv", [cp.input[0], w_name, b_name], inner, conv.name, MS, _attrs(cp), **kw)
        kernel = f"FusedConv({spec[0]})"
    else:
        fused = _node("Conv", [cp.input[0], w_name, b_name], inner, conv.name, "", _attrs(cp))
        folded = [x for x, r in (("bias", bias), ("BatchNorm", bn)) if r is not None]
        kernel = f"Conv({' + '.join(folded)} folded)"
    if layout is None:
        fused.output[0] = _out(m.root)
        return Emission(m.pattern.name, kernel, [n.name for n in m.nodes], [fused], inits)
    back = _node("Transpose", [inner], _out(m.root), ctx.names.new(f"{layout.name}_moved"), perm=list(perm))
    return Emission(m.pattern.name, kernel + " + layout Transpose", [n.name for n in m.nodes], [fused, back],
                    inits)


def _scale_shift(m: Match, ctx: Context, scale_node, bn, rank: int, c_out: int, axis: int):
    """(s, t) per output channel of x * s + t (or x * s - t), from the match's constants."""
    if scale_node is None:
        return None
    params = [t for t in scale_node.inputs if t is not None and t.kind in ("parameter", "constant")]
    s = ctx.weights.value(params[0].name) if len(params) == 1 else None
    t_t, sign = (bn.inputs[1], -1.0) if bn.kind == "sub" else (_param_of(bn), 1.0)
    t = ctx.weights.value(t_t.name)
    if s is None or t is None:
        return None
    s, t = channel_vector(s, rank, c_out, axis=axis), channel_vector(t, rank, c_out, axis=axis)
    return None if s is None or t is None else (s, sign * t)


EMITTERS = {name: through_layout for name in _CONV}
