"""Attention written as two Einsums (Keras's MultiHeadAttention, as tf2onnx keeps it) -> MultiHeadAttention,
for Keras 3's query-first equations, older Keras's key-first ones and an output in (B, N, T, H) layout;
checked against softmax(q k^T s) v in numpy."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusecli.rewrite.run import RewriteOptions, rewrite
from tests.rewrite.helpers import ops, ort_run

B, T, N, H, SCALE = 2, 8, 4, 16, 0.25


def _model(qk_eq: str, pv_eq: str, query_first: bool) -> onnx.ModelProto:
    def vi(name):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", "seq", N, H])

    nodes = [helper.make_node("Einsum", ["q", "k"] if query_first else ["k", "q"], ["s"], equation=qk_eq),
             helper.make_node("Mul", ["s", "scale"], ["s2"]),
             helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
             helper.make_node("Einsum", ["p", "v"], ["o"], equation=pv_eq)]
    g = helper.make_graph(nodes, "g", [vi("q"), vi("k"), vi("v")],
                          [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array(SCALE, np.float32), "scale")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


CASES = {  # name: (scores equation, output equation, query operand first, output layout from (B, T, N, H))
    "keras3": ("btnh,bsnh->bnts", "bnts,bsnh->btnh", True, (0, 1, 2, 3)),
    "older_keras_key_first": ("aecd,abcd->acbe", "acbe,aecd->abcd", False, (0, 1, 2, 3)),
    "heads_first_output": ("btnh,bsnh->bnts", "bnts,bsnh->bnth", True, (0, 2, 1, 3)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_einsum_attention_becomes_multi_head_attention(case, tmp_path):
    qk_eq, pv_eq, query_first, layout = CASES[case]
    path = str(tmp_path / "a.onnx")
    onnx.save(_model(qk_eq, pv_eq, query_first), path)
    r = rewrite(path, RewriteOptions(batch=B, dims={"seq": T}), str(tmp_path / "out.onnx"))
    assert r.kernel_counts() == {"MultiHeadAttention": 1}, (r.kernel_counts(), r.warnings)
    assert r.verification is not None and r.verification.ok
    model = onnx.load(tmp_path / "out.onnx")
    assert "Einsum" not in ops(model) and "Softmax" not in ops(model)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((B, T, N, H)).astype(np.float32) for _ in range(3))
    _, got = ort_run(model, {"q": q, "k": k, "v": v})
    s = np.einsum("btnh,bsnh->bnts", q, k) * SCALE
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.einsum("bnts,bsnh->btnh", p, v).transpose(layout)
    np.testing.assert_allclose(got["o"], want, rtol=1e-4, atol=1e-5)


def test_a_softmax_over_the_queries_is_left_unfused(tmp_path):
    model = _model("btnh,bsnh->bnts", "bnts,bsnh->btnh", True)
    next(n for n in model.graph.node if n.op_type == "Softmax").attribute[0].i = 2  # over t, not s
    path = str(tmp_path / "a.onnx")
    onnx.save(model, path)
    r = rewrite(path, RewriteOptions(batch=B, dims={"seq": T}), str(tmp_path / "out.onnx"))
    assert r.kernel_counts() == {}
    assert any("the softmax is over axis 2 (t) of the scores bnts, not the keys (axis 3, s)" in w
               for w in r.warnings), r.warnings
