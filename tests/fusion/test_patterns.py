"""Each catalogue pattern on a model that has it, with its nodes, and on near-misses that must not match."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusecli.core.trees import match_at, node_key, root_may_match
from fusecli.fusion.patterns import BY_NAME, CATALOGUE
from fusecli.grad.rules import rule_for
from tests.fusion.models import (
    GELU_ERF_NODES,
    LAYER_NORM_NODES,
    Net,
    analyze_model,
    conv_act,
    conv_bn_act,
    conv_squeeze,
    found,
    gelu_erf,
    gelu_tanh,
    layer_norm,
    only,
)

ACTS = {"Relu": "relu", "Clip": "relu6", "LeakyRelu": "leaky_relu", "Elu": "elu", "Sigmoid": "sigmoid",
        "Tanh": "tanh"}


def assert_dataflow(m, expected: list[str]) -> None:
    """The match has exactly the ``expected`` nodes, root last, each after its producers in the match."""
    names = [n.name for n in m.nodes]
    assert sorted(names) == sorted(expected) and names[-1] == expected[-1]
    pos = {id(n): i for i, n in enumerate(m.nodes)}
    for i, n in enumerate(m.nodes):
        assert all(pos[id(t.producer)] < i for t in n.inputs
                   if t is not None and t.producer is not None and id(t.producer) in pos)


def test_catalogue_names_are_unique_and_every_pattern_is_tested():
    assert len(BY_NAME) == len(CATALOGUE)
    text = "".join(p.read_text() for p in Path(__file__).parent.rglob("test_*.py"))  # families/ too
    assert [p.name for p in CATALOGUE if f'"{p.name}"' not in text] == []


# -- conv + bias + activation -------------------------------------------------------------------------
@pytest.mark.parametrize("bias", ["own", "add"])
@pytest.mark.parametrize("act", list(ACTS))
def test_conv_bias_act_with_each_activation(tmp_path, act, bias):
    a = analyze_model(conv_act(act, bias), tmp_path)
    m = only(a, "conv_bias_act")
    assert [n.name for n in m.nodes] == (["conv", "act"] if bias == "own" else ["conv", "bias", "act"])
    assert m.roles["act"].kind == ACTS[act] and m.roles["conv"].name == "conv"
    v = m.verdict
    reads_input = "x0" in rule_for(ACTS[act])[0].reads  # else it reads y, which the kernel writes anyway
    assert v.inference_safe and v.training_safe != reads_input
    assert [b.tensor.name for b in v.blocking] == ([m.roles["act"].inputs[0].name] if reads_input else [])


def test_conv_bias_alone_and_an_activation_outside_the_list(tmp_path):
    a = analyze_model(conv_act("Softplus", "add"), tmp_path)
    assert [m.pattern.name for m in a.matches] == ["conv_bias"]
    assert found(a, "conv_bias") == [["conv", "bias"]]
    assert analyze_model(conv_act("Softplus", "own"), tmp_path).matches == []


@pytest.mark.parametrize("second", ["reader", "output"])
def test_conv_output_read_elsewhere_is_not_fused(tmp_path, second):
    net = Net()
    c = net.conv()
    y = net.act("Relu", net.bias(c))
    outs = (y, net.act("Relu", c, "relu2")) if second == "reader" else (y, c)
    a = analyze_model(net.model(*outs), tmp_path)
    m = next(m for m in a.matches if m.pattern.name == "conv_bias_act" and m.root.name == "act")
    assert [n.name for n in m.nodes] == ["conv", "bias", "act"]
    v = m.verdict
    assert not v.inference_safe and not v.training_safe and v.reason.startswith("not fusable: conv_out")
    assert ("read by relu2" if second == "reader" else "is a graph output") in v.reason
    assert found(a, "conv_bias") == []  # dominated: just as unfusable


def test_add_of_an_activation_is_a_side_input_not_a_bias(tmp_path):
    net = Net(x=("N", 3, 8, 8), z=("N", 4, 8, 8))
    a = analyze_model(net.model(net.act("Relu", net.op("Add", "add", net.conv(), "z"))), tmp_path)
    assert found(a, "conv_bias_act") == [] and found(a, "conv_bias") == []
    assert found(a, "conv_bias_add_act") == [["conv", "add", "act"]]
    assert only(a, "conv_bias_add_act").verdict.training_safe


def test_add_of_a_full_size_parameter_is_neither_bias_nor_side_input(tmp_path):
    net = Net()
    a = analyze_model(net.model(net.act("Relu", net.bias(net.conv(), shape=(4, 8, 8)))), tmp_path)
    assert a.graph.node("bias").kind == "add"
    assert [m.pattern.name for m in a.matches if m.pattern.phase == "forward"] == []


@pytest.mark.parametrize("own_bias", [False, True])
def test_conv_bias_add_act(tmp_path, own_bias):
    net = Net(x=("N", 3, 8, 8), z=("N", 4, 8, 8))
    c = net.conv(own_bias=own_bias)
    c = c if own_bias else net.bias(c)
    a = analyze_model(net.model(net.act("Relu", net.op("Sum", "add", c, "z"))), tmp_path)
    assert found(a, "conv_bias_add_act") == [["conv", "add", "act"] if own_bias else
                                             ["conv", "bias", "add", "act"]]
    assert found(a, "conv_bias_act") == []


# -- conv + batch norm ----------------------------------------------------------------------------------
BN_NODES = {"op": ["bn"], "add": ["scale", "shift"], "sub": ["scale", "shift"]}


@pytest.mark.parametrize("bn", list(BN_NODES))
def test_conv_bn_act_op_and_decomposed(tmp_path, bn):
    a = analyze_model(conv_bn_act(bn), tmp_path)
    m = only(a, "conv_bn_act")
    assert [n.name for n in m.nodes] == ["conv", *BN_NODES[bn], "act"]
    assert m.roles["bn"].name == BN_NODES[bn][-1] and m.roles["act"].name == "act"
    assert found(a, "bn_act") == [[*BN_NODES[bn], "act"]]  # safer, so reported inside it
    assert found(a, "conv_bn") == []  # dominated


@pytest.mark.parametrize("bn", list(BN_NODES))
def test_conv_bn_without_activation(tmp_path, bn):
    a = analyze_model(conv_bn_act(bn, act=None), tmp_path)
    assert found(a, "conv_bn") == [["conv", *BN_NODES[bn]]] and found(a, "conv_bn_act") == []


@pytest.mark.parametrize("shape", [(), (4, 8, 8), (1,)], ids=["scalar", "full", "one"])
def test_mul_by_a_non_per_channel_tensor_is_no_batch_norm(tmp_path, shape):
    net = Net()
    y = net.op("Mul", "scale", net.conv(), net.param("s", *shape))
    a = analyze_model(net.model(net.act("Relu", net.bias(y, name="shift"))), tmp_path)
    assert [found(a, p) for p in ("conv_bn_act", "conv_bn", "bn_act", "conv_bias_act")] == [[]] * 4


def test_a_three_way_sum_is_no_residual_add(tmp_path):
    net = Net(x=("N", 4, 8, 8), z=("N", 4, 8, 8))
    a = analyze_model(net.model(net.act("Relu", net.op("Sum", "add", net.bn("x"), "z", "z"))), tmp_path)
    assert found(a, "bn_add_act") == [] and found(a, "bn_act") == []


@pytest.mark.parametrize("bn", ["op", "add"])
def test_bn_act_and_bn_add_act_on_an_input(tmp_path, bn):
    for residual in (None, "Add", "Sum"):
        net = Net(x=("N", 4, 8, 8), z=("N", 4, 8, 8))
        y = net.bn("x") if bn == "op" else net.bias(net.op("Mul", "scale", "x", net.param("s", 4, 1, 1)),
                                                    name="shift")
        if residual:
            y = net.op(residual, "add", y, "z")
        a = analyze_model(net.model(net.act("Relu", y)), tmp_path)
        want = [*BN_NODES[bn], *(["add"] if residual else []), "act"]
        assert found(a, "bn_add_act" if residual else "bn_act") == [want]
        assert found(a, "bn_act" if residual else "bn_add_act") == []


# -- squeeze, matmul ------------------------------------------------------------------------------------
def test_conv_squeeze_bias_and_squeeze_then_relu(tmp_path):
    a = analyze_model(conv_squeeze(), tmp_path)
    assert found(a, "conv_squeeze_bias") == [["conv", "squeeze", "bias"]]
    assert only(a, "conv_squeeze_bias").roles["squeeze"].name == "squeeze"
    assert analyze_model(conv_squeeze("Relu"), tmp_path).matches == []


def test_matmul_bias_act_and_gemm_act(tmp_path):
    net = Net(x=("N", 8))
    y = net.op("Add", "bias", net.op("MatMul", "matmul", "x", net.param("w", 8, 6)), net.param("b", 6))
    a = analyze_model(net.model(net.act("Tanh", y)), tmp_path)
    assert found(a, "matmul_bias_act") == [["matmul", "bias", "act"]] and found(a, "matmul_bias") == []
    net = Net(x=("N", 8))
    g = net.op("Gemm", "gemm", "x", net.param("w", 6, 8), net.param("b", 6), transB=1)
    a = analyze_model(net.model(net.act("Relu", g)), tmp_path)
    assert found(a, "matmul_bias_act") == [["gemm", "act"]]
    assert only(a, "matmul_bias_act").roles["matmul"].name == "gemm"


def test_matmul_bias(tmp_path):
    net = Net(x=("N", 8))
    y = net.op("Add", "bias", net.op("MatMul", "matmul", "x", net.param("w", 8, 6)), net.param("b", 6))
    a = analyze_model(net.model(y), tmp_path)
    assert found(a, "matmul_bias") == [["matmul", "bias"]] and found(a, "matmul_bias_act") == []


@pytest.mark.parametrize("where, op_type, alpha_first", [
    ("out", "Mul", False), ("out", "Mul", True), ("out", "Div", False), ("a", "Mul", True),
    ("b", "Div", False)])
def test_matmul_scale(tmp_path, where, op_type, alpha_first):
    net = Net(q=("N", 4, 8), k=("N", 8, 6))
    alpha = net.param("alpha", value=0.125)

    def scale(t: str) -> str:
        return net.op(op_type, "scale", *((alpha, t) if alpha_first else (t, alpha)))

    y = net.op("MatMul", "matmul", scale("q") if where == "a" else "q", scale("k") if where == "b" else "k")
    a = analyze_model(net.model(scale(y) if where == "out" else y), tmp_path)
    assert found(a, "matmul_scale") == [["matmul", "scale"] if where == "out" else ["scale", "matmul"]]
    assert only(a, "matmul_scale").roles["scale"].name == "scale"


@pytest.mark.parametrize("form", ["vector", "alpha_over"])
def test_matmul_scale_near_misses(tmp_path, form):
    net = Net(q=("N", 4, 8), k=("N", 8, 6))
    mm = net.op("MatMul", "matmul", "q", "k")
    y = net.op("Mul", "scale", mm, net.param("v", 6)) if form == "vector" else \
        net.op("Div", "scale", net.param("alpha", value=2.0), mm)  # alpha / (q @ k) is no scale
    assert found(analyze_model(net.model(y), tmp_path), "matmul_scale") == []


@pytest.mark.parametrize("perm, weight, hit", [((1, 0), "param", True), ((0, 2, 1), "param", True),
                                               ((1, 0, 2), "param", False), ((0, 2, 1), "input", True),
                                               ((1, 0, 2), "input", False)])
def test_matmul_transpose(tmp_path, perm, weight, hit):
    """x @ w^T with w^T transposed at run time by a swap of the last two axes (other perms are no transB):
    a weight's Transpose is the parameter's view (outside the match); an activation's (DeBERTa's position
    keys, attention's K^T) is inside it, what the fused GEMM no longer writes."""
    shape, x = {(1, 0): ((6, 8), ("N", 8)), (0, 2, 1): ((3, 6, 8), ("N", 3, 5, 8)),
                (1, 0, 2): ((3, 8, 6), ("N", 8, 5, 3))}[perm]
    net = Net(x=x, k=shape)
    w = net.param("w", *shape) if weight == "param" else "k"
    y = net.op("MatMul", "mm", "x", net.op("Transpose", "t", w, perm=list(perm)))
    nodes = ["mm"] if weight == "param" else ["t", "mm"]
    assert found(analyze_model(net.model(y), tmp_path), "matmul_transpose") == ([nodes] if hit else [])


