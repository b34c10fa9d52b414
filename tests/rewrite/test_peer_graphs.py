"""Rewrite on the small graphs ONNX Runtime's transformers optimizer tests build
(onnxruntime/test/python/transformers/*_model_generator.py), written again here with onnx.helper: each
region fusecli writes is checked against the nodes it replaced by rewrite itself, and the rewritten
model against the original on onnxruntime CPU (other inputs than rewrite's own check)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusecli.core.errors import FuseError
from fusecli.pipeline import Options, analyze
from fusecli.rewrite import RewriteOptions, rewrite
from fusecli.rewrite.kernels import attention as attention_kernel
from fusecli.rewrite.kernels.cuda import cpu_stand_ins
from fusecli.rewrite.verify.outputs import (
    ROUNDING_FACTOR,
    OutputCheck,
    Verification,
    explain_by_rounding,
    verify,
)
from fusecli.spellings.attention import read_attention
from tests.conftest import make_model
from tests.rewrite.helpers import assert_same_outputs, ort_run
from tests.transformer_graphs import GraphBuilder

MS = "com.microsoft."
HIDDEN, HEADS, HEAD = 16, 2, 8
DIMS = {"batch": 2, "seq": 5}


class G(GraphBuilder):
    """A hand-built graph that becomes a checked model."""

    def model(self, inputs: list, *outputs: str, opset: int = 17) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
        model = make_model(self.nodes, inputs, outs, self.inits, opset=opset)
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        onnx.checker.check_model(model, full_check=True)
        return model


def _x() -> list:
    return [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", HIDDEN])]


def _projection(g: G, p: str, x: str, perm: list[int]) -> str:
    """x W + b split into heads: Reshape(0, 0, N, H), then Transpose(perm)."""
    y = g.op("Add", f"{p}_add", g.op("MatMul", f"{p}_mm", x, g.weight(f"{p}_w", HIDDEN, HIDDEN)),
             g.weight(f"{p}_b", HIDDEN))
    r = g.op("Reshape", f"{p}_split", y, g.const(f"{p}_shape", np.array([0, 0, HEADS, HEAD], np.int64)))
    return g.op("Transpose", f"{p}_t", r, perm=perm)


def scalar_bias_attention() -> onnx.ModelProto:
    """softmax(q k^T / sqrt(H) + c) v with c one scalar (the conformer graphs' score bias)."""
    g = G()
    q, kt, v = (_projection(g, "q", "x", [0, 2, 1, 3]), _projection(g, "k", "x", [0, 2, 3, 1]),
                _projection(g, "v", "x", [0, 2, 1, 3]))
    sqrt_h = g.const("sqrt_h", np.array(np.sqrt(HEAD), np.float32))
    s = g.op("Div", "scale", g.op("MatMul", "qk", q, kt), sqrt_h)
    s = g.op("Add", "score_bias", s, g.const("bias_c", np.array(0.5, np.float32)))
    o = g.op("MatMul", "pv", g.op("Softmax", "softmax", s, axis=3), v)
    o = g.op("Reshape", "merge", g.op("Transpose", "merge_t", o, perm=[0, 2, 1, 3]),
             g.const("merged", np.array([0, 0, HIDDEN], np.int64)))
    return g.model(_x(), g.op("MatMul", "out", o, g.weight("out_w", HIDDEN, HIDDEN)))


def merged_heads_attention(axis: int = 2, scale_on_q: bool = True) -> onnx.ModelProto:
    """Whisper's and older GPT-2's heads-merged attention: q, k, v split into heads and merged to (B N, S, H)
    (Reshape, Transpose(0, 2, 1, 3), Reshape), K^T = Transpose(k, (0, 2, 1)), scores (B N, S, L) with the
    softmax over axis ``axis``, P @ V split back to (B, N, S, H); q scaled before its split (Whisper) or
    the scores after q k^T."""
    g = G()
    seq = g.op("Shape", "seq", "x", start=1, end=2)
    size = g.const("head_size", np.array([HEAD], np.int64))
    merged = g.op("Concat", "merged_shape", g.const("minus_one", np.array([-1], np.int64)), seq, size, axis=0)
    split = g.op("Concat", "split_shape", g.const("b_n", np.array([-1, HEADS], np.int64)), seq, size, axis=0)

    def heads(p: str, scale: float | None = None) -> str:
        y = g.op("Add", f"{p}_add", g.op("MatMul", f"{p}_mm", "x", g.weight(f"{p}_w", HIDDEN, HIDDEN)),
                 g.weight(f"{p}_b", HIDDEN))
        if scale is not None:
            y = g.op("Mul", f"{p}_scaled", y, g.const(f"{p}_scale", np.array(scale, np.float32)))
        y = g.op("Reshape", f"{p}_split", y, g.const(f"{p}_shape", np.array([0, -1, HEADS, HEAD], np.int64)))
        return g.op("Reshape", f"{p}_merge", g.op("Transpose", f"{p}_t", y, perm=[0, 2, 1, 3]), merged)

    scale = HEAD ** -0.5
    q, k, v = heads("q", scale if scale_on_q else None), heads("k"), heads("v")
    s = g.op("MatMul", "qk", q, g.op("Transpose", "kt", k, perm=[0, 2, 1]))
    if not scale_on_q:
        s = g.op("Mul", "scale", s, g.const("scores_scale", np.array(scale, np.float32)))
    o = g.op("Reshape", "out_split", g.op("MatMul", "pv", g.op("Softmax", "softmax", s, axis=axis), v), split)
    o = g.op("Reshape", "merge", g.op("Transpose", "merge_t", o, perm=[0, 2, 1, 3]),
             g.const("merged_out", np.array([0, 0, HIDDEN], np.int64)))
    return g.model(_x(), g.op("MatMul", "out", o, g.weight("out_w", HIDDEN, HIDDEN)))


LOWEST = float(np.finfo(np.float32).min)


def gpt2_past_attention(weight: float | None = None, fill: float = LOWEST, seq: int = 32,
                        alibi: bool = False, diagonal: int = 0) -> onnx.ModelProto:
    """GPT-2's attention with a past (onnxruntime's gpt2 test graphs): one QKV MatMul + bias Split into
    heads, past (2, B, N, P, H) read by Gather and joined to K and V by Concat (present: their stack),
    scores / sqrt(H), the causal mask Where(bias[L-S:L, :L], s, fill) from a (1, 1, 32, 32) lower
    triangle, the padding mask (1 - mask) * fill added (transformers' fill: float32's lowest; the ORT
    generator's older GPT-2: -10000), the output projection, the residual and a
    LayerNorm; weights seeded normals, or all ``weight`` with biases 1 (the generator's constant weights:
    the LayerNorm then removes a large constant row sum, an ill-conditioned output). ``alibi``: BLOOM's
    ALiBi term slope_n * key position, (1, N, 1, L), added to the scores before the causal Where.
    ``diagonal``: the triangle's (np.tril's k; -1: a query never sees its own key, so with no past the first
    query sees none)."""
    g = G()
    if weight is not None:
        g.weight = lambda name, *shape: g.const(  # type: ignore[method-assign]
            name, np.full(shape, weight if len(shape) > 1 else 1.0, np.float32))
    qkv = g.op("Add", "qkv_add", g.op("MatMul", "qkv_mm", "x", g.weight("qkv_w", HIDDEN, 3 * HIDDEN)),
               g.weight("qkv_b", 3 * HIDDEN))
    g.nodes.append(helper.make_node("Split", [qkv, g.const("sizes", np.array([HIDDEN] * 3, np.int64))],
                                    ["q_in", "k_in", "v_in"], "split", axis=2))
    shape = g.const("heads", np.array([0, 0, HEADS, HEAD], np.int64))
    q, k, v = (g.op("Transpose", f"{p}_t", g.op("Reshape", f"{p}_split", f"{p}_in", shape),
                    perm=[0, 2, 1, 3]) for p in "qkv")
    past_k = g.op("Gather", "past_k", "past", g.const("i0", np.array(0, np.int64)))
    past_v = g.op("Gather", "past_v", "past", g.const("i1", np.array(1, np.int64)))
    k, v = g.op("Concat", "k_cat", past_k, k, axis=-2), g.op("Concat", "v_cat", past_v, v, axis=-2)
    first = g.const("axis0", np.array([0], np.int64))
    present = g.op("Concat", "present", g.op("Unsqueeze", "k_u", k, first),
                   g.op("Unsqueeze", "v_u", v, first), axis=0)
    s = g.op("MatMul", "qk", q, g.op("Transpose", "kt", k, perm=[0, 1, 3, 2]))
    s = g.op("Div", "scale", s, g.const("sqrt_h", np.array(np.sqrt(HEAD), np.float32)))
    q_len, k_len = g.op("Shape", "q_len", q, start=2, end=3), g.op("Shape", "k_len", k, start=2, end=3)
    tri = g.const("attn_bias", np.tril(np.ones((seq, seq), np.uint8), diagonal).reshape(1, 1, seq, seq))
    c = g.op("Slice", "rows", tri, g.op("Sub", "start", k_len, q_len), k_len,
             g.const("ax2", np.array([2], np.int64)))
    c = g.op("Slice", "cols", c, g.const("zero", np.array([0], np.int64)), k_len,
             g.const("ax3", np.array([3], np.int64)))
    c = g.op("Cast", "causal", c, to=TensorProto.BOOL)
    if alibi:
        last = g.op("Squeeze", "k_len_scalar", k_len, g.const("ax0", np.array([0], np.int64)))
        keys = g.op("Range", "keys", g.const("start0", np.array(0, np.int64)), last,
                    g.const("step1", np.array(1, np.int64)))
        keys = g.op("Cast", "keys_f", keys, to=TensorProto.FLOAT)
        slopes = g.const("slopes", np.array([0.5, 0.25], np.float32).reshape(1, HEADS, 1, 1))
        s = g.op("Add", "alibi_add", s, g.op("Mul", "alibi", slopes, keys))
    s = g.op("Where", "causal_where", c, s, g.const("masked_bias", np.array(fill, np.float32)))
    m = g.op("Unsqueeze", "mask_u", "attention_mask", g.const("ax12", np.array([1, 2], np.int64)))
    m = g.op("Cast", "mask_f", m, to=TensorProto.FLOAT)
    m = g.op("Mul", "mask_add", g.op("Sub", "mask_not", g.const("one", np.array(1.0, np.float32)), m),
             g.const("neg", np.array(fill, np.float32)))
    o = g.op("MatMul", "pv", g.op("Softmax", "softmax", g.op("Add", "mask", s, m), axis=-1), v)
    o = g.op("Reshape", "merge", g.op("Transpose", "merge_t", o, perm=[0, 2, 1, 3]),
             g.const("merged", np.array([0, 0, HIDDEN], np.int64)))
    o = g.op("Add", "o_add", g.op("MatMul", "o_mm", o, g.weight("o_w", HIDDEN, HIDDEN)),
             g.weight("o_b", HIDDEN))
    y = g.op("LayerNormalization", "ln", g.op("Add", "residual", o, "x"),
             g.const("ln_g", np.ones(HIDDEN, np.float32)), g.const("ln_b", np.zeros(HIDDEN, np.float32)))
    inputs = [*_x(),
              helper.make_tensor_value_info("past", TensorProto.FLOAT, [2, "batch", HEADS, "past", HEAD]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"])]
    return g.model(inputs, y, present)


def embedding_model(segment: bool = True, positions: str = "buffer", decomposed: bool = False,
                    vocab: int = 30, max_positions: int = 16) -> onnx.ModelProto:
    """BERT's embeddings (onnxruntime's bert test graphs): word[input_ids] (+ segment[token_type_ids]) +
    position[ids], the position ids a slice of a (1, 16) buffer to the length (``buffer``) or an input
    (``input``), then LayerNorm (the op, or written out at opset 17)."""
    g = G()
    e = g.op("Gather", "word", g.weight("word_table", vocab, HIDDEN), "input_ids")
    if segment:
        e = g.op("Add", "add_segment", e, g.op("Gather", "segment", g.weight("segment_table", 2, HIDDEN),
                                               "token_type_ids"))
    ids = "position_ids"
    if positions == "buffer":
        buffer = g.const("position_buffer", np.arange(max_positions, dtype=np.int64).reshape(1, -1))
        length = g.op("Shape", "length", "input_ids", start=1, end=2)
        ids = g.op("Slice", "position_slice", buffer, g.const("zero", np.array([0], np.int64)), length,
                   g.const("axis1", np.array([1], np.int64)))
    table = g.weight("position_table", max_positions, HIDDEN)
    e = g.op("Add", "add_position", e, g.op("Gather", "position", table, ids))
    gamma, beta = g.weight("ln_g", HIDDEN), g.weight("ln_b", HIDDEN)
    if decomposed:  # (x - mean) / sqrt(var + eps) * g + b
        d = g.op("Sub", "centered", e, g.op("ReduceMean", "mean", e, axes=[-1]))
        var = g.op("ReduceMean", "var", g.op("Pow", "square", d, g.const("two", np.array(2.0, np.float32))),
                   axes=[-1])
        std = g.op("Sqrt", "std", g.op("Add", "eps", var, g.const("epsilon", np.array(1e-12, np.float32))))
        y = g.op("Add", "ln", g.op("Mul", "gamma", g.op("Div", "normed", d, std), gamma), beta)
    else:
        y = g.op("LayerNormalization", "ln", e, gamma, beta, epsilon=1e-12)
    ids_info = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"])
                for n in ("input_ids", *(["token_type_ids"] if segment else []),
                          *(["position_ids"] if positions == "input" else []))]
    return g.model(ids_info, y)


def fast_gelu_mlp() -> onnx.ModelProto:
    """GPT-2's MLP (onnxruntime's gemm_fastgelu graphs): x W1 + b1, the tanh GELU written out
    0.5 y (1 + tanh(sqrt(2 / pi) (y + 0.044715 y^3))), then x W2."""
    g = G()
    y = g.op("Add", "fc_bias", g.op("MatMul", "fc", "x", g.weight("fc_w", HIDDEN, 4 * HIDDEN)),
             g.weight("fc_b", 4 * HIDDEN))
    cube = g.op("Mul", "cubed", g.op("Pow", "cube", y, g.const("three", np.array(3.0, np.float32))),
                g.const("k", np.array(0.044715, np.float32)))
    inner = g.op("Mul", "inner", g.op("Add", "y_cube", y, cube),
                 g.const("sqrt_2_pi", np.array(np.sqrt(2 / np.pi), np.float32)))
    t = g.op("Add", "one_tanh", g.op("Tanh", "tanh", inner), g.const("one", np.array(1.0, np.float32)))
    a = g.op("Mul", "gelu", g.op("Mul", "half", y, g.const("half_c", np.array(0.5, np.float32))), t)
    return g.model(_x(), g.op("MatMul", "proj", a, g.weight("proj_w", 4 * HIDDEN, HIDDEN)))


def _rewrite(save_model, model, **kw):
    path = save_model(model)
    r = rewrite(path, RewriteOptions(batch=2, dims=kw.pop("dims", DIMS), **kw))
    return path, r


# -- 1. a scalar score bias: MultiHeadAttention's attention_bias is (., ., S, L) ---------------------------
def test_scalar_score_bias_is_expanded_on_queries_and_keys(save_model):
    path, r = _rewrite(save_model, scalar_bias_attention())
    assert r.ops_after.get(MS + "MultiHeadAttention") == 1 and "Softmax" not in r.ops_after, r.warnings
    assert r.verification.ok and r.left_out == 0
    assert r.verification.worst("disabled", regions=True) < 1e-6
    assert_same_outputs(path, r.model, dims=DIMS)


def test_a_kernel_onnxruntime_cannot_run_is_left_unfused_with_the_reason(save_model, monkeypatch):
    """An attention_bias of the wrong length (what fusecli wrote before for a scalar bias): the region does
    not run, so it is left unfused and said, with no hint to set sizes that were set; the model is written
    without it."""
    monkeypatch.setattr(attention_kernel, "length_of",
                        lambda ctx, b, packed: b.const("one", np.array([1], np.int64)))
    path, r = _rewrite(save_model, scalar_bias_attention())
    assert MS + "MultiHeadAttention" not in r.ops_after and r.left_out == 1
    said = [w for w in r.warnings if "attention at pv" in w]
    assert said and "onnxruntime cannot run its kernel" in said[0] and "attention_bias" in said[0]
    assert "--batch" not in said[0]
    assert r.verification.ok
    assert_same_outputs(path, r.model, dims=DIMS)


# -- 2. heads-merged 3-D attention (Whisper, older GPT-2) ------------------------------------------------
@pytest.mark.parametrize(("axis", "scale_on_q"), [(2, True), (-1, True), (2, False)])
def test_heads_merged_3d_attention_becomes_multi_head_attention(save_model, axis, scale_on_q):
    path, r = _rewrite(save_model, merged_heads_attention(axis, scale_on_q))
    assert r.ops_after.get(MS + "MultiHeadAttention") == 1 and "Softmax" not in r.ops_after, r.warnings
    assert not [w for w in r.warnings if "attention" in w], r.warnings
    v = r.verification
    assert v.ok and v.worst("disabled", regions=True) < 1e-6 and v.worst("disabled") < 1e-6
    assert_same_outputs(path, r.model, dims=DIMS)


def test_softmax_over_another_axis_of_3d_scores_is_said_as_such(save_model):
    path, r = _rewrite(save_model, merged_heads_attention(axis=1))
    assert MS + "MultiHeadAttention" not in r.ops_after
    said = [w for w in r.warnings if "attention at pv" in w]
    assert said and "the softmax is over axis 1 of rank-3 scores, not the keys (axis 2)" in said[0], said


# -- 3. GPT-2 with past: a KV cache, a bool causal mask and an additive padding mask ------------------------
PAST = {"batch": 2, "seq": 3, "past": 4, "total": 7}


def test_gpt2_past_is_a_kv_cache_and_takes_both_masks(save_model):
    path = save_model(gpt2_past_attention())
    matches = analyze(path, Options(batch=2, dims=PAST)).matches
    attention = [m for m in matches if m.pattern.name == "attention"]
    form = read_attention(attention[0].roles["pv"])
    assert form.kv_cache and len(form.terms) == 1 and len(form.bool_masks) == 1
    r = rewrite(path, RewriteOptions(batch=2, dims=PAST))
    assert r.ops_after.get(MS + "MultiHeadAttention") == 1 and "Softmax" not in r.ops_after, r.warnings
    v = r.verification
    assert v.ok and v.worst("disabled", regions=True) < 1e-6 and v.worst("disabled") < 1e-6
    assert not [w for w in r.warnings if "rounding" in w]
    assert_same_outputs(path, r.model, dims=PAST)
    # the second sequence padded on its first five keys: its first query row sees no key at all
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((2, 3, HIDDEN)).astype(np.float32),
             "past": rng.standard_normal((2, 2, HEADS, 4, HEAD)).astype(np.float32),
             "attention_mask": np.array([[1] * 7, [0] * 5 + [1] * 2], np.int64)}
    want, got = ort_run(path, feeds)[1], ort_run(r.model, feeds)[1]
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_alibi_with_a_causal_mask_and_a_padding_mask_is_one_attention_bias(save_model):
    """ALiBi (1, N, 1, L) + the causal Where (float32's lowest) + the padding mask: three score terms, one
    attention_bias."""
    path, r = _rewrite(save_model, gpt2_past_attention(alibi=True), dims=PAST)
    assert r.ops_after.get(MS + "MultiHeadAttention") == 1 and "Softmax" not in r.ops_after, r.warnings
    v = r.verification
    assert v.ok and v.worst("disabled", regions=True) < 1e-6 and v.worst("disabled") < 1e-6
    assert_same_outputs(path, r.model, dims=PAST)


def _padded_feeds(past: int = 4) -> dict[str, np.ndarray]:
    """PAST's inputs with the second sequence padded on its first five keys (its first query row then sees
    no key through the padding mask)."""
    rng = np.random.default_rng(3)
    return {"x": rng.standard_normal((2, 3, HIDDEN)).astype(np.float32),
            "past": rng.standard_normal((2, 2, HEADS, past, HEAD)).astype(np.float32),
            "attention_mask": np.array([[1] * (3 + past), [0] * 5 + [1] * (past - 2)], np.int64)}


def test_gpt2_past_with_a_fill_that_does_not_absorb_is_taken_where_every_row_keeps_a_key(save_model):
    """The ORT generator's older GPT-2 (-10000): Where(m, s, -10000) is s + Where(m, 0, -10000) (what ORT's
    kernels compute from mask_filter_value: they add it) wherever a row keeps a key, which the causal rows
    [L-S, L) of a lower triangle always do (key 0), at every probe and with an empty past. The one row that
    differs is a query whose every visible key the padding mask hides: said in a warning."""
    path, r = _rewrite(save_model, gpt2_past_attention(fill=-10000.0), dims=PAST)
    assert r.ops_after.get(MS + "MultiHeadAttention") == 1 and "Softmax" not in r.ops_after, r.warnings
    v = r.verification
    assert v.ok and v.worst("disabled", regions=True) < 1e-6 and v.worst("disabled") < 1e-6
    said = [w for w in r.warnings if w.startswith("attention at pv: MultiHeadAttention adds the mask's fill")]
    assert len(said) == 1 and "padding" in said[0], r.warnings
    rng = np.random.default_rng(5)
    for past in (0, 4):  # an empty past too: the first step of a generation
        unpadded = {"x": rng.standard_normal((2, 3, HIDDEN)).astype(np.float32),
                    "past": rng.standard_normal((2, 2, HEADS, past, HEAD)).astype(np.float32),
                    "attention_mask": np.ones((2, 3 + past), np.int64)}
        want, got = ort_run(path, unpadded)[1], ort_run(r.model, unpadded)[1]
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)
    feeds = _padded_feeds()  # the second sequence's first query sees keys 0-4, all padded: that row differs
    want, got = ort_run(path, feeds)[1], ort_run(r.model, feeds)[1]
    out = next(n for n in want if want[n].ndim == 3)
    assert not np.allclose(got[out][1, 0], want[out][1, 0], rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(got[out][0], want[out][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[out][1, 1:], want[out][1, 1:], rtol=1e-5, atol=1e-6)


def test_a_fill_that_does_not_absorb_on_a_mask_with_an_empty_row_is_refused_with_the_reason(save_model):
    """A triangle without its diagonal: with no past the first query sees no key, where the Where puts
    -10000 for every score (uniform weights) and an additive bias would keep the scores' softmax."""
    model = gpt2_past_attention(fill=-10000.0, diagonal=-1)
    path, r = _rewrite(save_model, model, dims=PAST)
    assert MS + "MultiHeadAttention" not in r.ops_after and r.verification.ok
    said = [w for w in r.warnings if "attention at pv" in w]
    assert said and "Where(m, s, -10000) and 1 additive term" in said[0], said
    assert "a query whose every key is masked at probe size" in said[0], said
    # the reason is real: with no past the original gives the first query uniform weights over its keys
    feeds = {**_padded_feeds(), "past": np.zeros((2, 2, HEADS, 0, HEAD), np.float32),
             "attention_mask": np.ones((2, 3), np.int64)}
    want = ort_run(path, feeds)[1]
    assert all(np.isfinite(v).all() for v in want.values())


def test_a_difference_rounding_explains_is_accepted_and_said(save_model):
    """Constant weights: every region agrees to 1e-7 while the LayerNorm's output, which cancels a large
    row sum, differs by more than 1e-4; both float32 models are off the float64 computation by errors of
    one size, so the rewrite is accepted, with the figures."""
    path = save_model(gpt2_past_attention(weight=4.0))
    r = rewrite(path, RewriteOptions(batch=2, dims=PAST))
    v = r.verification
    assert r.ops_after.get(MS + "MultiHeadAttention") == 1 and v.ok
    assert v.worst("disabled", regions=True) < 1e-6 < 1e-4 < v.worst("disabled")
    said = [w for w in r.warnings if "accumulated float32 rounding" in w]
    assert said and "'ln'" in said[0] and "float64" in said[0]
    ln = next(c for c in v.checks["disabled"] if c.name == "ln")
    assert ln.explained and ln.rounding[1] <= ROUNDING_FACTOR * ln.rounding[0]


def test_a_difference_rounding_does_not_explain_is_refused(save_model):
    """A rewritten model off by 1e-3 everywhere (every region said to agree): the original is off float64
    by rounding only, so the difference stays a failure."""
    original = save_model(gpt2_past_attention())
    model = gpt2_past_attention()
    next(t for t in model.graph.initializer if t.name == "ln_g").CopyFrom(
        numpy_helper.from_array(np.full(HIDDEN, 1.001, np.float32), "ln_g"))
    result = Verification(region_checks={"disabled": [OutputCheck("region", "float32", 1e-8, 1e-4)]})
    result.checks = verify(original, model.SerializeToString(), 2, PAST, levels=("disabled",)).checks
    explain_by_rounding(original, model.SerializeToString(), result, 2, PAST)
    ln = next(c for c in result.checks["disabled"] if c.name == "ln")
    assert not result.ok and not ln.explained and ln.rounding[0] < 1e-6 < 1e-4 < ln.rounding[1]


# -- 4. kernels fusecli did not write: EmbedLayerNormalization ---------------------------------------------
@pytest.mark.parametrize(("segment", "positions", "decomposed"),
                         [(True, "buffer", False), (True, "buffer", True), (False, "input", False)])
def test_embeddings_and_their_layer_norm_become_embed_layer_normalization(save_model, segment, positions,
                                                                         decomposed):
    path, r = _rewrite(save_model, embedding_model(segment, positions, decomposed))
    assert r.kernel_counts() == {"EmbedLayerNormalization": 1}, r.warnings
    assert "Gather" not in r.ops_after and "LayerNormalization" not in r.ops_after
    v = r.verification
    assert v.ok and v.worst("disabled", regions=True) < 1e-6 and v.worst("disabled") < 1e-6
    assert_same_outputs(path, r.model, dims=DIMS)


# -- 4. GemmFastGelu: CUDA only --------------------------------------------------------------------------
def test_gemm_fast_gelu_is_written_for_cuda_only(save_model):
    """The CPU provider has no GemmFastGelu: on cpu the MatMul stays and FastGelu takes the bias; analyze
    says so. On cuda GemmFastGelu(x, W1, b1), verified through its CPU stand-in (said), the file written
    and loadable (the load check opens the stand-in too)."""
    path = save_model(fast_gelu_mlp())
    a = analyze(path, Options(batch=2, dims=DIMS))
    match = next(m for m in a.matches if m.pattern.name == "matmul_fast_gelu")
    assert "CPU provider has none" in match.verdict.frameworks["onnxruntime"]["note"]
    cpu = rewrite(path, RewriteOptions(batch=2, dims=DIMS))
    assert cpu.kernel_counts() == {"FastGelu": 1} and cpu.verification.ok
    out = path.replace(".onnx", ".cuda.onnx")
    cuda = rewrite(path, RewriteOptions(target="cuda", batch=2, dims=DIMS), output=out)
    assert cuda.kernel_counts() == {"GemmFastGelu": 1} and cuda.ops_after.get("MatMul") == 1
    v = cuda.verification
    assert v.ok and v.worst("disabled", regions=True) < 1e-6 and v.worst("disabled") < 1e-6
    assert [w for w in cuda.warnings if w.startswith("GemmFastGelu has no CPU kernel") and "stand-in" in w]
    written = onnx.load(out)
    assert [n.op_type for n in written.graph.node if n.domain == "com.microsoft"] == ["GemmFastGelu"]
    assert_same_outputs(path, cpu_stand_ins(written), dims=DIMS)


# -- 5. every refusal says the real reason ---------------------------------------------------------------
def _fixed_reshape() -> onnx.ModelProto:
    """An erf GELU, then a Reshape to a fixed (2, 5, 16): the model runs at seq 5 only."""
    g = G()
    half = g.op("Mul", "half", "x", g.const("half_c", np.array(0.5, np.float32)))
    erf = g.op("Erf", "erf", g.op("Div", "scaled", "x", g.const("sqrt2", np.array(np.sqrt(2), np.float32))))
    y = g.op("Mul", "gelu", half, g.op("Add", "one_erf", erf, g.const("one", np.array(1.0, np.float32))))
    return g.model(_x(), g.op("Reshape", "fixed", y, g.const("shape", np.array([2, 5, HIDDEN], np.int64))))


@pytest.mark.parametrize(("dims", "said"), [({"batch": 2, "seq": 4}, "at the sizes given"),
                                            ({"batch": 2}, "seq guessed as 1: set sizes with --dim")])
def test_the_sizes_hint_only_names_sizes_fusecli_guessed(save_model, dims, said):
    path = save_model(_fixed_reshape())
    with pytest.raises(FuseError, match="failed to run the original model") as e:
        rewrite(path, RewriteOptions(batch=2, dims=dims, verify_scope="model"))
    assert said in str(e.value) and ("--dim" in str(e.value)) == ("seq" not in dims)
