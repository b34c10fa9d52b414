"""Verdicts: the seed posts' answers, the zoo ResNet-50, blocking, traffic, dtypes, filtering, and the CLI."""

from __future__ import annotations

import json
import math

import onnx
import pytest
from click.testing import CliRunner

from fusecli.cli import main
from fusecli.core.errors import FuseError
from fusecli.fusion import select_patterns
from fusecli.fusion.patterns import CATALOGUE
from fusecli.load import load_model
from fusecli.pipeline import Options, analyze, analyze_graph
from tests.conftest import ZOO
from tests.fusion.models import (
    LAYER_NORM_NODES,
    analyze_model,
    conv_act,
    found,
    gelu_erf,
    layer_norm,
    only,
    run_ort,
)

SAMPLES = ["conv_bias_relu", "conv_bn_relu", "bn_add_relu", "conv_squeeze_bias", "matmul_bias_relu"]


@pytest.mark.parametrize("name", SAMPLES)
def test_samples_run_in_onnxruntime(sample, name):
    assert run_ort(onnx.load(sample(name)))


# -- the seed posts -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, pattern, nodes", [
    ("conv_bias_relu", "conv_bias_act", ["conv", "bias_add", "relu"]),
    ("bn_add_relu", "bn_add_act", ["bn", "add", "relu"]),
    ("matmul_bias_relu", "matmul_bias_act", ["matmul", "bias_add", "relu"]),
])
def test_seed_fusions_are_training_safe(sample, name, pattern, nodes):
    m = only(analyze(sample(name), Options(batch=2)), pattern)
    assert [n.name for n in m.nodes] == nodes
    v = m.verdict
    assert v.inference_safe and v.training_safe and v.blocking == []
    assert v.reason.startswith("training-safe: no tensor inside the fused kernel is read by backward")
    assert "ReluGrad reads y" in v.reason


def test_seed_conv_bn_relu_is_inference_only_blocked_by_conv_out(sample):
    a = analyze(sample("conv_bn_relu"), Options(batch=2))
    m = only(a, "conv_bn_act")
    assert [n.name for n in m.nodes] == ["conv", "bn", "relu"]
    v = m.verdict
    assert v.inference_safe and not v.training_safe
    [b] = v.blocking
    conv_out = a.graph.tensors["conv_out"]
    assert b.tensor.name == "conv_out" and b.bytes == conv_out.nbytes(a.sizes) == 2 * 8 * 16 * 16 * 4
    [reader] = b.needed_by
    grad = a.joint.node(reader)
    assert (grad.op_type, grad.meta["forward"], grad.phase) == ("BatchNormGrad", "bn", "backward")
    assert "conv_out" in [t.name for t in grad.inputs]
    assert v.reason.startswith("inference only: BatchNormGrad (backward of bn) reads conv_out, made inside "
                               "the fused kernel by conv")


def test_resnet50_conv_bn_relu_and_bn_add_relu():
    a = analyze(str(ZOO / "light_resnet50.onnx"), Options(batch=2))
    conv_bn = [m for m in a.matches if m.pattern.name == "conv_bn_act"]
    bn_add = [m for m in a.matches if m.pattern.name == "bn_add_act"]
    assert (len(conv_bn), len(bn_add)) == (33, 16)
    for m in conv_bn:
        assert (m.verdict.inference_safe, m.verdict.training_safe) == (True, False)
        assert [b.tensor for b in m.verdict.blocking] == [m.roles["conv"].outputs[0]]
    for m in bn_add:
        assert (m.verdict.inference_safe, m.verdict.training_safe) == (True, True)
        assert [n.op_type for n in m.nodes] == ["BatchNormalization", "Sum", "Relu"]


# -- verdict details ------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [*SAMPLES, "light_resnet50"])
def test_training_safe_matches_have_no_blocking(sample, path):
    a = analyze(str(ZOO / f"{path}.onnx") if path.startswith("light") else sample(path), Options(batch=2))
    assert a.matches
    for m in a.matches:
        v = m.verdict
        assert v.blocking == [] if v.training_safe else v.blocking or not v.inference_safe, m.pattern.name
        assert all(a.liveness.saved_by_name[b.tensor.name].reads == "value" for b in v.blocking)
        assert all(b.tensor in m.interior() for b in v.blocking)


@pytest.mark.parametrize("model, pattern", [(gelu_erf, "gelu"), (layer_norm, "layer_norm")])
def test_fused_kind_is_training_safe_though_backward_reads_its_interior(tmp_path, model, pattern):
    a = analyze_model(model(), tmp_path, wrt_inputs=True)
    m = only(a, pattern)
    read = [t.name for t in m.interior() if t.name in a.liveness.saved_by_name]
    assert read  # e.g. ErfGrad reads x / sqrt 2; the decomposed LayerNorm's Div reads the std
    v = m.verdict
    assert v.inference_safe and v.training_safe and v.blocking == []
    assert v.reason.startswith(f"training-safe: becomes {m.pattern.kernel}, an op with its own gradient")


