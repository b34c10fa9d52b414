"""An ONNX graph's nodes put in topological order (stable), and cycles and undefined inputs refused."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from fusecli.core.errors import FuseError
from fusecli.load.onnx_order import sort_graph, subgraph_reads, topological
from tests.conftest import make_model, vi


def _chain(order: list[int]) -> onnx.ModelProto:
    """x -> n0 -> n1 -> n2 -> n3 -> y (Relu each), listed in ``order``."""
    nodes = [helper.make_node("Relu", ["x" if k == 0 else f"t{k}"], [f"t{k + 1}" if k < 3 else "y"], f"n{k}")
             for k in range(4)]
    return make_model([nodes[k] for k in order], [vi("x", 2)], [vi("y", 2)])


def _names(model: onnx.ModelProto) -> list[str]:
    return [n.name for n in model.graph.node]


def test_out_of_order_nodes_are_sorted_and_the_result_checks():
    model = _chain([3, 1, 0, 2])
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model, full_check=True)
    assert sort_graph(model.graph)
    assert _names(model) == ["n0", "n1", "n2", "n3"]
    onnx.checker.check_model(model, full_check=True)


def test_an_order_already_valid_is_kept():
    """Two independent branches listed interleaved stay as listed (a stable sort, not a re-ordering)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], "a"), helper.make_node("Neg", ["x"], ["b"], "b"),
             helper.make_node("Relu", ["b"], ["b2"], "b2"), helper.make_node("Relu", ["a"], ["a2"], "a2"),
             helper.make_node("Add", ["a2", "b2"], ["y"], "y")]
    model = make_model(nodes, [vi("x", 2)], [vi("y", 2)])
    assert not sort_graph(model.graph)
    assert _names(model) == ["a", "b", "b2", "a2", "y"]


def test_only_the_misplaced_nodes_move():
    nodes = [helper.make_node("Relu", ["x"], ["a"], "a"), helper.make_node("Add", ["a", "c"], ["y"], "y"),
             helper.make_node("Neg", ["x"], ["b"], "b"), helper.make_node("Relu", ["b"], ["c"], "c")]
    model = make_model(nodes, [vi("x", 2)], [vi("y", 2)])
    sort_graph(model.graph)
    assert _names(model) == ["a", "b", "c", "y"]


def test_a_cycle_is_refused_in_one_line():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], "n1"), helper.make_node("Relu", ["a"], ["b"], "n2"),
             helper.make_node("Relu", ["a"], ["y"], "n3")]
    model = make_model(nodes, [vi("x", 2)], [vi("y", 2)])
    with pytest.raises(FuseError, match=r"^the graph has a cycle \(through node 'n1'\); refused$"):
        sort_graph(model.graph)
    assert _names(model) == ["n1", "n2", "n3"]  # left as it was


def test_an_input_nothing_makes_is_refused_in_one_line():
    nodes = [helper.make_node("Relu", ["x"], ["a"], "r"),
             helper.make_node("Add", ["a", "ghost"], ["y"], "add")]
    model = make_model(nodes, [vi("x", 2)], [vi("y", 2)])
    with pytest.raises(FuseError, match=r"node 'add' reads 'ghost', which no node, initializer or graph "
                                        r"input makes; refused"):
        sort_graph(model.graph)


def test_a_subgraphs_outer_read_orders_its_maker_first():
    """An If branch reads 'w' from the outer graph: the node making 'w' goes before the If; a name the
    branch makes itself is no outer read."""
    body = [helper.make_node("Relu", ["w"], ["inner"]), helper.make_node("Neg", ["inner"], ["o"])]
    then = helper.make_graph(body, "then", [], [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Identity", ["w"], ["o2"])], "else", [],
                              [helper.make_tensor_value_info("o2", TensorProto.FLOAT, [2])])
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    node_if = helper.make_node("If", ["c"], ["y"], "if", then_branch=then, else_branch=other)
    model = make_model([node_if, helper.make_node("Relu", ["x"], ["w"], "make_w")], [vi("x", 2), cond],
                       [vi("y", 2)])
    assert subgraph_reads(node_if) == {"w"}
    sort_graph(model.graph)
    assert _names(model) == ["make_w", "if"]
    onnx.checker.check_model(model, full_check=True)


def test_topological_of_a_long_reversed_chain():
    n = 5000
    nodes = [helper.make_node("Relu", [f"t{k}"], [f"t{k + 1}"], f"n{k}") for k in range(n)]
    ordered = topological(nodes[::-1])
    assert [x.name for x in ordered] == [f"n{k}" for k in range(n)]
