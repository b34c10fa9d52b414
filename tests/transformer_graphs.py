"""Hand-built transformer blocks in the spellings the PyTorch exporters write, for the rewrite tests and
the structure fuzzer (small: hidden 16, 2 heads; built in milliseconds, no torch).

``rotary_model``: q rotated as transformers' ``apply_rotary_pos_emb`` does, the tables computed from
position ids (dynamo, onnxscript's SmolLM), folded into constants, or the half size read from
``Shape(x)[3] / 2`` (torchscript). ``llama_block``: RMSNorm, q/k/v projections split into heads, rotary q
and k, grouped-query K/V repeated by ``Unsqueeze-Expand-Reshape``, attention as sdpa's decomposition
writes it (``Mul(q, sqrt(s))``, ``Mul(k^T, sqrt(s))``, a bool mask through ``Where``, the NaN guard
``Where(IsNaN(P), 0, P)``, K^T by Reshape-Transpose-Reshape) or as eager attention does (one Transpose,
``Div`` by sqrt(H), an additive mask), the residual, RMSNorm and a SwiGLU MLP.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN, HEADS, KV_HEADS, HEAD, SEQ = 16, 2, 1, 8, 6


class GraphBuilder:
    """Nodes and seeded initializers under construction (the hand-built test graphs share it)."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, name: str, *shape: int) -> str:
        return self.const(name, (self.rng.standard_normal(shape) * 0.3).astype(np.float32))

    def op(self, op_type: str, name: str, *inputs: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], name, **attrs))
        return name

    def model(self, inputs, outputs, opset: int = 18) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        g = helper.make_graph(self.nodes, "block", inputs, outs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
        return onnx.shape_inference.infer_shapes(m)


def _tables(g: GraphBuilder, p: str, table: str, pos_batch: int, dim: int, seq: int, scale: float,
            axis: int, interleaved: bool = False) -> tuple[str, str]:
    """cos and sin, (1|B, 1, S, D) (``axis`` 1) or (1, S, 1, D) (``axis`` 2); ``interleaved``: each angle
    twice in a row (repeat_interleave(f, 2, -1), as Cohere's tables), else the angles twice over."""
    inv = (1.0 / 10000 ** (np.arange(0, dim, 2) / dim)).astype(np.float32)
    if table == "constant":
        f = np.arange(seq, dtype=np.float32)[:, None] * inv[None, :]
        emb = (np.repeat(f, 2, -1) if interleaved else np.concatenate([f, f], -1)) * scale
        shape = (1, 1, seq, dim) if axis == 1 else (1, seq, 1, dim)
        return (g.const(f"{p}cos_table", np.cos(emb).reshape(shape).astype(np.float32)),
                g.const(f"{p}sin_table", np.sin(emb).reshape(shape).astype(np.float32)))
    pos = g.op("Cast", f"{p}pos_f", g.op("Unsqueeze", f"{p}pos_u", "pos", g.const(f"{p}ax2", np.array([2]))),
               to=TensorProto.FLOAT)
    f = g.op("Mul", f"{p}freqs", pos, g.const(f"{p}inv_freq", inv))  # (1|B, S, D/2)
    if interleaved:  # dynamo's repeat_interleave: Unsqueeze, Expand the new axis to 2, Reshape
        f_u = g.op("Unsqueeze", f"{p}f_u", f, g.const(f"{p}ax3", np.array([3])))
        pairs = g.op("Expand", f"{p}pairs", f_u, g.const(f"{p}two_each", np.array([1, 1, 1, 2])))
        cat = g.op("Reshape", f"{p}emb", pairs, g.const(f"{p}emb_shape", np.array([0, -1, dim])))
    else:
        cat = g.op("Concat", f"{p}emb", f, f, axis=-1)
    out = []
    for fn in ("Cos", "Sin"):
        t = g.op(fn, f"{p}{fn.lower()}", cat)
        if scale != 1.0:
            t = g.op("Mul", f"{p}{fn.lower()}_scaled", t, g.const(f"{p}{fn.lower()}_s", np.float32(scale)))
        t = g.op("Cast", f"{p}{fn.lower()}_cast", t, to=TensorProto.FLOAT)  # the float32 -> float32 Cast
        out.append(g.op("Unsqueeze", f"{p}{fn.lower()}_u", t, g.const(f"{p}{fn.lower()}_ax",
                                                                       np.array([axis]))))
    return out[0], out[1]


def rotate(g: GraphBuilder, p: str, x: str, cos: str, sin: str, dim: int, bound: str = "constant",
           swap: bool = False) -> str:
    """x cos + rotate_half(x) sin; ``swap``: concat(x1, -x2), not a rotation ORT's kernel computes."""
    if bound == "shape":  # torchscript: x.shape[-1] // 2 from the graph
        d = g.op("Gather", f"{p}d", g.op("Shape", f"{p}shape", x), g.const(f"{p}three", np.array(3)))
        half = g.op("Div", f"{p}half", d, g.const(f"{p}two", np.array(2)))
        half = g.op("Unsqueeze", f"{p}half_u", half, g.const(f"{p}ax0", np.array([0])))
    else:
        half = g.const(f"{p}half", np.array([dim // 2]))
    ax, one = g.const(f"{p}slice_ax", np.array([-1])), g.const(f"{p}one", np.array([1]))
    x1 = g.op("Slice", f"{p}x1", x, g.const(f"{p}zero", np.array([0])), half, ax, one)
    x2 = g.op("Slice", f"{p}x2", x, half, g.const(f"{p}end", np.array([2**63 - 1])), ax, one)
    rot = g.op("Concat", f"{p}rot", *((x1, g.op("Neg", f"{p}neg", x2)) if swap else
                                      (g.op("Neg", f"{p}neg", x2), x1)), axis=-1)
    return g.op("Add", f"{p}rotary", g.op("Mul", f"{p}xcos", x, cos), g.op("Mul", f"{p}rsin", rot, sin))


def rotate_pairs(g: GraphBuilder, p: str, x: str, cos: str, sin: str, swap: bool = False) -> str:
    """x cos + rotate_every_two(x) sin (GPT-J, Cohere): stack(-x[..., 1::2], x[..., ::2], -1) flattened
    back to x's shape, as the dynamo exporter writes it; ``swap``: stack(x[..., ::2], -x[..., 1::2]), the
    other direction, which ORT's kernel does not compute."""
    ax, two, end = g.const(f"{p}ax", np.array([-1])), g.const(f"{p}two", np.array([2])), \
        g.const(f"{p}end", np.array([2**63 - 1]))
    even = g.op("Slice", f"{p}even", x, g.const(f"{p}zero", np.array([0])), end, ax, two)
    odd = g.op("Neg", f"{p}neg", g.op("Slice", f"{p}odd", x, g.const(f"{p}one", np.array([1])), end, ax, two))
    pair = [g.op("Unsqueeze", f"{p}{n}_u", t, ax) for n, t in (("odd", odd), ("even", even))]
    stacked = g.op("Concat", f"{p}stack", *(pair[::-1] if swap else pair), axis=-1)
    rot = g.op("Reshape", f"{p}rot", stacked, g.op("Shape", f"{p}x_shape", x))
    return g.op("Add", f"{p}rotary", g.op("Mul", f"{p}xcos", x, cos), g.op("Mul", f"{p}rsin", rot, sin))


def rotary_model(table: str = "computed", bound: str = "constant", pos_batch: int = 1, scale: float = 1.0,
                 swap: bool = False, layout: str = "bnsd", dim: int = HEAD,
                 interleaved: bool = False) -> onnx.ModelProto:
    """y = rotary(x) for x (batch, heads, S, D) (``layout`` "bsnd": (batch, S, heads, D)), positions ``pos``
    (``pos_batch``, S) where the tables are computed; ``interleaved``: GPT-J's rotate_every_two."""
    g = GraphBuilder()
    cos, sin = _tables(g, "", table, pos_batch, dim, SEQ, scale, 1 if layout == "bnsd" else 2, interleaved)
    y = rotate_pairs(g, "q_", "x", cos, sin, swap) if interleaved else \
        rotate(g, "q_", "x", cos, sin, dim, bound, swap)
    shape = ["batch", HEADS, SEQ, dim] if layout == "bnsd" else ["batch", SEQ, HEADS, dim]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    if table == "computed":
        inputs.append(helper.make_tensor_value_info("pos", TensorProto.INT64, [pos_batch, SEQ]))
    return g.model(inputs, [y])


def _rms(g: GraphBuilder, p: str, x: str) -> str:
    ms = g.op("ReduceMean", f"{p}ms", g.op("Pow", f"{p}sq", x, g.const(f"{p}two_f", np.float32(2.0))),
              g.const(f"{p}last", np.array([-1])), keepdims=1)
    r = g.op("Reciprocal", f"{p}rcp", g.op("Sqrt", f"{p}sqrt", g.op("Add", f"{p}eps_add", ms,
                                                                     g.const(f"{p}eps", np.float32(1e-6)))))
    return g.op("Mul", f"{p}scaled", g.weight(f"{p}gain", HIDDEN), g.op("Mul", f"{p}normed", x, r))


def _heads(g: GraphBuilder, p: str, x: str, heads: int) -> str:
    w = g.weight(f"{p}w", HIDDEN, heads * HEAD)
    split = g.op("Reshape", f"{p}split", g.op("MatMul", f"{p}proj", x, w),
                 g.const(f"{p}shape", np.array([0, 0, heads, HEAD])))
    return g.op("Transpose", f"{p}heads", split, perm=[0, 2, 1, 3])


def _repeat(g: GraphBuilder, p: str, t: str) -> str:
    """repeat_kv: (B, KV, S, H) -> (B, KV, rep, S, H) -> (B, KV rep, S, H)."""
    u = g.op("Unsqueeze", f"{p}rep_u", t, g.const(f"{p}rep_ax", np.array([2])))
    e = g.op("Expand", f"{p}rep_e", u, g.const(f"{p}rep_shape", np.array([1, 1, HEADS // KV_HEADS, 1, 1])))
    return g.op("Reshape", f"{p}rep_r", e, g.const(f"{p}rep_to", np.array([0, HEADS, -1, HEAD])))


def llama_block(spelling: str = "sdpa", table: str = "computed") -> onnx.ModelProto:
    """One pre-norm decoder block (see the module doc); ``spelling`` "sdpa" or "eager"."""
    g = GraphBuilder(1)
    h = _rms(g, "ln1_", "x")
    cos, sin = _tables(g, "", table, 1, HEAD, SEQ, 1.0, 1)
    q = rotate(g, "q_", _heads(g, "q_", h, HEADS), cos, sin, HEAD)
    k = _repeat(g, "k_", rotate(g, "k_", _heads(g, "k_", h, KV_HEADS), cos, sin, HEAD))
    v = _repeat(g, "v_", _heads(g, "v_", h, KV_HEADS))
    if spelling == "sdpa":
        root = g.const("sqrt_scale", np.float32(HEAD ** -0.25))
        merged = g.op("Reshape", "k_3d", k, g.const("k_3d_shape", np.array([-1, SEQ, HEAD])))
        kt = g.op("Reshape", "k_t", g.op("Transpose", "k_3d_t", merged, perm=[0, 2, 1]),
                  g.const("k_t_shape", np.array([-1, HEADS, HEAD, SEQ])))
        s = g.op("MatMul", "scores", g.op("Mul", "q_s", q, root), g.op("Mul", "k_s", kt, root))
        causal = g.const("causal", np.tril(np.ones((SEQ, SEQ), bool))[None, None])
        s = g.op("Where", "masked", causal, s, g.const("neg_inf", np.float32(-np.inf)))
        p = g.op("Softmax", "probs", s, axis=-1)
        p = g.op("Where", "guard", g.op("IsNaN", "nan", p), g.const("zero_f", np.float32(0.0)), p)
    else:
        s = g.op("Div", "scores", g.op("MatMul", "qk", q, g.op("Transpose", "k_t", k, perm=[0, 1, 3, 2])),
                 g.const("sqrt_h", np.float32(HEAD ** 0.5)))
        mask = np.triu(np.full((SEQ, SEQ), np.finfo(np.float32).min, np.float32), 1)[None, None]
        p = g.op("Softmax", "probs", g.op("Add", "masked", s, g.const("mask", mask)), axis=-1)
    o = g.op("Reshape", "o_merge", g.op("Transpose", "o_t", g.op("MatMul", "pv", p, v), perm=[0, 2, 1, 3]),
             g.const("o_shape", np.array([0, 0, HIDDEN])))
    r = g.op("Add", "resid", "x", g.op("MatMul", "o_proj", o, g.weight("o_w", HIDDEN, HIDDEN)))
    h2 = _rms(g, "ln2_", r)
    gate = g.op("MatMul", "gate", h2, g.weight("gate_w", HIDDEN, 32))
    silu = g.op("Mul", "silu", gate, g.op("Sigmoid", "sig", gate))
    up = g.op("MatMul", "up", h2, g.weight("up_w", HIDDEN, 32))
    down = g.op("MatMul", "down", g.op("Mul", "glu", silu, up), g.weight("down_w", 32, HIDDEN))
    y = g.op("Add", "y", r, down)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, SEQ, HIDDEN])]
    if table == "computed":
        inputs.append(helper.make_tensor_value_info("pos", TensorProto.INT64, [1, SEQ]))
    return g.model(inputs, [y])
