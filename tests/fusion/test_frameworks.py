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


@pytest.mark.parametrize("act", ["Relu", "Clip", "LeakyRelu", "Elu", "Sigmoid", "Tanh"])
def test_onnxruntime_cpu_claim_matches_onnxruntime(tmp_path, act):
    model = conv_act(act, "add")
    claim = notes(analyze_model(model, tmp_path), "conv_bias_act")["onnxruntime"][0]
    assert claim == (ort_cpu_ops(model, tmp_path) == ["FusedConv"])


def test_conv_bn_act_and_decomposed_bn(tmp_path):
    a = analyze_model(conv_bn_act("op"), tmp_path)
    assert notes(a, "conv_bn_act")["tensorflow"] == (True, False)  # CPU, inference only
    assert notes(a, "bn_act")["tensorflow"] == (False, True)  # _FusedBatchNormEx: GPU only
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
