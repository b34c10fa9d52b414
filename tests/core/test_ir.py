from __future__ import annotations

import pytest

from fusecli.core.ir import Graph, GraphError, Node, Tensor, topological_order


def _chain() -> Graph:
    g = Graph("chain")
    x = g.tensor("x", shape=("N", 3, 4, 4), kind="input")
    w = g.tensor("w", shape=(8, 3, 3, 3), kind="parameter")
    y = g.tensor("y", shape=("N", 8, 4, 4))
    z = g.tensor("z", shape=("N", 8, 4, 4))
    g.inputs = [x]
    g.add_node(Node("conv", "Conv", "conv", [x, w], [y]))
    g.add_node(Node("relu", "Relu", "relu", [y], [z]))
    g.outputs = [z]
    return g


def test_links_both_ways_and_lint_passes():
    g = _chain()
    g.lint()
    y = g.tensors["y"]
    assert y.producer is g.node("conv")
    assert y.consumers == [g.node("relu")]
    assert g.tensors["x"].producer is None


def test_bytes_at_batch_and_symbolic_dims():
    t = Tensor("t", "float32", ("N", 8, "seq"))
    assert t.nbytes({"N": 4, "seq": 10}) == 4 * 8 * 10 * 4
    assert t.nbytes({"N": 2}) is None  # a dim without a value is unknown, never 1
    assert Tensor("h", "float16", (None, 5)).nbytes({"N": 3}) is None
    assert Tensor("r", "float32", None).nbytes() is None  # unknown rank
    assert Tensor("e", "float32", ("2*seq", "seq + 1")).nbytes({"seq": 3}) == 6 * 4 * 4
    assert Tensor("s", "int64", ()).nbytes() == 8
    assert not Tensor("u", shape=(None, 3)).shape_known
    assert Tensor("k", shape=("N", 3)).shape_known and not Tensor("k", shape=("N", 3)).is_static


def test_lint_catches_a_missing_consumer_link():
    g = _chain()
    g.tensors["y"].consumers.clear()
    with pytest.raises(GraphError, match="does not list its consumer"):
        g.lint()


def test_lint_catches_non_topological_order():
    g = _chain()
    g.nodes.reverse()
    with pytest.raises(GraphError, match="before it is made"):
        g.lint()


def test_lint_catches_activation_without_producer():
    g = _chain()
    g.tensor("orphan")
    with pytest.raises(GraphError, match="no producer"):
        g.lint()


def test_tensor_made_twice_is_refused():
    g = _chain()
    with pytest.raises(GraphError, match="produced by both"):
        g.add_node(Node("again", "Relu", "relu", [g.tensors["x"]], [g.tensors["y"]]))


def test_topological_order_sorts_and_detects_cycles():
    g = _chain()
    assert [n.name for n in topological_order(list(reversed(g.nodes)))] == ["conv", "relu"]
    a, b = Tensor("a"), Tensor("b")
    n1 = Node("n1", "Relu", "relu", [b], [a])
    n2 = Node("n2", "Relu", "relu", [a], [b])
    a.producer, b.producer = n1, n2
    with pytest.raises(GraphError, match="cycle"):
        topological_order([n1, n2])
