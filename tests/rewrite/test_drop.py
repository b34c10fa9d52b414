"""A region whose cut-out says the rest of the graph would read a tensor nothing makes any more is left
out of the pass (said and counted); the others stay with their cases."""

from __future__ import annotations

from types import SimpleNamespace

from fusecli.rewrite.run import _drop_miswired


def test_miswired_emission_is_left_out_said_and_counted():
    good, bad = SimpleNamespace(pattern="gelu", at="n1"), SimpleNamespace(pattern="skip_layer_norm", at="n2")
    skipped: list[str] = []
    left_out: list[str] = []
    kept, cases = _drop_miswired([good, bad], ["case-1", "wiring: x drops 't', which other nodes read"],
                                 skipped, left_out)
    assert kept == [good] and cases == ["case-1"]
    assert skipped == left_out == ["skip_layer_norm at n2: x drops 't', which other nodes read"]
    _drop_miswired([bad], ["wiring: x drops 't', which other nodes read"], skipped, left_out)
    assert len(left_out) == 1  # a later pass meeting the same region says it once


def test_uncut_but_not_miswired_regions_stay():
    e = SimpleNamespace(pattern="attention", at="n3")
    kept, cases = _drop_miswired([e], ["a node with a subgraph"], None, None)
    assert kept == [e] and cases == ["a node with a subgraph"]


def test_a_region_that_fails_its_check_is_left_unfused_and_the_rest_written(hf_onnx, monkeypatch, tmp_path):
    """An emitter that writes the wrong kernel (erf GELU written as the tanh approximation): its regions
    fail their check, so the rewrite is made again without them, says which and why, counts them, and
    writes the rest, verified; the file written is the model without them."""
    import onnx

    from fusecli.rewrite import RewriteOptions, rewrite
    from fusecli.rewrite.kernels import registry as emit_module

    right = emit_module.EMITTERS["bias_gelu"]

    def wrong(m, ctx):
        e = right(m, ctx)
        if e is not None:
            for n in e.nodes:
                if n.op_type == "BiasGelu":
                    n.op_type = "FastGelu"  # y = x * sigmoid(1.702 x)-like error: not the erf GELU
        return e

    path = hf_onnx("bert", "torchscript", attn="default")
    options = RewriteOptions(batch=2, dims={"seq": 16})
    clean = rewrite(path, options)
    assert clean.kernel_counts().get("BiasGelu") == 2 and clean.left_out == 0
    monkeypatch.setitem(emit_module.EMITTERS, "bias_gelu", wrong)
    out = tmp_path / "fused.onnx"
    r = rewrite(path, options, str(out))
    assert r.verification.ok and r.left_out == 2, (r.left_out, r.warnings)
    said = [w for w in r.warnings if "its region differs from the nodes it replaced" in w]
    assert len(said) == 2 and all(w.startswith("not rewritten: bias_gelu at ") for w in said), r.warnings
    kernels = r.kernel_counts()
    assert "BiasGelu" not in kernels and "FastGelu" not in kernels
    for k, n in clean.kernel_counts().items():  # everything else still fused (the GELU's own 0.5 scale
        assert k == "BiasGelu" or kernels.get(k) == n, (k, kernels)  # may now join the next MatMul)
    written = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert "FastGelu" not in written and "MultiHeadAttention" in written