# -- gelu, layer norm -----------------------------------------------------------------------------------
@pytest.mark.parametrize("arg", ["div", "mul"])
@pytest.mark.parametrize("order", [0, 1, 2])
def test_gelu_erf_forms(tmp_path, order, arg):
    a = analyze_model(gelu_erf(order, arg), tmp_path)
    m = only(a, "gelu")
    assert_dataflow(m, GELU_ERF_NODES[order])
    assert m.bound["x"].name == "matmul_out" and found(a, "bias_gelu") == []


def test_gelu_tanh_form(tmp_path):
    m = only(analyze_model(gelu_tanh(), tmp_path), "gelu")
    assert_dataflow(m, ["cube", "cube_mul", "inner", "tanh_arg", "tanh", "one_plus", "half_x", "gelu"])


@pytest.mark.parametrize("model", [lambda: gelu_erf(half=0.6), lambda: gelu_erf(order=1, half=0.6),
                                   lambda: gelu_erf(sqrt2=2.0), lambda: gelu_erf(arg="mul", sqrt2=2.0),
                                   lambda: gelu_tanh(cube=2.0), lambda: gelu_erf(erf_of_other=True)],
                         ids=["half_0.6", "half_0.6_order1", "div_by_2", "mul_by_0.5", "square_not_cube",
                              "erf_of_another_tensor"])
