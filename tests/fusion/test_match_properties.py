"""Properties of the matcher (``fusion/match.py`` through ``pipeline.analyze``): a graph and the same graph
with its nodes and tensors renamed, its nodes reordered (another topological order), the operands of its
Adds and Muls commuted, or float32->float32 Casts and Identities inserted on its edges give the same
matches (pattern names and counts) and the same saved bytes. Seeded loops over a few built graphs."""

from __future__ import annotations

import math
import random
from collections import Counter

import onnx
import pytest
from onnx import TensorProto, helper

from fusecli.pipeline import Options, analyze
from tests.fusion import models as M
from tests.fusion.models import Net

SEEDS = range(3)


def _attention() -> onnx.ModelProto:
    """softmax((q k^T) * s + mask) v over (N, 2, 4, 8) heads."""
    net = Net(q=("N", 2, 4, 8), k=("N", 2, 4, 8), v=("N", 2, 4, 8), mask=("N", 1, 1, 4))
    kt = net.op("Transpose", "k_t", "k", perm=[0, 1, 3, 2])
    scores = net.op("Mul", "scale", net.op("MatMul", "qk", "q", kt), net.param("s", value=1 / math.sqrt(8)))
    probs = net.op("Softmax", "softmax", net.op("Add", "add_mask", scores, "mask"), axis=-1)
    return net.model(net.op("MatMul", "pv", probs, "v"))


def _mlp_block() -> onnx.ModelProto:
    """x @ w + b -> GELU (erf) -> @ w2 + b2 -> + x -> LayerNormalization: a transformer's MLP half."""
    net = Net(x=("N", 4, 16))
    h = net.op("Add", "b1", net.op("MatMul", "fc1", "x", net.param("w1", 16, 32)), net.param("b1_v", 32))
    erf = net.op("Erf", "erf", net.op("Div", "erf_arg", h, net.param("sqrt2", value=math.sqrt(2))))
    gelu = net.op("Mul", "gelu", net.op("Mul", "half_x", h, net.param("half", value=0.5)),
                  net.op("Add", "one_plus", erf, net.param("one", value=1.0)))
    out = net.op("Add", "b2", net.op("MatMul", "fc2", gelu, net.param("w2", 32, 16)), net.param("b2_v", 16))
    skip = net.op("Add", "residual", out, "x")
    return net.model(net.op("LayerNormalization", "ln", skip, net.param("g", 16), net.param("beta", 16),
                            axis=-1))


GRAPHS = {"conv_bias_relu": lambda: M.conv_act("Relu", "add"), "conv_bn_relu": M.conv_bn_act,
          "bias_gelu_erf": lambda: M.gelu_erf(order=1, bias=True), "gelu_tanh": M.gelu_tanh,
          "skip_layer_norm": lambda: M.layer_norm(skip="add"), "attention": _attention,
          "mlp_block": _mlp_block}


# -- mutations: each returns a new, valid model --------------------------------------------------------
def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.value_info[:]  # shapes are the loader's business; renamed tensors would not match
    return out


def _with_nodes(m: onnx.ModelProto, nodes: list) -> onnx.ModelProto:
    """``m`` with its node list replaced by copies of ``nodes`` (protobuf lists hold their own copies)."""
    copies = [onnx.NodeProto() for _ in nodes]
    for c, n in zip(copies, nodes, strict=True):
        c.CopyFrom(n)
    del m.graph.node[:]
    m.graph.node.extend(copies)
    return m


def rename(model: onnx.ModelProto, rng: random.Random) -> onnx.ModelProto:
    """Every node and every tensor but the graph's inputs and outputs gets a new (shuffled) name."""
    m = _copy(model)
    g = m.graph
    keep = {v.name for v in (*g.input, *g.output)}
    names = sorted({t.name for t in g.initializer} | {o for n in g.node for o in n.output} - keep)
    fresh = [f"t{i}" for i in range(len(names))]
    rng.shuffle(fresh)
    new = dict(zip(names, fresh, strict=True))
    for t in g.initializer:
        t.name = new[t.name]
    for i, n in enumerate(g.node):
        n.name = f"node{rng.randrange(10**6)}_{i}"
        n.input[:] = [new.get(x, x) for x in n.input]
        n.output[:] = [new.get(x, x) for x in n.output]
    return m


def reorder(model: onnx.ModelProto, rng: random.Random) -> onnx.ModelProto:
    """Another topological order: Kahn's algorithm taking a random ready node each time."""
    m = _copy(model)
    nodes = list(m.graph.node)
    maker = {o: k for k, n in enumerate(nodes) for o in n.output}
    preds = [{maker[i] for i in n.input if i in maker} for n in nodes]
    order, placed = [], set()
    while len(order) < len(nodes):
        ready = [k for k in range(len(nodes)) if k not in placed and preds[k] <= placed]
        k = rng.choice(ready)
        order.append(k)
        placed.add(k)
    copies = [onnx.NodeProto() for _ in order]
    for c, k in zip(copies, order, strict=True):
        c.CopyFrom(nodes[k])
    del m.graph.node[:]
    m.graph.node.extend(copies)
    return m


