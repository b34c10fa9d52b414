"""Region-by-region verification: each fused region run in onnxruntime against the nodes it replaced,
identical regions once, shape-computed inputs recomputed, a wrong kernel caught; an emission that drops
an output or makes a cycle left out, the rest rewritten."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from fusecli.core.errors import FuseError
from fusecli.rewrite import RewriteOptions, rewrite
from fusecli.rewrite import run as run_module
from fusecli.rewrite.kernels import registry as emit_module
from fusecli.rewrite.verify.regions import Cutter
from tests.conftest import make_model, vi
from tests.rewrite.test_scale import _conv_chain


def _distinct_conv_chain(n: int) -> onnx.ModelProto:
    """(Conv 1x1 with its own weight -> Relu) * n."""
    rng = np.random.default_rng(0)
    nodes, weights, prev = [], [], "x"
    for i in range(n):
        weights.append(numpy_helper.from_array(rng.standard_normal((4, 4, 1, 1)).astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], f"conv{i}"),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], f"relu{i}")]
        prev = f"r{i}"
    return make_model(nodes, [vi("x", "N", 4, 3, 3)], [vi(prev, "N", 4, 3, 3)], weights)


def _sabotaged(monkeypatch, pattern: str, spoil) -> None:
    """The emitter of ``pattern`` with ``spoil(emission)`` applied to what it emits."""
    original = emit_module.EMITTERS[pattern]

    def emitter(m, ctx):
        e = original(m, ctx)
        if e is not None:
            spoil(e)
        return e

    monkeypatch.setitem(emit_module.EMITTERS, pattern, emitter)


def test_identical_regions_are_verified_once(save_model):
    r = rewrite(save_model(_conv_chain(40)), RewriteOptions(verify_scope="regions"))
    v = r.verification
    assert (v.regions, v.distinct) == (20, 1)
    assert v.ok and set(v.region_checks) == {"disabled", "default"} and not v.checks
    assert "20 identical regions" in v.region_checks["disabled"][0].name


def test_regions_with_their_own_weights_are_each_verified(save_model):
    r = rewrite(save_model(_distinct_conv_chain(6)), RewriteOptions(batch=2, verify_scope="regions"))
    assert (r.verification.regions, r.verification.distinct) == (6, 6)
    assert len(r.verification.region_checks["default"]) == 6 and r.verification.ok


def test_a_wrong_kernel_fails_region_verification(save_model, monkeypatch):
    def leaky(e):  # Relu -> LeakyRelu(0.5): differs on every negative value
        node = e.nodes[0]
        for a in node.attribute:
            if a.name == "activation":
                a.s = b"LeakyRelu"
        node.attribute.append(helper.make_attribute("activation_params", [0.5]))

    _sabotaged(monkeypatch, "conv_bias_act", leaky)
    with pytest.raises(FuseError, match=r"verification failed: region conv_bias_act -> FusedConv"):
        rewrite(save_model(_distinct_conv_chain(3)), RewriteOptions(batch=2, verify_scope="regions"))


def test_a_dropped_output_leaves_that_region_unfused(save_model, monkeypatch):
    """An emission that would leave 'r0' made by no node is fusecli's fault: its region stays as it was,
    said in a warning, and the rest is rewritten and verified."""
    def rename(e):
        if e.nodes[-1].output[0] == "r0":
            e.nodes[-1].output[0] = "r0_elsewhere"

    _sabotaged(monkeypatch, "conv_bias_act", rename)
    r = rewrite(save_model(_distinct_conv_chain(2)), RewriteOptions(batch=2))
    assert [a.nodes for a in r.applied] == [["conv1", "relu1"]]
    assert [w for w in r.warnings if w.startswith("not rewritten")] == [
        "not rewritten: conv_bias_act at relu0: node 'conv1' reads 'r0', which the fused nodes no longer "
        "make"]
    assert [n.op_type for n in r.model.graph.node] == ["Conv", "Relu", "FusedConv"]
    assert r.verification.ok and r.verification.regions == 1


def test_auto_leaves_out_the_whole_model_when_it_is_big(save_model, monkeypatch):
    monkeypatch.setattr(run_module, "AUTO_MODEL_NODES", 2)
    r = rewrite(save_model(_distinct_conv_chain(3)), RewriteOptions(batch=2))
    assert r.verification.ok and r.verification.distinct == 3 and not r.verification.checks
    assert "--verify model runs it" in r.verification.model_skipped
    r = rewrite(save_model(_distinct_conv_chain(3)), RewriteOptions(batch=2, verify_scope="model"))
    assert r.verification.checks and not r.verification.region_checks


@pytest.mark.parametrize("name, exporter", [("bert", "torchscript"), ("gpt2", "torchscript"),
                                            ("llama", "torchscript"), ("llama", "dynamo")])
def test_transformer_regions_are_cut_out_on_their_own(hf_onnx, name, exporter):
    """Dynamic exports: attention's Reshape targets come from Shape -> Gather -> Concat chains, pulled
    into the region; every region is checked on its own and agrees at both levels."""
    r = rewrite(hf_onnx(name, exporter), RewriteOptions(batch=2, dims={"seq": 16}, verify_scope="regions"))
    v = r.verification
    kernels = {a.kernel for a in r.applied}
    assert v.ok and not v.uncut and v.regions == len(r.applied) >= 4
    assert any("MultiHeadAttention" in k or "GroupQueryAttention" in k for k in kernels)
    assert all(c.error <= c.tolerance for cs in v.region_checks.values() for c in cs)


def _attention_with_v_transposed() -> onnx.ModelProto:
    """softmax(q k^T + mask) v with v = Transpose(v_heads), as onnxscript's SmolLM spells it."""
    nodes = [helper.make_node("Transpose", ["v_heads"], ["v"], "v_t", perm=[0, 2, 1, 3]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"], "qk"),
             helper.make_node("Add", ["scores", "mask"], ["masked"], "add_mask"),
             helper.make_node("Softmax", ["masked"], ["probs"], "softmax", axis=-1),
             helper.make_node("MatMul", ["probs", "v"], ["ctx"], "pv"),
             helper.make_node("Transpose", ["ctx"], ["y"], "out_t", perm=[0, 2, 1, 3])]
    return make_model(nodes, [vi("q", 2, 2, 4, 8), vi("kt", 2, 2, 8, 4), vi("v_heads", 2, 4, 2, 8),
                              vi("mask", 2, 1, 1, 4)], [vi("y", 2, 4, 2, 8)])


def test_attention_that_reads_v_before_its_transpose(save_model, monkeypatch):
    """The fused attention reads V before the Transpose the replaced MatMul read: the Transpose is
    pulled into the original side, so both sides see the same V (without it they would not agree)."""
    path = save_model(_attention_with_v_transposed())
    r = rewrite(path, RewriteOptions(verify_scope="regions"))
    assert [a.kernel for a in r.applied] == ["MultiHeadAttention"]
    assert r.verification.ok and not r.verification.uncut and r.verification.regions == 1
    monkeypatch.setattr(Cutter, "_bridge", lambda self, only_before, reads_after: [])
    with pytest.raises(FuseError, match="verification failed: region attention -> MultiHeadAttention"):
        rewrite(path, RewriteOptions(verify_scope="regions"))


def test_a_cycle_leaves_that_region_unfused(save_model, monkeypatch):
    """A fused node that reads what is made from its own output (here relu0's FusedConv reading r2) would
    make a cycle: that region stays as it was, said in a warning, and the rest is rewritten and verified."""
    def loop_back(e):
        if e.nodes[-1].output[0] == "r0":
            e.nodes[-1].input.extend(["", "r2"])  # FusedConv's Z: X, W, B, Z

    _sabotaged(monkeypatch, "conv_bias_act", loop_back)
    r = rewrite(save_model(_distinct_conv_chain(3)), RewriteOptions(batch=2))
    assert [a.nodes for a in r.applied] == [["conv1", "relu1"], ["conv2", "relu2"]]
    (warning,) = [w for w in r.warnings if w.startswith("not rewritten")]
    assert warning.startswith("not rewritten: conv_bias_act at relu0: the fused node would read 'r2', made "
                              "from its own output (a cycle"), warning
    assert [n.op_type for n in r.model.graph.node] == ["Conv", "Relu", "FusedConv", "FusedConv"]
    assert r.verification.ok and r.verification.regions == 2
