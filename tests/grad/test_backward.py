"""build_backward on the samples and on small graphs: what backward ops it makes and what they read."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from fusecli.grad.backward import build_backward
from fusecli.load import load_model
from tests.conftest import make_model, vi

SAMPLES = ["conv_bias_relu", "conv_bn_relu", "bn_add_relu", "conv_squeeze_bias", "matmul_bias_relu"]


def value_reads(joint) -> set[str]:
    """Forward tensors that some backward node takes as an input."""
    return {t.name for n in joint.backward_nodes() for t in n.inputs
            if t.producer is None or t.producer.phase == "forward"}


def grad_node(joint, name: str):
    """The node that makes the total gradient of tensor ``name``."""
    return next(t.producer for t in joint.outputs if t.meta.get("grad_of") == name)


@pytest.mark.parametrize("name", SAMPLES)
@pytest.mark.parametrize("wrt_inputs", [False, True])
def test_joint_graph_of_each_sample_lints(sample, name, wrt_inputs):
    forward = load_model(sample(name))
    joint = build_backward(forward, wrt_inputs)
    joint.lint()
    assert [n.name for n in joint.forward_nodes()] == [n.name for n in forward.nodes]
    assert joint.backward_nodes()
    grads = {t.meta["grad_of"] for t in joint.outputs if "grad_of" in t.meta}
    # every parameter but BatchNorm's running statistics, which are not trained
    params = {t.name for t in forward.tensors.values() if t.kind == "parameter"} - {"bn_mean", "bn_var"}
    assert grads == (params | {"x"} if wrt_inputs else params)


def test_conv_bias_relu_reads_x_w_and_y(sample):
    joint = build_backward(load_model(sample("conv_bias_relu")), wrt_inputs=True)
    assert value_reads(joint) == {"x", "w", "y"}
    by_op = {n.op_type: n for n in joint.backward_nodes()}
    assert [t.name for t in by_op["ReluGrad"].inputs[1:]] == ["y"]


def test_without_input_gradients_conv_needs_no_weight(sample):
    joint = build_backward(load_model(sample("conv_bias_relu")))
    assert value_reads(joint) == {"x", "y"}
    assert not any(n.op_type == "ConvBackpropInput" for n in joint.backward_nodes())


def test_conv_with_its_own_bias_reads_x_w_and_y(save_model):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv_out"], "conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv_out"], ["y"], "relu")]
    inits = [numpy_helper.from_array(np.zeros((8, 3, 3, 3), np.float32), "w"),
             numpy_helper.from_array(np.zeros(8, np.float32), "b")]
    joint = build_backward(load_model(save_model(make_model(
        nodes, [vi("x", "N", 3, 16, 16)], [vi("y", "N", 8, 16, 16)], inits))), wrt_inputs=True)
    joint.lint()
    assert value_reads(joint) == {"x", "w", "y"}
    assert grad_node(joint, "b").op_type == "BiasAddGrad"


@pytest.mark.parametrize("bias_first", [False, True])
def test_a_bias_gets_a_bias_sized_gradient_whichever_operand_it_is(save_model, bias_first):
    """Add(bias, x), as the TorchScript exporter writes a Linear's bias, as well as Add(x, bias): the bias's
    gradient is its BiasAddGrad (bias-sized), x's the pass-through."""
    ins = ["b", "h"] if bias_first else ["h", "b"]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], "mm"), helper.make_node("Add", ins, ["y"], "add")]
    inits = [numpy_helper.from_array(np.ones((16, 32), np.float32), "w"),
             numpy_helper.from_array(np.ones(32, np.float32), "b")]
    joint = build_backward(load_model(save_model(make_model(
        nodes, [vi("x", "N", 16)], [vi("y", "N", 32)], inits))), wrt_inputs=False)
    joint.lint()
    grads = {t.meta["grad_of"]: t for t in joint.outputs if t.meta.get("grad_of")}
    assert grads["b"].shape == (32,) and grads["b"].producer.op_type == "BiasAddGrad"
    assert grads["w"].shape == (16, 32)


def test_two_consumers_have_their_gradients_summed_by_addn(sample):
    joint = build_backward(load_model(sample("bn_add_relu")), wrt_inputs=True)
    total = grad_node(joint, "x")
    assert total.op_type == "AddN"
    assert sorted(t.producer.meta["forward"] for t in total.inputs) == ["conv_a", "conv_b"]
    assert all(t.producer.op_type == "ConvBackpropInput" for t in total.inputs)
    assert len([n for n in joint.backward_nodes() if n.op_type == "AddN"]) == 1


def test_integer_tensors_and_shape_ops_get_no_backward(save_model):
    nodes = [helper.make_node("Shape", ["x"], ["shape"], "shape"),
             helper.make_node("Reshape", ["x", "shape"], ["r"], "reshape"),
             helper.make_node("Gather", ["r", "idx"], ["g"], "gather"),
             helper.make_node("Relu", ["g"], ["y"], "relu")]
    idx = numpy_helper.from_array(np.array([0, 1], "int64"), "idx")
    joint = build_backward(load_model(save_model(make_model(
        nodes, [vi("x", 3, 4)], [vi("y", 2, 4)], [idx]))), wrt_inputs=True)
    joint.lint()
    assert {n.meta.get("forward") for n in joint.backward_nodes()} == {None, "relu", "gather", "reshape"}
    grads_of_ints = [t for n in joint.backward_nodes() for t in n.outputs if not t.is_float]
    assert grads_of_ints == []
    assert {t.meta["grad_of"] for t in joint.outputs if "grad_of" in t.meta} == {"x"}
    assert grad_node(joint, "x").meta["forward"] == "reshape"


def test_unknown_op_gets_a_backward_reading_all_its_inputs_and_outputs(save_model):
    nodes = [helper.make_node("Frobnicate", ["x", "w"], ["f", "aux"], "frob", domain="custom.ops"),
             helper.make_node("Relu", ["f"], ["y"], "relu")]
    w = numpy_helper.from_array(np.ones((3, 4), "float32"), "w")
    model = make_model(nodes, [vi("x", 2, 3)], [vi("y", 2, 4)], [w])
    model.opset_import.append(helper.make_opsetid("custom.ops", 1))
    joint = build_backward(load_model(save_model(model)), wrt_inputs=True)
    joint.lint()
    grad = next(n for n in joint.backward_nodes() if n.meta.get("forward") == "frob")
    assert grad.op_type == "FrobnicateGrad" and joint.node("frob").meta["unsupported"]
    assert {t.name for t in grad.inputs if t.producer is None or t.producer.phase == "forward"} == \
        {"x", "w", "f", "aux"}
    assert [t.shape for t in grad.outputs] == [(2, 3), (3, 4)]
    assert {grad_node(joint, "x"), grad_node(joint, "w")} == {grad}


def test_backward_names_of_slash_led_forward_names_have_one_slash(save_model):
    """Issue 27: PyTorch names nodes '/m/Relu'; its backward op is 'gradients/m/Relu/ReluGrad'."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], "/m/Relu"),
             helper.make_node("Sigmoid", ["r"], ["y"], "/m/Sigmoid")]
    joint = build_backward(load_model(save_model(make_model(nodes, [vi("x", "N", 8)], [vi("y", "N", 8)]))),
                           wrt_inputs=True)
    joint.lint()
    names = [n.name for n in joint.backward_nodes()]
    assert "gradients/m/Relu/ReluGrad" in names and not any("//" in n for n in names)
