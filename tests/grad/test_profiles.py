"""Autodiff profiles: which one a model gets, that ``ops`` is the plain per-op rules, what each changes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from onnx import helper

from fusecli.cli import main
from fusecli.core.ir import Graph
from fusecli.grad.backward import build_backward
from fusecli.grad.profiles import OPS, TENSORFLOW, choose_profile, get_profile
from fusecli.load import load_model
from fusecli.memory.liveness import analyze_liveness
from fusecli.pipeline import Options, analyze
from tests.conftest import make_model, vi


def _model(producer: str = "", nodes=None):
    nodes = nodes or [helper.make_node("Relu", ["x"], ["y"], "relu")]
    model = make_model(nodes, [vi("x", 2, 3)], [vi("y", 2, 3)])
    model.producer_name = producer
    return model


@pytest.mark.parametrize(("producer", "expected"), [
    ("pytorch", "pytorch"), ("tf2onnx", "tensorflow"), ("keras2onnx", "tensorflow"), ("skl2onnx", "ops"),
    ("", "ops")])
def test_onnx_profile_follows_producer_name(save_model, producer, expected):
    graph = load_model(save_model(_model(producer)))
    profile, reason = choose_profile(graph)
    assert profile.name == expected
    assert (repr(producer) in reason) if producer else ("without producer_name" in reason)


def test_override_wins(save_model):
    graph = load_model(save_model(_model("pytorch")))
    assert choose_profile(graph, "ops") == (OPS, "--autodiff")
    assert choose_profile(graph, "tensorflow")[0] is TENSORFLOW


def test_savedmodel_gets_tensorflow():
    g = Graph("sm", fmt="savedmodel")
    assert choose_profile(g) == (TENSORFLOW, "a TensorFlow SavedModel")


def test_cli_json_names_the_profile(save_model):
    path = save_model(_model("pytorch"))
    runner = CliRunner()
    doc = json.loads(runner.invoke(main, ["analyze", path, "--json"]).stdout)
    assert doc["autodiff"]["profile"] == "pytorch" and "producer_name" in doc["autodiff"]["reason"]
    doc = json.loads(runner.invoke(main, ["analyze", path, "--json", "--autodiff", "ops"]).stdout)
    assert doc["autodiff"] == {"profile": "ops", "reason": "--autodiff", "composites": 0}
    bad = runner.invoke(main, ["analyze", path, "--autodiff", "jax"])
    assert bad.exit_code == 2 and "jax" in bad.output


def test_ops_profile_is_the_default_build(sample):
    """--autodiff ops is what build_backward does without a profile: same nodes, same reads."""
    for name in ("conv_bias_relu", "bn_add_relu", "conv_bn_relu", "matmul_bias_relu"):
        graph = load_model(sample(name))
        a = build_backward(graph)
        b = analyze(sample(name), Options(batch=2, autodiff="ops")).joint
        assert [(n.op_type, [t.name for t in n.inputs]) for n in a.nodes] == \
               [(n.op_type, [t.name for t in n.inputs]) for n in b.nodes]


def test_pytorch_overrides_read_x_where_tensorflow_reads_y(save_model):
    """relu6: PyTorch's hardtanh_backward saves x, TensorFlow's Relu6Grad reads y."""
    lo, hi = helper.make_tensor("lo", 1, [], [0.0]), helper.make_tensor("hi", 1, [], [6.0])
    model = make_model([helper.make_node("Clip", ["x", "lo", "hi"], ["y"], "clip")], [vi("x", 2, 3)],
                       [vi("y", 2, 3)], [lo, hi])
    graph = load_model(save_model(model))
    reads = {}
    for name in ("ops", "pytorch"):
        joint = build_backward(graph, wrt_inputs=True, profile=get_profile(name))
        joint.lint()
        reads[name] = {s.tensor.name for s in analyze_liveness(joint).saved}
    assert reads == {"ops": {"y"}, "pytorch": {"x"}}


def test_pytorch_views_share_their_base(save_model):
    """A reshape is a view in PyTorch: backward that reads it keeps its base's storage, counted once."""
    import numpy as np
    from onnx import numpy_helper

    shape = numpy_helper.from_array(np.array([3, 2], np.int64), "shape")
    w = numpy_helper.from_array(np.ones((2, 4), np.float32), "w")
    model = make_model([helper.make_node("Sigmoid", ["x"], ["s"], "sig"),
                        helper.make_node("Reshape", ["s", "shape"], ["r"], "reshape"),
                        helper.make_node("MatMul", ["r", "w"], ["y"], "mm")],
                       [vi("x", 2, 3)], [vi("y", 3, 4)], [shape, w])
    graph = load_model(save_model(model))
    saved = {}
    for name in ("ops", "pytorch"):
        joint = build_backward(graph, profile=get_profile(name))
        saved[name] = {s.tensor.name for s in analyze_liveness(joint).saved if s.tensor.kind == "activation"}
    assert saved == {"ops": {"r"}, "pytorch": {"s"}}


def test_dynamo_notes_say_which_initializers_pytorch_differentiates(save_model):
    """torch.export's signature and onnxscript's folded_from: buffers and values folded from them only
    are no parameters for the PyTorch profile; a value folded from a parameter is one."""
    import numpy as np
    from onnx import StringStringEntryProto, numpy_helper

    from fusecli.grad.torch_export import FOLDED, KIND, SIGNATURE, frozen_parameters

    names = ("w", "wt", "cos", "buf")
    inits = [numpy_helper.from_array(np.ones((2, 3), np.float32), n) for n in names]
    nodes = [helper.make_node("Mul", ["x", n], [f"y{i}"], f"m{i}") for i, n in enumerate(names)]
    nodes.append(helper.make_node("Sum", ["y0", "y1", "y2", "y3"], ["y"], "sum"))
    model = make_model(nodes, [vi("x", 2, 3)], [vi("y", 2, 3)], inits)
    notes = {"w": {KIND: "PARAMETER"}, "wt": {FOLDED: "['lin.weight']"},
             "cos": {FOLDED: "['arange', 'cos', 'rotary.inv_freq']"}, "buf": {KIND: "BUFFER"}}
    for name, meta in notes.items():
        info = vi(name, 2, 3)
        info.metadata_props.extend(StringStringEntryProto(key=k, value=v) for k, v in meta.items())
        model.graph.value_info.append(info)
    model.graph.metadata_props.append(StringStringEntryProto(key=SIGNATURE, value=(
        "\n# inputs\np_w: PARAMETER target='w'\np_lin_weight: PARAMETER target='lin.weight'\n"
        "b_rotary_inv_freq: BUFFER target='rotary.inv_freq' persistent=False\nx: USER_INPUT\n")))
    graph = load_model(save_model(model))
    assert frozen_parameters(graph) == {"cos", "buf"}
    joint = build_backward(graph, profile=get_profile("pytorch"))
    assert sorted(t.meta["grad_of"] for t in joint.outputs if "grad_of" in t.meta) == ["w", "wt"]
    assert len([t for t in build_backward(graph).outputs if "grad_of" in t.meta]) == 4  # ops: all four
    model.graph.ClearField("metadata_props")  # no signature (TorchScript): every float initializer
    assert frozen_parameters(load_model(save_model(model, "plain.onnx"))) == set()
