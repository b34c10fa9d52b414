"""Framework notes: would Grappler's remapper or ONNX Runtime fuse the match, on CPU and on GPU."""

from __future__ import annotations

import os

import onnx
import onnxruntime as ort
import pytest

from fusecli.pipeline import Options, analyze
from tests.fusion.models import (
    Net,
    analyze_model,
    conv_act,
    conv_bn_act,
    gelu_erf,
    layer_norm,
    only,
)


def notes(a, pattern: str) -> dict[str, tuple]:
    """{'tensorflow': (cpu, gpu), 'onnxruntime': (cpu, gpu)} of the one match of ``pattern``."""
    f = only(a, pattern).verdict.frameworks
    assert set(f) == {"tensorflow", "onnxruntime", "pytorch"}
    assert all(set(v) == {"cpu", "gpu", "note"} and v["note"] for v in f.values())
    return {k: (v["cpu"], v["gpu"]) for k, v in f.items() if k != "pytorch"}


def ort_cpu_ops(model: onnx.ModelProto, folder) -> list[str]:
    """Op types of the model after ONNX Runtime's CPU graph optimizations (ORT_ENABLE_EXTENDED)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = os.path.join(folder, "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node]


# the GPU columns are modelled, not measured: no GPU was available to the tests; the CPU columns are asked of
# Grappler and onnxruntime by the tests below
@pytest.mark.parametrize("act, bias, k, tf, onnxruntime", [
    ("Relu", "add", 3, (True, True), (True, True)),
    ("Relu", "own", 3, (True, True), (True, True)),
    ("LeakyRelu", "add", 3, (True, False), (True, False)),  # CUDA FusedConv: Relu only
    ("Elu", "add", 3, (True, False), (False, False)),  # no Elu in ORT's FusedConv
    ("Sigmoid", "add", 3, (False, False), (True, False)),
    ("Relu", "add", 1, (True, False), (True, True)),  # Grappler's GPU path skips 1x1 filters
    ("Relu", "none", 3, (False, False), (True, True)),  # the remapper needs a BiasAdd
])
def test_conv_bias_act(tmp_path, act, bias, k, tf, onnxruntime):
    a = analyze_model(conv_act(act, bias, k), tmp_path)
    assert notes(a, "conv_bias_act") == {"tensorflow": tf, "onnxruntime": onnxruntime}


_TF_ACTS = {"Relu": lambda tf, y: tf.nn.relu(y), "LeakyRelu": lambda tf, y: tf.nn.leaky_relu(y, 0.01),
            "Elu": lambda tf, y: tf.nn.elu(y), "Sigmoid": lambda tf, y: tf.sigmoid(y)}


@pytest.mark.parametrize("act, bias, k", [("Relu", "add", 3), ("Relu", "own", 3), ("LeakyRelu", "add", 3),
                                          ("Elu", "add", 3), ("Sigmoid", "add", 3), ("Relu", "add", 1),
                                          ("Relu", "none", 3)])
def test_tensorflow_cpu_claim_matches_grappler(tmp_path, act, bias, k):
    """The CPU column of the conv_bias_act note against Grappler's remapper itself: the same Conv2D (+
    BiasAdd) + activation as a tf.function on the CPU; the claim is that the remapper writes one
    _FusedConv2D with the bias and the activation. (The GPU column is modelled, not measured: no GPU.)"""
    pytest.importorskip("tensorflow")
    from tests.fusion.grappler import remapped_ops

    claim = notes(analyze_model(conv_act(act, bias, k), tmp_path), "conv_bias_act")["tensorflow"][0]

    def build(tf, x, w, b):
        y = tf.nn.conv2d(x, w, strides=1, padding="SAME")
        return _TF_ACTS[act](tf, y if bias == "none" else tf.nn.bias_add(y, b))

    fused = remapped_ops(build, [[1, 8, 8, 4], [k, k, 4, 8], [8]])
    assert claim == (fused == [("_FusedConv2D", ["BiasAdd", act])]), fused


@pytest.mark.parametrize("act", ["Relu", "Clip", "LeakyRelu", "Elu", "Sigmoid", "Tanh"])
def test_onnxruntime_cpu_claim_matches_onnxruntime(tmp_path, act):
    model = conv_act(act, "add")
    claim = notes(analyze_model(model, tmp_path), "conv_bias_act")["onnxruntime"][0]
    assert claim == (ort_cpu_ops(model, tmp_path) == ["FusedConv"])


def _inference_bn(tf, x, scale):
    y, _, _ = tf.compat.v1.nn.fused_batch_norm(x, scale, scale, mean=scale, variance=scale, is_training=False)
    return y


def test_tensorflow_cpu_claims_for_batch_norm_match_grappler(tmp_path, sample):
    """conv_bn_act's CPU claim (Conv2D + FusedBatchNorm in inference + Relu: one _FusedConv2D) and bn_act's
    (a BatchNorm + Relu alone: one _FusedBatchNormEx, which fusecli called GPU only until Grappler was
    asked) against Grappler's CPU remapper."""
    pytest.importorskip("tensorflow")
    from tests.fusion.grappler import remapped_ops

    a = analyze_model(conv_bn_act("op"), tmp_path)
    conv_claim, bn_claim = notes(a, "conv_bn_act")["tensorflow"][0], notes(a, "bn_act")["tensorflow"][0]

    def conv_bn(tf, x, w, scale):
        y = tf.nn.conv2d(x, w, strides=1, padding="SAME")
        return tf.nn.relu(_inference_bn(tf, y, scale))

    def bn(tf, x, scale):
        return tf.nn.relu(_inference_bn(tf, x, scale))

    fused = remapped_ops(conv_bn, [[1, 8, 8, 4], [3, 3, 4, 8], [8]])
    assert conv_claim == (fused == [("_FusedConv2D", ["FusedBatchNorm", "Relu"])]), fused
    fused = remapped_ops(bn, [[1, 8, 8, 8], [8]])
    assert bn_claim == any(op == "_FusedBatchNormEx" for op, _ in fused), fused
    side_claim = notes(analyze(sample("bn_add_relu"), Options(batch=2)), "bn_add_act")["tensorflow"][0]

    def bn_add(tf, x, scale, z):  # the side input: relu(bn(x) + z)
        return tf.nn.relu(_inference_bn(tf, x, scale) + z)

    fused = remapped_ops(bn_add, [[1, 8, 8, 8], [8], [1, 8, 8, 8]])
    assert side_claim == any(op == "_FusedBatchNormEx" for op, _ in fused), fused


