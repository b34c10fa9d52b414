"""Weights in Constant nodes: recognised by role, trainable by default, matched as initializers are."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from onnx_ir.passes.common import LiftConstantsToInitializersPass

from fusecli.cli import main
from fusecli.load import load_model
from fusecli.load.constant_weights import no_parameter_warning
from fusecli.pipeline import Options, analyze
from tests.conftest import make_model, vi
from tests.load.onnxscript_models import SMALL, save

WEIGHTS = ("emb", "ln_g", "ln_b", "w", "b", "g2", "c")  # in a weight's role
NOT_WEIGHTS = ("scale", "table", "shape")  # a scalar, a table added whole, an int shape


def _constant(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=f"make_{name}",
                            value=numpy_helper.from_array(value, name))


def _block() -> onnx.ModelProto:
    """Embedding, LayerNorm, MatMul by a transposed weight, bias, channel scale, a CastLike'd bias."""
    rng = np.random.default_rng(0)

    def f(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    consts = [_constant("emb", f(100, 64)), _constant("ln_g", f(64)), _constant("ln_b", f(64)),
              _constant("w", f(64, 64)), _constant("b", f(64)), _constant("g2", f(64)), _constant("c", f(64)),
              _constant("scale", np.array(0.125, np.float32)), _constant("table", f(8, 64)),
              _constant("shape", np.array([0, 8, 64], np.int64))]
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "ln_g", "ln_b"], ["n"], axis=-1),
             helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["n", "wt"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Mul", ["a", "g2"], ["s"]), helper.make_node("CastLike", ["c", "s"], ["cc"]),
             helper.make_node("Add", ["s", "cc"], ["s2"]), helper.make_node("Relu", ["s2"], ["r"]),
             helper.make_node("Mul", ["r", "scale"], ["t"]), helper.make_node("Add", ["t", "table"], ["u"]),
             helper.make_node("Reshape", ["u", "shape"], ["y"])]
    for n in nodes:
        n.name = f"op_{n.output[0]}"
    return make_model(consts + nodes, [vi("ids", "N", 8, dtype=TensorProto.INT64)], [vi("y", "N", 8, 64)])


@pytest.fixture(scope="module")
def block(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("block") / "block.onnx"
    onnx.save(_block(), str(path))
    return str(path)


def test_weights_in_their_roles_become_parameters(block):
    g = load_model(block)
    assert {n: g.tensors[n].kind for n in WEIGHTS} == dict.fromkeys(WEIGHTS, "parameter")
    assert {n: g.tensors[n].kind for n in NOT_WEIGHTS} == dict.fromkeys(NOT_WEIGHTS, "constant")
    assert g.tensors["wt"].kind == "parameter"  # the transposed weight, made from one
    assert g.meta["constant_weights"] == len(WEIGHTS)
    a = analyze(block, Options(batch=2))
    assert a.joint.backward_nodes() and not any("no trainable parameter" in w for w in a.warnings)


def test_turned_off_they_stay_constants_and_the_warning_says_how_to_differentiate(block):
    a = analyze(block, Options(batch=2, constant_weights=False))
    assert not any(t.kind == "parameter" for t in a.graph.tensors.values())
    assert a.joint.backward_nodes() == []
    (warning,) = [w for w in a.warnings if "no trainable parameter" in w]
    assert f"{len(WEIGHTS)} Constant nodes in a weight's role" in warning
    assert "--wrt inputs" in warning and "--constant-weights parameters" in warning


def test_a_model_without_weights_gets_the_warning(save_model):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", 2, 3)], [vi("y", 2, 3)])
    a = analyze(save_model(model), Options())
    assert a.joint.backward_nodes() == []
    assert any("no trainable parameter (no float weight at all)" in w and "--wrt inputs" in w
               for w in a.warnings)
    assert no_parameter_warning(a.graph) is not None and not analyze(
        save_model(model), Options(wrt_inputs=True)).warnings


def test_cli_reports_the_count_and_the_option(block):
    r = CliRunner().invoke(main, ["analyze", block, "--json", "--batch", "2"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["forward"]["constant_weights"] == len(WEIGHTS) and doc["backward"]["nodes"] > 0
    r = CliRunner().invoke(main, ["analyze", block, "--json", "--batch", "2",
                                  "--constant-weights", "constants"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["forward"]["constant_weights"] == 0 and doc["backward"]["nodes"] == 0
    assert "warning: the model has no trainable parameter" in r.stderr
    r = CliRunner().invoke(main, ["analyze", block, "--batch", "2"])
    assert f"{len(WEIGHTS)} parameters read from Constant nodes" in r.stdout


def _lifted(path: str, out: str) -> str:
    model = ir.load(path)
    LiftConstantsToInitializersPass(size_limit=16)(model)
    ir.save(model, out)
    return out


def _summary(path: str, **kw) -> tuple[Counter, list, int, int]:
    a = analyze(path, Options(batch=2, **kw))
    matches = Counter((m.pattern.name, tuple(sorted(n.name for n in m.nodes if n.op_type != "Constant")))
                      for m in a.matches)
    verdicts = sorted((m.pattern.name, m.verdict.inference_safe, m.verdict.training_safe) for m in a.matches)
    return matches, verdicts, len(a.joint.backward_nodes()), a.graph.meta.get("constant_weights", 0)


def test_block_matches_as_with_initializers(block, tmp_path):
    const = _summary(block)
    init = _summary(_lifted(block, str(tmp_path / "lifted.onnx")))
    assert const[0] == init[0] and const[1] == init[1] and const[0]
    assert const[3] == len(WEIGHTS) and init[3] == 0


@pytest.fixture(scope="session")
def onnxscript_models(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """onnxscript's BART encoder and Whisper encoder, weights as Constant nodes and as initializers."""
    folder = tmp_path_factory.mktemp("onnxscript_models")
    return {name: tuple(str(p) for p in save(name, folder)) for name in SMALL}


@pytest.mark.parametrize("name", SMALL)
def test_onnxscript_models_match_as_with_initializers(onnxscript_models, name, tmp_path):
    constants, initializers = onnxscript_models[name]
    assert not onnx.load(constants, load_external_data=False).graph.initializer
    const, init = _summary(constants), _summary(initializers)
    assert const[0] == init[0] and const[1] == init[1] and sum(const[0].values()) > 0
    assert const[3] > 0 and init[3] == 0
    # the same backward graph as the file whose recognised weights (only those) are initializers: onnx_ir
    # lifts every constant of 16+ elements, Whisper's positional table too, which is no weight's operand
    weights = [t.name for t in load_model(constants).tensors.values() if t.meta.get("constant_weight")]
    assert len(weights) == const[3]
    same = _summary(_lift(constants, weights, str(tmp_path / "weights_lifted.onnx")))
    assert const[2] > 0 and const[2] == same[2] and const[0] == same[0] and same[3] == 0


def _lift(path: str, names: list[str], out: str) -> str:
    """``path`` with the Constant nodes making ``names`` turned into initializers."""
    model = onnx.load(path)
    keep, lifted = [], []
    for n in model.graph.node:
        if n.op_type == "Constant" and n.output[0] in names:
            t = onnx.TensorProto()
            t.CopyFrom(n.attribute[0].t)
            t.name = n.output[0]
            lifted.append(t)
        else:
            keep.append(n)
    del model.graph.node[:]
    model.graph.node.extend(keep)
    model.graph.initializer.extend(lifted)
    onnx.save(model, out)
    return out
