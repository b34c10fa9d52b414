"""Convs behind tf2onnx's layout Transpose -> FusedConv (or Conv with the bias folded), then the Transpose.

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
from .fold import channel_vector, fold_bias

_CONV = ("conv_bias_add_act", "conv_bias_act", "conv_bias", "conv_bn_act", "conv_bn", "conv_squeeze_bias")
_PLAIN = {name: _BASE[name] for name in _CONV}  # emit.py's conv emitter, before this module's take over


def through_layout(m: Match, ctx: Context) -> Emission | None:
    """Conv (+ bias) (+ act) seen through the layout Transpose; other conv matches as emit.py does them."""
    if "layout" not in m.roles:
        return _PLAIN[m.pattern.name](m, ctx)
    if any(r in m.roles for r in ("act_gate", "bn", "bn_scale", "add", "squeeze")):
        return None
    conv, layout, act, bias = m.roles["conv"], m.roles["layout"], m.roles.get("act"), m.roles.get("bias")
    cp = ctx.protos[conv.name]
    w_t = conv.inputs[1]
    if w_t.shape is None or not w_t.is_static or conv.outputs[0].dtype != "float32":
        return None
    c_out, rank = w_t.shape[0], len(w_t.shape)
    perm = _attr(ctx.protos[layout.name], "perm")
    if perm is None or list(perm) != [0, *range(2, rank), 1]:
        return None  # only channels-first -> channels-last moves the channel axis to the end
    inits: list = []
    b_name = cp.input[2] if len(cp.input) > 2 else ""
    if bias is not None:
        value = ctx.weights.value(_param_of(bias).name)
        vec = None if value is None else channel_vector(value, rank, c_out, axis=rank - 1)
        B = ctx.weights.value(b_name) if b_name else None
        if vec is None or (b_name and B is None):
            return None
        b_name = _new_init(ctx, f"{conv.name}_bias_folded", fold_bias(B, vec, vec.dtype), inits)
    spec = conv_activation(act, ctx) if act is not None else None
    if act is not None and spec is None:
        return None  # an activation FusedConv lacks would have to stay after the transpose: not worth it
    if spec is None and bias is None:
        return None
    inner = ctx.names.new(f"{conv.name}_nchw")
    if spec is not None:
        if not b_name and ctx.target == "cuda":
            b_name = _new_init(ctx, f"{conv.name}_zero_bias", np.zeros(c_out, np.float32), inits)
        kw = {"activation": spec[0]}
        if spec[1]:
            kw["activation_params"] = spec[1]
        fused = _node("FusedConv", [cp.input[0], cp.input[1], b_name], inner, conv.name, MS, _attrs(cp), **kw)
        kernel = f"FusedConv({spec[0]}) + layout Transpose"
    else:
        fused = _node("Conv", [cp.input[0], cp.input[1], b_name], inner, conv.name, "", _attrs(cp))
        kernel = "Conv(bias folded) + layout Transpose"
    back = _node("Transpose", [inner], _out(m.root), ctx.names.new(f"{layout.name}_moved"), perm=list(perm))
    return Emission(m.pattern.name, kernel, [n.name for n in m.nodes], [fused, back], inits)


EMITTERS = {name: through_layout for name in _CONV}