def test_gelu_near_misses(tmp_path, model):
    a = analyze_model(model(), tmp_path)
    assert found(a, "gelu") == [] and found(a, "bias_gelu") == []


def test_bias_gelu_takes_the_bias_add_and_hides_gelu(tmp_path):
    a = analyze_model(gelu_erf(bias=True), tmp_path)
    assert_dataflow(only(a, "bias_gelu"), ["bias", *GELU_ERF_NODES[0]])
    assert found(a, "gelu") == []
    a = analyze_model(gelu_erf(bias=True), tmp_path, patterns=("gelu",))
    assert_dataflow(only(a, "gelu"), GELU_ERF_NODES[0])


@pytest.mark.parametrize("square", ["pow", "mul"])
def test_layer_norm_decomposed(tmp_path, square):
    a = analyze_model(layer_norm(square), tmp_path)
    m = only(a, "layer_norm")  # the Div-rooted partial match is dominated
    assert_dataflow(m, LAYER_NORM_NODES)
    assert m.roles["normalize"].name == "normalize" and m.bound["x"].name == "x"
    assert found(a, "skip_layer_norm") == []


@pytest.mark.parametrize("model", [lambda: layer_norm(exponent=3.0), lambda: layer_norm(mean_of="z")],
                         ids=["cube", "mean_of_another_tensor"])
