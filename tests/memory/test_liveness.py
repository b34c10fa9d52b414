"""analyze_liveness on the samples: the saved set of each seed fusion, its bytes, peak and timeline."""

from __future__ import annotations

import pytest

from fusecli.grad.backward import build_backward
from fusecli.load import load_model
from fusecli.memory.liveness import analyze_liveness
from fusecli.memory.sizes import bind

SAMPLES = ["conv_bias_relu", "conv_bn_relu", "bn_add_relu", "conv_squeeze_bias", "matmul_bias_relu"]


def liveness(path: str, wrt_inputs: bool = True, batch: int = 2):
    joint = build_backward(load_model(path), wrt_inputs)
    joint.lint()
    return joint, analyze_liveness(joint, bind(joint, batch, {})[0])


def saved_values(live) -> set[str]:
    return {s.tensor.name for s in live.saved if s.reads == "value"}


@pytest.mark.parametrize("name", ["conv_bias_relu", "matmul_bias_relu"])
def test_bias_relu_fusions_save_x_w_and_y(sample, name):
    _, live = liveness(sample(name))
    assert saved_values(live) == {"x", "w", "y"}
    assert live.saved_by_name["y"].needed_by[0].op_type == "ReluGrad"


def test_by_default_only_parameter_gradients_so_conv_bias_relu_saves_x_and_y(sample):
    _, live = liveness(sample("conv_bias_relu"), wrt_inputs=False)
    assert saved_values(live) == {"x", "y"}


def test_conv_bn_relu_saves_the_conv_output(sample):
    _, live = liveness(sample("conv_bn_relu"))
    assert saved_values(live) == {"x", "w", "conv_out", "bn_scale", "bn_mean", "bn_var", "y"}
    assert [n.op_type for n in live.saved_by_name["conv_out"].needed_by] == ["BatchNormGrad"]


def test_bn_add_relu_saves_neither_the_bn_nor_the_add_output_nor_the_side_input(sample):
    _, live = liveness(sample("bn_add_relu"))
    saved = saved_values(live)
    assert not saved & {"bn_out", "add_out", "z"}
    assert {"conv_a_out", "y"} <= saved


def test_saved_activation_bytes_of_conv_bias_relu_are_y(sample):
    joint, live = liveness(sample("conv_bias_relu"), batch=8)
    y = joint.tensors["y"]
    assert live.saved_activation_bytes == y.nbytes({"N": 8}) == 8 * 8 * 16 * 16 * 4
    assert live.saved_bytes == sum(joint.tensors[n].nbytes({"N": 8}) for n in ("x", "w", "y"))


def test_shape_reads_cost_nothing_unless_asked(sample):
    joint, live = liveness(sample("conv_squeeze_bias"))
    assert all(s.reads == "value" for s in live.saved)
    kept = analyze_liveness(joint, {"N": 2}, keeps_for_shape=lambda t, reader: True)
    shapes = {s.tensor.name: [n.op_type for n in s.needed_by] for s in kept.saved if s.reads == "shape"}
    assert shapes == {"conv_out": ["ReshapeToInput"], "b": ["BiasAddGrad"], "y": ["OnesLike"]}


@pytest.mark.parametrize("name", SAMPLES)
def test_peak_and_timeline(sample, name):
    joint, live = liveness(sample(name))
    assert len(live.timeline) == len(live.schedule) == len(joint.nodes)
    assert max(live.timeline) == live.peak_bytes == live.timeline[live.peak_step]
    assert live.peak_bytes >= live.saved_bytes > 0
    assert min(live.timeline) >= live.resident_bytes
    assert live.schedule[live.boundary].phase == "backward"
    assert all(n.phase == "forward" for n in live.schedule[:live.boundary])