def commute(model: onnx.ModelProto, rng: random.Random) -> onnx.ModelProto:
    """The two operands of some (at least one) Adds and Muls swapped."""
    m = _copy(model)
    binary = [n for n in m.graph.node if n.op_type in ("Add", "Mul")]
    chosen = [n for n in binary if rng.random() < 0.5] or binary[:1]
    for n in chosen:
        n.input[:] = [n.input[1], n.input[0]]
    return m


def insert_casts(model: onnx.ModelProto, rng: random.Random) -> onnx.ModelProto:
    """float32 -> float32 Casts and Identities on some (at least one) float32 edges between nodes or from
    a graph input."""
    m = _copy(model)
    inferred = onnx.shape_inference.infer_shapes(model)
    floats = {v.name for v in (*inferred.graph.value_info, *inferred.graph.input)
              if v.type.tensor_type.elem_type == TensorProto.FLOAT}
    floats -= {t.name for t in m.graph.initializer}
    edges = [(n, i) for n in m.graph.node for i, x in enumerate(n.input) if x in floats]
    chosen = [e for e in edges if rng.random() < 0.3] or edges[:1]
    nodes = []
    for n in list(m.graph.node):
        for k, (c, i) in enumerate(chosen):
            if c is n:
                name = f"{n.input[i]}_via{k}"
                nodes.append(helper.make_node("Cast", [n.input[i]], [name], f"cast{k}", to=TensorProto.FLOAT)
                             if rng.random() < 0.5 else helper.make_node("Identity", [n.input[i]], [name],
                                                                          f"identity{k}"))
                n.input[i] = name
        nodes.append(n)
    return _with_nodes(m, nodes)


MUTATIONS = {"rename": rename, "reorder": reorder, "commute": commute, "insert_casts": insert_casts}


def _summary(model: onnx.ModelProto, path: str) -> tuple[Counter, int]:
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    a = analyze(path, Options(batch=2))
    return Counter(m.pattern.name for m in a.matches), a.liveness.saved_bytes


@pytest.fixture(scope="module")
def baselines(tmp_path_factory) -> dict[str, tuple[onnx.ModelProto, Counter, int]]:
    folder = tmp_path_factory.mktemp("baselines")
    out = {}
    for name, build in GRAPHS.items():
        model = _copy(build())
        out[name] = (model, *_summary(model, str(folder / f"{name}.onnx")))
    return out


def test_the_graphs_match_what_they_are_built_to(baselines):
    want = {"conv_bias_relu": "conv_bias_act", "conv_bn_relu": "conv_bn_act", "bias_gelu_erf": "bias_gelu",
            "gelu_tanh": "gelu", "skip_layer_norm": "skip_layer_norm", "attention": "attention",
            "mlp_block": "skip_layer_norm"}
    for name, pattern in want.items():
        assert baselines[name][1][pattern] >= 1, (name, baselines[name][1])


CASES = [pytest.param(g, mu) for g in GRAPHS for mu in MUTATIONS]


@pytest.mark.parametrize("graph, mutation", CASES)
def test_matches_and_saved_bytes_do_not_depend_on_spelling(baselines, graph, mutation, tmp_path):
    model, matches, saved = baselines[graph]
    for seed in SEEDS:
        mutated = MUTATIONS[mutation](model, random.Random(seed))
        got, got_saved = _summary(mutated, str(tmp_path / f"{seed}.onnx"))
        assert got_saved == saved, f"{graph}, {mutation} (seed {seed}): saved {got_saved} != {saved}"
        assert got == matches, f"{graph}, {mutation} (seed {seed}): {dict(got)} != {dict(matches)}"


def _cast_between(model: onnx.ModelProto, src: str, dst: str, op: str = "Cast") -> onnx.ModelProto:
    """A no-op ``op`` on the one edge from tensor ``src`` to node ``dst``."""
    m = _copy(model)
    nodes = []
    for n in m.graph.node:
        if n.name == dst:
            kw = {"to": TensorProto.FLOAT} if op == "Cast" else {}
            nodes.append(helper.make_node(op, [src], [f"{src}_noop"], f"noop_{dst}", **kw))
            n.input[:] = [f"{src}_noop" if i == src else i for i in n.input]
        nodes.append(n)
    return _with_nodes(m, nodes)


# one no-op on one edge: a Cast before the Relu (its backward Cast sits between ReluGrad and BiasAddGrad /
# BatchNormGrad), an Identity or Cast on one of two reads of a bound value (GELU's x, LayerNorm's centred x)
@pytest.mark.parametrize("graph, src, dst, op", [
    ("conv_bias_relu", "bias_out", "act", "Cast"), ("conv_bn_relu", "bn_out", "act", "Cast"),
    ("bias_gelu_erf", "bias_out", "x_one_plus", "Identity"),
    ("bias_gelu_erf", "bias_out", "erf_arg", "Identity"), ("skip_layer_norm", "sub_out", "sq", "Cast"),
    ("conv_bias_relu", "x", "conv", "Identity"), ("attention", "softmax_out", "pv", "Cast"),
])
def test_one_noop_edge(baselines, graph, src, dst, op, tmp_path):
    model, matches, saved = baselines[graph]
    got, got_saved = _summary(_cast_between(model, src, dst, op), str(tmp_path / "m.onnx"))
    assert got_saved == saved
    assert got == matches