def test_layer_norm_near_misses(tmp_path, model):
    a = analyze_model(model(), tmp_path)
    assert found(a, "layer_norm") == [] and found(a, "skip_layer_norm") == []


@pytest.mark.parametrize("skip", ["op", "add"])
def test_skip_layer_norm(tmp_path, skip):
    a = analyze_model(layer_norm(skip=skip), tmp_path)
    assert_dataflow(only(a, "skip_layer_norm"), ["skip", *(["ln"] if skip == "op" else LAYER_NORM_NODES)])
    assert found(a, "layer_norm") == []


def test_layer_norm_op_after_a_bias_is_no_skip_layer_norm(tmp_path):
    net = Net(x=("N", 4, 16))
    y = net.op("LayerNormalization", "ln", net.bias("x", shape=(16,)), net.param("g", 16), net.param("b", 16))
    assert analyze_model(net.model(y), tmp_path).matches == []


# -- backward patterns on the joint graph ---------------------------------------------------------------
@pytest.mark.parametrize("bias", ["own", "add"])
def test_relu_grad_bias_grad(tmp_path, bias):
    a = analyze_model(conv_act("Relu", bias), tmp_path)
    m = only(a, "relu_grad_bias_grad")
    owner = "conv" if bias == "own" else "bias"
    assert [n.name for n in m.nodes] == ["gradients/act/ReluGrad", f"gradients/{owner}/BiasAddGrad"]
    assert all(n.phase == "backward" for n in m.nodes)
    assert (m.verdict.inference_safe, m.verdict.training_safe) == (False, True)
    assert found(analyze_model(conv_act("Sigmoid", bias), tmp_path), "relu_grad_bias_grad") == []