def _proto_traffic(model: onnx.ModelProto, nodes: list[str], batch: int) -> int:
    """Sum over the tensors the non-root nodes make: bytes * (1 + how many node inputs read it)."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph
    shapes = {v.name: [d.dim_value or batch for d in v.type.tensor_type.shape.dim]
              for v in (*inferred.value_info, *inferred.output)}
    by_name = {n.name: n for n in model.graph.node}
    total = 0
    for name in nodes[:-1]:
        for out in by_name[name].output:
            readers = sum(list(n.input).count(out) for n in model.graph.node)
            total += 4 * math.prod(shapes[out]) * (1 + readers)
    return total


def test_traffic_bytes(sample, tmp_path):
    m = only(analyze(sample("conv_bias_relu"), Options(batch=2)), "conv_bias_act")
    assert m.verdict.traffic_bytes == 2 * (2 * 8 * 16 * 16 * 4) * 2  # conv_out and bias_out, written + read
    model = layer_norm()
    m = only(analyze_model(model, tmp_path, batch=3), "layer_norm")
    assert m.verdict.traffic_bytes == _proto_traffic(model, LAYER_NORM_NODES, 3)
    assert m.verdict.traffic_bytes > 0


def test_mixed_dtypes_are_not_fusable(tmp_path):
    """No catalogue op changes dtype in valid ONNX, so the IR is edited (as in a mixed-precision graph)."""
    model, path = conv_act("Relu", "add"), str(tmp_path / "m.onnx")
    run_ort(model)
    onnx.save(model, path)
    graph = load_model(path)
    graph.tensors["bias_out"].dtype = "float16"
    a = analyze_graph(path, graph, Options(batch=2))
    v = only(a, "conv_bias_act").verdict
    assert (v.inference_safe, v.training_safe, v.blocking) == (False, False, [])
    assert v.reason == "not fusable: the chain mixes dtypes (float16, float32)"


def test_select_patterns():
    assert select_patterns(None) == CATALOGUE and select_patterns([]) == CATALOGUE
    picked = select_patterns(["bn_act", "conv_bn_act"])
    assert [p.name for p in picked] == ["conv_bn_act", "bn_act"]  # catalogue order
    with pytest.raises(FuseError, match="unknown pattern 'nope'"):
        select_patterns(["conv_bn_act", "nope"])


def test_patterns_option_filters_matches(sample):
    a = analyze(sample("conv_bn_relu"), Options(batch=2, patterns=("conv_bn_act",)))
    assert [m.pattern.name for m in a.matches] == ["conv_bn_act"]
    with pytest.raises(FuseError, match="unknown pattern 'nope'"):
        analyze(sample("conv_bn_relu"), Options(patterns=("nope",)))


def test_dominated_matches_are_suppressed_unless_safer(sample):
    a = analyze(sample("conv_bias_relu"), Options(batch=2))
    assert found(a, "conv_bias") == []  # inside conv_bias_act, which is as safe
    assert found(analyze(sample("conv_bias_relu"), Options(batch=2, patterns=("conv_bias",))),
                 "conv_bias") == [["conv", "bias_add"]]
    a = analyze(sample("conv_bn_relu"), Options(batch=2))
    assert found(a, "conv_bn") == []  # inside conv_bn_act, equally inference-only
    assert found(a, "bn_act") == [["bn", "relu"]]  # inside conv_bn_act but training-safe, so kept
    assert only(a, "bn_act").verdict.training_safe


# -- the CLI --------------------------------------------------------------------------------------------
def test_cli_patterns_json(sample):
    r = CliRunner().invoke(main, ["analyze", sample("conv_bn_relu"), "--json", "--batch", "2",
                                  "--patterns", "conv_bn_act"])
    assert r.exit_code == 0, r.output
    patterns = json.loads(r.stdout)["patterns"]
    assert [p["pattern"] for p in patterns] == ["conv_bn_act"]
    [p] = patterns
    assert set(p) == {"pattern", "nodes", "inference_safe", "training_safe", "blocking", "reason", "phase",
                      "kernel", "traffic_bytes", "frameworks", "verdict", "recompute"}
    assert p["nodes"] == ["conv", "bn", "relu"] and (p["inference_safe"], p["training_safe"]) == (True, False)
    # recomputing the conv output would re-run the convolution: no recompute verdict
    assert p["verdict"] == "inference only" and p["recompute"] is None and "re-run Conv conv" in p["reason"]
    assert p["blocking"] == [{"tensor": "conv_out", "needed_by": ["gradients/bn/BatchNormGrad"],
                              "bytes": 2 * 8 * 16 * 16 * 4}]
    assert p["phase"] == "forward" and p["traffic_bytes"] > 0
    assert set(p["frameworks"]) == {"tensorflow", "onnxruntime", "pytorch"}


def test_cli_unknown_pattern_is_one_error_line(sample):
    r = CliRunner().invoke(main, ["analyze", sample("conv_bn_relu"), "--json", "--patterns", "nope"])
    assert r.exit_code == 2 and r.stdout == ""  # a bad option value is a usage error
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "unknown pattern 'nope'" in lines[0]
