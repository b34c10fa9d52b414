"""The onnx package's zoo ResNet-50 (weights made by ConstantOfShape): rewritten for CPU inference it
verifies, loses nodes, and holds at least as many fused kernels as ONNX Runtime's own offline optimizer."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from fusecli.rewrite import RewriteOptions, rewrite
from fusecli.rewrite.verify.outputs import ort_optimized
from tests.conftest import ZOO
from tests.rewrite.helpers import assert_same_outputs, attr, fused_kernel_count, nodes, ops

RESNET = ZOO / "light_resnet50.onnx"
pytestmark = pytest.mark.skipif(not RESNET.is_file(), reason="the onnx package ships no light_resnet50.onnx")


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    """The zoo graph with a seeded fill value per ConstantOfShape (all 0.02 would make every logit equal
    and every weight the same), and the logits and the first block's output as extra graph outputs."""
    model = onnx.load(RESNET)
    rng = np.random.default_rng(0)
    for n in model.graph.node:
        if n.op_type == "ConstantOfShape":
            value = next(a for a in n.attribute if a.name == "value")
            value.t.CopyFrom(numpy_helper.from_array(np.array([rng.uniform(0.01, 0.03)], np.float32)))
    gemm = nodes(model, "Gemm")[0]
    block = next(n for n in model.graph.node if n.op_type == "Relu" and
                 any(p.op_type == "Sum" and p.output[0] in n.input for p in model.graph.node))
    model.graph.output.extend([helper.make_empty_tensor_value_info(gemm.output[0]),
                               helper.make_empty_tensor_value_info(block.output[0])])
    path = tmp_path_factory.mktemp("resnet") / "resnet50.onnx"
    onnx.save(model, path)
    return path


def test_resnet50_cpu_inference(resnet, tmp_path):
    r = rewrite(str(resnet), RewriteOptions(target="cpu", mode="inference"))
    assert r.verification.ok and len(r.verification.checks["disabled"]) == 3
    assert_same_outputs(resnet, r.model, rtol=1e-4, atol=1e-6)
    counts = ops(r.model)
    assert r.nodes_after < r.nodes_before // 4  # 415 -> 60: ConstantOfShape weights, BN, ReLU, Sum folded
    assert "BatchNormalization" not in counts and counts["com.microsoft.FusedConv"] == 49
    assert sum(1 for n in nodes(r.model, "FusedConv") if len(n.input) == 4) == 16  # + Sum(z) + ReLU
    assert all(attr(n, "activation") == "Relu" for n in nodes(r.model, "FusedConv"))
    assert r.passes == 2 and r.folded_constants > 200

    ort_model = onnx.load(ort_optimized(str(resnet), str(tmp_path / "ort.onnx"), "extended"))
    ort_counts = ops(ort_model)
    assert counts["com.microsoft.FusedConv"] >= ort_counts["com.microsoft.FusedConv"]
    assert fused_kernel_count(r.model) >= fused_kernel_count(ort_model)
    assert r.nodes_after <= len(ort_model.graph.node)


def test_resnet50_training_rewrites_nothing_unsafe(resnet):
    """Every Conv is followed by BatchNorm: nothing is training-safe and has a kernel, so nothing changes."""
    r = rewrite(str(resnet), RewriteOptions(target="cpu", mode="training", verify=False))
    assert r.applied == [] and ops(r.model)["BatchNormalization"] == 53
