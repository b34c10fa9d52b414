"""Attention whose interior tensors' shapes the export reads (fusecli/rewrite/graph/shape_reads.py), and whose
scale is computed from shapes (1 / sqrt(Shape(q)[-1:]), rewrite/kernels/attention.py): Falcon and CodeGen as
the TorchScript exporter writes them with their default attention. Before, both were left unfused
("reads ..., which the fused nodes no longer make"; "the scale is not one constant")."""

from __future__ import annotations

import onnx
import pytest

from fusecli.rewrite import RewriteOptions, rewrite
from fusecli.rewrite.graph.edit import undefined_read
from tests import hf_models
from tests.rewrite.helpers import assert_same_outputs


@pytest.mark.parametrize("name", hf_models.SHAPE_READS)
def test_attention_rewritten_with_its_shape_reads_rerouted(hf_onnx, name, tmp_path):
    path = hf_onnx(name, "torchscript", attn="default")
    out = str(tmp_path / "fused.onnx")
    r = rewrite(path, RewriteOptions(batch=2, dims={"seq": 16}), out)
    assert not [w for w in r.warnings if w.startswith("not rewritten: attention")], r.warnings
    assert r.verification.ok and r.verification.regions == len(r.applied)
    written = onnx.load(out)
    assert undefined_read(written) is None
    kernels = [n.op_type for n in written.graph.node if n.domain == "com.microsoft"]
    assert kernels.count("MultiHeadAttention") == 2, kernels
    assert_same_outputs(path, r.model, dims={"seq": 16})
