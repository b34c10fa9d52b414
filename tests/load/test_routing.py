"""--routing balanced: mixture-of-experts token counts sized under a stated assumption (load/routing.py).

The balanced indices are checked by running them with onnxruntime; Mixtral's bytes against PyTorch's own
saved_tensors_hooks (the mean over random inputs: the routed total is tokens*k whatever the routing, so a
random routing's bytes are a balanced one's as long as every expert gets tokens)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from fusecli.load.routing import balanced, find_routers
from fusecli.pipeline import Options, analyze
from fusecli.report.document import to_json
from fusecli.report.text import report_lines
from tests import hf_models
from tests.conftest import make_model, vi

D, E, K = 8, 4, 2


def _moe(router: str = "TopK"):
    """x [tokens, D] -> softmax(x W) -> TopK (k=K) or ArgMax -> one_hot -> expert 0's tokens
    (nonzero, as Mixtral's eager experts) -> x[tokens of expert 0] @ W0 -> relu -> sum."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((D, E)).astype(np.float32), "w_router"),
             numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32), "w_expert"),
             numpy_helper.from_array(np.array([K], np.int64), "k"),
             numpy_helper.from_array(np.array(E, np.int64), "depth"),
             numpy_helper.from_array(np.array([0.0, 1.0], np.float32), "onoff"),
             numpy_helper.from_array(np.array(0, np.int64), "expert"),
             numpy_helper.from_array(np.array(1, np.int64), "row")]
    choose = (helper.make_node("TopK", ["probs", "k"], ["top", "idx"], axis=-1) if router == "TopK"
              else helper.make_node("ArgMax", ["probs"], ["idx"], axis=1, keepdims=1))
    nodes = [
        helper.make_node("MatMul", ["x", "w_router"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        choose,
        helper.make_node("OneHot", ["idx", "depth", "onoff"], ["mask"], axis=-1),  # [tokens, k, E]
        helper.make_node("Transpose", ["mask"], ["mask_t"], perm=[2, 1, 0]),  # [E, k, tokens]
        helper.make_node("Gather", ["mask_t", "expert"], ["mine"], axis=0),  # [k, tokens]
        helper.make_node("NonZero", ["mine"], ["where"]),  # [2, n]
        helper.make_node("Gather", ["where", "row"], ["token_idx"], axis=0),  # [n]
        helper.make_node("Gather", ["x", "token_idx"], ["x_e"], axis=0),  # [n, D]
        helper.make_node("MatMul", ["x_e", "w_expert"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("ReduceSum", ["r"], ["y"], keepdims=0),
    ]
    return make_model(nodes, [vi("x", "tokens", D)], [vi("y")], inits)


def _x_e_bytes(a) -> int | None:
    return a.graph.tensors["x_e"].nbytes(a.sizes)


def test_balanced_indices_are_round_robin_when_run():
    """What the assumption writes, run by onnxruntime: choice j of token t is expert (t*k + j) mod E."""
    ort = pytest.importorskip("onnxruntime")
    model = _moe()
    [router] = find_routers(model)
    assert (router.op, router.indices) == ("TopK", "idx")
    out = balanced(model, [router])
    out.graph.output.append(vi("idx", "tokens", K, dtype=TensorProto.INT64))
    out.graph.output.append(vi("token_idx", None, dtype=TensorProto.INT64))
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((31, D)).astype(np.float32)
    _, idx, token_idx = session.run(None, {"x": x})
    np.testing.assert_array_equal(idx, np.arange(31 * K).reshape(31, K) % E)
    assert len(token_idx) == 16  # 62 choices over 4 experts: experts 0 and 1 get 16, 2 and 3 get 15


@pytest.mark.parametrize("router", ["TopK", "ArgMax"])
@pytest.mark.parametrize("tokens", [32, 30])
def test_routed_tensors_sized_only_under_the_assumption(save_model, router, tokens):
    path = save_model(_moe(router))
    k = K if router == "TopK" else 1
    plain = analyze(path, Options(dims={"tokens": tokens}))
    assert _x_e_bytes(plain) is None
    assert any("data-dependent size" in w and "--routing balanced" in w for w in plain.warnings)
    hint = to_json(plain)["routing"]  # the '?' bytes explained in the JSON, and in the report's first lines
    assert hint["assumption"] is None and "--routing balanced" in hint["hint"]
    head = "\n".join(report_lines(plain)[:8])
    assert "--routing balanced sizes" in " ".join(head.split()), head

    a = analyze(path, Options(dims={"tokens": tokens}, routing="balanced"))
    assert "routing: not assumed" not in "\n".join(report_lines(a))
    per_expert = -(-tokens * k // E)  # expert 0 gets the one more choice where E does not divide them
    assert _x_e_bytes(a) == per_expert * D * 4
    doc = to_json(a)
    assert doc["memory"]["incomplete"] == [] and doc["memory"]["unknown_tensors"] == 0
    assert doc["routing"]["routers"] == [{"node": doc["routing"]["routers"][0]["node"], "op": router,
                                          "k": k, "experts": E}]
    assert doc["routing"]["tokens_per_expert"] == {"routed1": per_expert}
    assert any(w.startswith("assumed (--routing balanced)") for w in a.warnings)


def test_no_router_is_said(save_model, tmp_path):
    """A model without a router: the option changes nothing, and says so."""
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    path = save_model(make_model(nodes, [vi("x", "n", 4)], [vi("y", "n", 4)]))
    a = analyze(path, Options(dims={"n": 3}, routing="balanced"))
    assert any("no router found" in w for w in a.warnings)


# -- Mixtral, transformers' eager experts, default attention, TorchScript export ----------------------------
@pytest.fixture(scope="module")
def mixtral(hf_onnx):
    return hf_onnx("mixtral", "torchscript", attn="default")


@pytest.mark.parametrize("seq", [32, 128])
def test_mixtral_balanced_bytes_match_pytorch(mixtral, seq):
    config = hf_models.build("mixtral", attn="default").inner.config
    k, experts = config.num_experts_per_tok, config.num_local_experts
    a = analyze(mixtral, Options(batch=2, dims={"seq": seq}, routing="balanced"))
    doc = to_json(a)
    assert doc["memory"]["unknown_tensors"] == 0 and doc["memory"]["incomplete"] == []
    assert doc["routing"]["tokens_per_expert"] == {"routed1": 2 * seq * k // experts}
    assert {(r["k"], r["experts"]) for r in doc["routing"]["routers"]} == {(k, experts)}
    assert len(doc["routing"]["routers"]) == config.num_hidden_layers
    pytorch = np.mean([hf_models.pytorch_saved_bytes("mixtral", 2, seq, attn="default", seed=s)
                       for s in range(3)])
    ratio = doc["memory"]["saved_activation_bytes"] / pytorch
    assert ratio == pytest.approx(1, rel=0.01), ratio  # the routed total is tokens*k however it routes


def test_mixtral_expert_weights_are_parameters_and_swiglu_matches(mixtral):
    """w[e] (a Gather of a 3-D expert parameter by the routed expert's index) is a view of the parameter,
    as in PyTorch: never a saved activation; each expert's SiLU(gate) * up is one swiglu."""
    config = hf_models.build("mixtral", attn="default").inner.config
    a = analyze(mixtral, Options(batch=2, dims={"seq": 32}, routing="balanced"))
    slices = [n for n in a.graph.nodes if n.op_type == "Gather" and n.inputs[0].kind == "parameter"
              and len(n.inputs[0].shape) == 3]
    assert len(slices) == 2 * config.num_hidden_layers * config.num_local_experts  # gate_up and down
    assert all(t.kind == "parameter" for n in slices for t in n.outputs)
    assert not any(s.tensor.producer in slices for s in a.liveness.saved if s.tensor.kind == "activation")
    swiglu = [m for m in a.matches if m.pattern.name == "swiglu"]
    assert len(swiglu) == config.num_hidden_layers * config.num_local_experts


def test_cli_option_reaches_the_json(save_model):
    import json

    from click.testing import CliRunner

    from fusecli.cli import main

    path = save_model(_moe())
    result = CliRunner().invoke(main, ["analyze", path, "--dim", "tokens=32", "--routing", "balanced",
                                       "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["routing"]["tokens_per_expert"] == {"routed1": 16} and doc["memory"]["unknown_tensors"] == 0
    bad = CliRunner().invoke(main, ["analyze", path, "--routing", "even"])
    assert bad.exit_code == 2
