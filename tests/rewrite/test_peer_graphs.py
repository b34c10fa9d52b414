"""Rewrite on the small graphs ONNX Runtime's transformers optimizer tests build
(onnxruntime/test/python/transformers/*_model_generator.py), written again here with onnx.helper: each
region fusecli writes is checked against the nodes it replaced by rewrite itself, and the rewritten
model against the original on onnxruntime CPU (other inputs than rewrite's own check)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusecli.rewrite import RewriteOptions, emit_attention, rewrite
from tests.conftest import make_model
from tests.rewrite.helpers import assert_same_outputs

MS = "com.microsoft."
HIDDEN, HEADS, HEAD = 16, 2, 8
DIMS = {"batch": 2, "seq": 5}


class G:
    """Nodes and seeded initializers under construction."""

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


def _rewrite(save_model, model, **kw):
    path = save_model(model)
    r = rewrite(path, RewriteOptions(batch=2, dims=DIMS, **kw))
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
    monkeypatch.setattr(emit_attention, "length_of",
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