def test_conv_bn_act_and_decomposed_bn(tmp_path):
    a = analyze_model(conv_bn_act("op"), tmp_path)
    assert notes(a, "conv_bn_act")["tensorflow"] == (True, False)  # CPU, inference only
    assert notes(a, "bn_act")["tensorflow"] == (True, True)  # _FusedBatchNormEx: CPU and GPU
    a = analyze_model(conv_bn_act("add"), tmp_path)
    assert notes(a, "conv_bn_act")["tensorflow"] == (False, False)
    assert notes(a, "bn_act")["tensorflow"] == (False, False)


def test_samples(sample):
    a = analyze(sample("conv_squeeze_bias"), Options(batch=2))
    assert notes(a, "conv_squeeze_bias") == {"tensorflow": (True, False), "onnxruntime": (False, False)}
    a = analyze(sample("matmul_bias_relu"), Options(batch=2))
    assert notes(a, "matmul_bias_act")["onnxruntime"] == (True, False)  # FusedGemm is CPU only
    a = analyze(sample("bn_add_relu"), Options(batch=2))
    assert notes(a, "bn_add_act")["tensorflow"] == (False, True)
    assert notes(a, "bn_grad_relu_grad") == {"tensorflow": (False, True), "onnxruntime": (False, False)}


def test_onnxruntime_fuses_what_fusecli_says_it_fuses_on_cpu(tmp_path, sample):
    net = Net(q=("N", 4, 8), k=("N", 8, 6))
    mm = net.op("MatMul", "matmul", "q", "k")
    scaled = net.model(net.op("Div", "scale", mm, net.param("s", value=2.0)))
    cases = [(onnx.load(sample("matmul_bias_relu")), "matmul_bias_act", "FusedGemm"),
             (scaled, "matmul_scale", "FusedMatMul"), (gelu_erf(), "gelu", "Gelu"),
             (layer_norm(), "layer_norm", "LayerNormalization"),
             (layer_norm(skip="add"), "skip_layer_norm", "SkipLayerNormalization")]
    for model, pattern, fused in cases:
        assert notes(analyze_model(model, tmp_path), pattern)["onnxruntime"][0] is True
        assert fused in ort_cpu_ops(model, tmp_path), pattern
