"""CastLike(eps, mean): a constant cast to the type of an activation it never reads the values of
(onnxscript's and onnx_ir's spelling of every scalar). Its value is known, it is no reader of ``mean`` a
fused kernel must write out, and the RMSNorm around it matches, fuses and rewrites."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from fusecli.load import load_model
from fusecli.pipeline import Options, analyze
from fusecli.rewrite import RewriteOptions, rewrite
from tests.conftest import make_model, vi
from tests.rewrite.helpers import left_unfused


def _rms_norm_with_castlike():
    """y = (x * 1/sqrt(mean(x^2) + CastLike(eps, mean))) * g, as onnxscript's SmolLM writes it."""
    g = numpy_helper.from_array(np.linspace(0.5, 1.5, 64).astype(np.float32), "g")
    def const(name, value):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value))

    nodes = [const("two", np.array(2.0, np.float32)), const("axes", np.array([-1], np.int64)),
             const("eps", np.array(1e-5, np.float64)),
             helper.make_node("Pow", ["x", "two"], ["sq"], "pow"),
             helper.make_node("ReduceMean", ["sq", "axes"], ["mean"], "mean"),
             helper.make_node("CastLike", ["eps", "mean"], ["eps_cast"], "castlike"),
             helper.make_node("Add", ["mean", "eps_cast"], ["var"], "add_eps"),
             helper.make_node("Sqrt", ["var"], ["std"], "sqrt"),
             helper.make_node("Reciprocal", ["std"], ["inv"], "reciprocal"),
             helper.make_node("Mul", ["x", "inv"], ["normed"], "normalize"),
             helper.make_node("Mul", ["g", "normed"], ["y"], "gain")]
    return make_model(nodes, [vi("x", "batch", 8, 64)], [vi("y", "batch", 8, 64)], [g], opset=18)


def test_castlike_of_a_constant_is_a_constant_with_its_value(save_model):
    g = load_model(save_model(_rms_norm_with_castlike()))
    t = g.tensors["eps_cast"]
    assert t.kind == "constant" and t.dtype == "float32"
    assert t.meta["value"].dtype == np.float32 and np.isclose(t.meta["value"], 1e-5)


def test_rms_norm_around_it_is_safe_to_fuse(save_model):
    a = analyze(save_model(_rms_norm_with_castlike()), Options(batch=2))
    m = next(m for m in a.matches if m.pattern.name == "rms_norm")
    assert "castlike" not in {n.name for n in m.nodes}
    assert m.verdict.inference_safe and m.verdict.training_safe


def test_it_rewrites_to_simplified_layer_normalization_and_verifies(save_model):
    r = rewrite(save_model(_rms_norm_with_castlike()), RewriteOptions(batch=2))
    assert [a.kernel for a in r.applied] == ["SimplifiedLayerNormalization"]
    assert r.ops_after == {"SimplifiedLayerNormalization": 1}  # the CastLike went with what it fed
    assert r.verification.ok and r.verification.regions == 1 and r.verification.checks


def test_a_castlike_whose_target_is_fused_away_becomes_a_cast(save_model):
    """onnxscript's SmolLM-2: the gain is CastLike(g, normed) and normed is inside the match; the fused
    kernel does not make it, so the CastLike becomes Cast(g, to=float) and the model stays wired."""
    model = _rms_norm_with_castlike()
    nodes = list(model.graph.node)
    gain = nodes.pop()  # Mul(g, normed) -> y
    nodes += [helper.make_node("Cast", ["normed"], ["normed_f"], "to_copy", to=1),
              helper.make_node("CastLike", ["g", "normed_f"], ["g_cast"], "gain_cast"),
              helper.make_node("Mul", ["g_cast", "normed_f"], ["y"], gain.name)]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    r = rewrite(save_model(model), RewriteOptions(batch=2))
    assert [a.kernel for a in r.applied] == ["SimplifiedLayerNormalization"]
    assert r.ops_after == {"Cast": 1, "SimplifiedLayerNormalization": 1}
    assert r.verification.ok and r.verification.checks and r.verification.regions == 1


def _skip_layer_norm_with_castlike_weights():
    """Whisper's spelling: s = x + skip; LayerNorm(s, CastLike(g, s), CastLike(b, s)); s read again."""
    def const(name, value):
        return helper.make_node("Constant", [], [name], name, value=numpy_helper.from_array(value, name))

    rng = np.random.default_rng(0)
    nodes = [const("g", (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)),
             const("b", (0.1 * rng.standard_normal(64)).astype(np.float32)),
             helper.make_node("Add", ["x", "skip"], ["s"], "residual"),
             helper.make_node("CastLike", ["g", "s"], ["g_cast"], "g_castlike"),
             helper.make_node("CastLike", ["b", "s"], ["b_cast"], "b_castlike"),
             helper.make_node("LayerNormalization", ["s", "g_cast", "b_cast"], ["n"], "ln", axis=-1),
             helper.make_node("Add", ["s", "n"], ["y"], "next_residual")]
    return make_model(nodes, [vi("x", "batch", 8, 64), vi("skip", "batch", 8, 64)], [vi("y", "batch", 8, 64)],
                      opset=18)


def test_a_castlike_of_what_the_fused_node_makes_becomes_a_cast(save_model):
    """The fused node makes s again (its 4th output) and reads the weights: CastLike(g, s) kept would
    be a cycle (Whisper's 'the graph has a cycle'); it becomes Cast(g, to=float) and the region fuses."""
    r = rewrite(save_model(_skip_layer_norm_with_castlike_weights()), RewriteOptions(batch=2))
    assert [a.kernel for a in r.applied] == ["SkipLayerNormalization"]
    assert not left_unfused(r.warnings), r.warnings
    assert r.ops_after == {"Constant": 2, "Cast": 2, "com.microsoft.SkipLayerNormalization": 1, "Add": 1}
    assert r.verification.ok and r.verification.regions == 1 and r.verification.checks
