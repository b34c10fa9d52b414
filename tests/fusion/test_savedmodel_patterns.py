"""The seed patterns are found in SavedModels as in ONNX, over TensorFlow's own op types."""

from __future__ import annotations

import pytest

from fusecli.pipeline import Options, analyze

tf = pytest.importorskip("tensorflow")
from tests.load.test_savedmodel import saved_models  # noqa: E402


@pytest.fixture(scope="module")
def found():
    """Model name -> [(pattern, op types of its nodes, inference_safe, training_safe)]."""
    out = {}
    for name, path in saved_models().items():
        if name in ("tf1_bundle", "misc"):
            continue
        a = analyze(path, Options(batch=2))
        out[name] = [(m.pattern.name, [n.op_type for n in m.nodes], m.verdict.inference_safe,
                      m.verdict.training_safe) for m in a.matches if m.pattern.phase == "forward"]
    return out


def test_seed_patterns_over_tensorflow_ops(found):
    assert ("conv_bias_act", ["Conv2D", "BiasAdd", "Relu"], True, True) in found["conv_bias_relu"]
    assert ("matmul_bias_act", ["MatMul", "BiasAdd", "Relu"], True, True) in found["matmul_bias_relu"]
    assert ("conv_bn_act", ["Conv2D", "FusedBatchNormV3", "Relu"], True, False) in found["conv_bn_relu"]
    assert ("bn_act", ["FusedBatchNormV3", "Relu"], True, True) in found["conv_bn_relu"]
    assert ("bn_add_act", ["FusedBatchNormV3", "AddV2", "Relu"], True, True) in found["bn_add_relu"]


def test_keras3_decomposed_batch_norm_is_found(found):
    """Keras 3 exports BatchNorm as x * (gamma rsqrt(var + eps)) + shift: Mul then AddV2."""
    resnet = found["keras3_resnet"]
    assert ("conv_bn_act", ["Conv2D", "Mul", "AddV2", "Relu"], True, False) in resnet
    assert any(p == "bn_add_act" and ops[:2] == ["Mul", "AddV2"] and train for p, ops, _, train in resnet)


def test_keras3_transformer_gelu_and_layer_norm(found):
    names = [p for p, *_ in found["keras3_transformer"]]
    assert names.count("skip_layer_norm") == 2  # residual Add + moments-form LayerNorm, twice
    bias_gelu = [ops for p, ops, _, train in found["keras3_transformer"] if p == "bias_gelu" and train]
    assert len(bias_gelu) == 1 and "Erfc" in bias_gelu[0] and bias_gelu[0][0] == "BiasAdd"


def test_keras3_multi_head_attention_is_an_einsum_attention(found):
    """Keras 3 MultiHeadAttention: Einsum(q, k) with the scale, Softmax, Einsum(P, v)."""
    attention = [(ops, inf, train) for p, ops, inf, train in found["keras3_transformer"] if p == "attention"]
    assert attention == [(["Einsum", "Mul", "Softmax", "Einsum"], True, False)]  # training: if recomputed
