"""Every shipped sample, rewritten for CPU and CUDA, inference and training: it verifies, it matches an
independent onnxruntime run, and the fused ops are the ones each seed post predicts."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from fusecli.rewrite import RewriteOptions, rewrite
from tests.rewrite.helpers import assert_cuda_kernels_only, assert_same_outputs, attr, init, nodes, ops

SAMPLES = ("conv_bias_relu", "conv_bn_relu", "bn_add_relu", "conv_squeeze_bias", "matmul_bias_relu")


def _conv_bias_relu(r, original, target, mode):
    """Conv + bias + ReLU is one FusedConv(Relu) everywhere (training-safe, Relu exists on CUDA)."""
    assert ops(r.model) == {"com.microsoft.FusedConv": 1}
    (fc,) = nodes(r.model, "FusedConv")
    assert attr(fc, "activation") == "Relu" and len(fc.input) == 3
    np.testing.assert_array_equal(init(r.model, fc.input[1]), init(original, "w"))
    np.testing.assert_allclose(init(r.model, fc.input[2]), init(original, "b").reshape(8))


def _conv_bn_relu(r, original, target, mode):
    if mode == "training":  # inference only: BatchNorm's backward reads the conv output; never folded
        assert ops(r.model) == ops(original) and r.applied == []
        return
    assert ops(r.model) == {"com.microsoft.FusedConv": 1}
    (fc,) = nodes(r.model, "FusedConv")
    assert attr(fc, "activation") == "Relu"
    w, gamma, beta, mean, var = (init(original, n) for n in ("w", "bn_scale", "bn_bias", "bn_mean", "bn_var"))
    s = gamma / np.sqrt(var + 1e-5)  # BatchNormalization's default epsilon
    np.testing.assert_allclose(init(r.model, fc.input[1]), w * s[:, None, None, None], rtol=1e-6)
    np.testing.assert_allclose(init(r.model, fc.input[2]), beta - mean * s, rtol=1e-6, atol=1e-7)


def _bn_add_relu(r, original, target, mode):
    counts = ops(r.model)
    z_convs = [n for n in nodes(r.model, "FusedConv") if len(n.input) == 4]
    assert len(z_convs) == 1 and attr(z_convs[0], "activation") == "Relu"  # conv_b + Add(z) + ReLU
    if mode == "training":
        assert counts["BatchNormalization"] == 1
    else:
        assert "BatchNormalization" not in counts and counts == {"Conv": 1, "com.microsoft.FusedConv": 1}


def _conv_squeeze_bias(r, original, target, mode):
    """The bias after the Squeeze moves into the Conv's B (channel axis 1 survives the squeeze)."""
    assert ops(r.model) == {"Conv": 1, "Squeeze": 1}
    (conv,) = nodes(r.model, "Conv")
    np.testing.assert_allclose(init(r.model, conv.input[2]), init(original, "b").reshape(8))


def _matmul_bias_relu(r, original, target, mode):
    if target == "cpu":
        assert ops(r.model) == {"com.microsoft.FusedGemm": 1}
        assert attr(nodes(r.model, "FusedGemm")[0], "activation") == "Relu"
    else:  # no FusedGemm kernel on CUDA: the bias still joins a Gemm, the ReLU stays
        assert ops(r.model) == {"Gemm": 1, "Relu": 1}


EXPECT = {"conv_bias_relu": _conv_bias_relu, "conv_bn_relu": _conv_bn_relu, "bn_add_relu": _bn_add_relu,
          "conv_squeeze_bias": _conv_squeeze_bias, "matmul_bias_relu": _matmul_bias_relu}


@pytest.mark.parametrize("mode", ["inference", "training"])
@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("name", SAMPLES)
def test_sample(sample, name, target, mode):
    path = sample(name)
    original = onnx.load(path)
    r = rewrite(path, RewriteOptions(target=target, mode=mode, batch=3))
    v = r.verification
    if r.unchanged:  # nothing rewritten or pruned: no sessions made, the graph is the input's
        assert v is None and not r.applied and r.model.graph == original.graph
    else:
        assert v is not None and v.ok and set(v.checks) == {"disabled", "default"}
        assert all(c.error <= 1e-4 for cs in v.checks.values() for c in cs)
    assert_same_outputs(path, r.model, batch=3)
    onnx.checker.check_model(r.model, full_check=True)
    if target == "cuda":
        assert_cuda_kernels_only(r.model)
    assert r.nodes_before == len(original.graph.node) and r.nodes_after == len(r.model.graph.node)
    assert r.nodes_after <= r.nodes_before
    EXPECT[name](r, original, target, mode)
    if any(n.domain == "com.microsoft" for n in r.model.graph.node):
        assert any(o.domain == "com.microsoft" and o.version == 1 for o in r.model.opset_import)
