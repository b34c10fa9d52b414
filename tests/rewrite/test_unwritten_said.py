"""Every safe match rewrite does not write is said: a ``not rewritten: <pattern> at <node>: <why>`` line,
with or without verification (rewrite/plan.py). The case: a skip-RMSNorm whose residual sum adds a
(B, 1, H) vector, which SkipSimplifiedLayerNormalization's skip input does not take; the RMSNorm inside it
is written (SimplifiedLayerNormalization) and verified with onnxruntime, the skip form is said."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from fusecli.pipeline import Options, analyze
from fusecli.rewrite import RewriteOptions, rewrite
from tests.transformer_graphs import GraphBuilder

B, S, H = 2, 5, 16


def _broadcast_residual_rms_norm():
    """y = rms_norm(a + p) g, p (B, 1, H): a pooled vector added to every position (seed 0 weights)."""
    g = GraphBuilder(0)
    s = g.op("Add", "resid", "a", "p")
    ms = g.op("ReduceMean", "ms", g.op("Pow", "sq", s, g.const("two", np.float32(2.0))),
              g.const("last", np.array([-1])), keepdims=1)
    var = g.op("Add", "eps_add", ms, g.const("eps", np.float32(1e-6)))
    r = g.op("Reciprocal", "rcp", g.op("Sqrt", "sqrt", var))
    g.op("Mul", "y", g.weight("gain", H), g.op("Mul", "normed", s, r))
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [B, S, H]),
              helper.make_tensor_value_info("p", TensorProto.FLOAT, [B, 1, H])]
    return g.model(inputs, ["y"])


@pytest.mark.parametrize("verify", [False, True])
def test_a_refused_skip_rms_norm_is_said(save_model, verify):
    path = save_model(_broadcast_residual_rms_norm())
    assert {m.pattern.name for m in analyze(path, Options()).matches} >= {"skip_rms_norm"}
    r = rewrite(path, RewriteOptions(verify=verify))
    assert r.kernel_counts() == {"SimplifiedLayerNormalization": 1}
    said = [w for w in r.warnings if w.startswith("not rewritten: skip_rms_norm at y:")]
    assert len(said) == 1 and "skip" in said[0].split(":", 2)[2], r.warnings
    if verify:
        assert r.verification.ok and r.verification.checks