def test_bn_grad_relu_grad(tmp_path):
    a = analyze_model(conv_bn_act("op"), tmp_path)
    m = only(a, "bn_grad_relu_grad")
    assert [n.name for n in m.nodes] == ["gradients/act/ReluGrad", "gradients/bn/BatchNormGrad"]
    assert m.verdict.training_safe and "ReluGrad + BatchNormGrad run as one kernel" in m.verdict.reason
    assert found(analyze_model(conv_bn_act("add"), tmp_path), "bn_grad_relu_grad") == []


# -- Keras: Conv2D(use_bias=True) -> BiasAdd -> BatchNorm (-> act) ---------------------------------------
@pytest.mark.parametrize("act", [None, "Relu"])
def test_conv_bias_bn_with_and_without_act(tmp_path, act):
    net = Net()
    y = net.bn(net.bias(net.conv()))
    a = analyze_model(net.model(net.act("Relu", y) if act else y), tmp_path)
    name = "conv_bias_bn_act" if act else "conv_bias_bn"
    m = only(a, name)
    assert [n.name for n in m.nodes] == ["conv", "bias", "bn"] + (["act"] if act else [])
    v = m.verdict
    assert v.state == "inference only" and [b.tensor.name for b in v.blocking] == ["bias_out"]
    assert found(a, "conv_bn_act" if act else "conv_bn") == []  # the BiasAdd between hides the seed form


# -- tf2onnx: BatchNorm's scale left as a per-channel Mul after the conv -------------------------------
@pytest.mark.parametrize("act", [None, "Clip"])
def test_conv_mul(tmp_path, act):
    net = Net()
    y = net.op("Mul", "scale", net.conv(own_bias=True), net.param("s", 1, 4, 1, 1))
    a = analyze_model(net.model(net.act(act, y) if act else y), tmp_path)
    m = only(a, "conv_mul")
    assert [n.name for n in m.nodes] == ["conv", "scale"] + (["act"] if act else [])
    assert m.verdict.state == "inference only" and [b.tensor.name for b in m.verdict.blocking] == ["conv_out"]


@pytest.mark.parametrize("build", [lambda: conv_bn_act("op"), lambda: conv_bn_act("decomposed"), gelu_erf,
                                   layer_norm, lambda: conv_act("Relu"), gelu_tanh])
def test_the_root_test_never_refuses_a_match(tmp_path, build):
    """root_may_match (the matcher's checks a few ops deep) is a necessary condition of match_at."""
    a = analyze_model(build(), tmp_path)
    tried = 0
    for node in a.graph.nodes:
        inputs = [t for t in node.inputs if t is not None]
        for p in CATALOGUE:
            for form in (f for f in p.forms if node_key(node) in f.kinds):
                if match_at(form, node) is not None:
                    tried += 1
                    assert root_may_match(form.root_test, inputs), (p.name, node.name)
    assert tried
