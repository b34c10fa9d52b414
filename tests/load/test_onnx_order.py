"""An ONNX graph's nodes put in topological order (stable), and cycles and undefined inputs refused; the
canonical order, decided by the graph whatever order the file lists its nodes in."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from fusecli.core.errors import FuseError
from fusecli.load.onnx_order import canonical, canonicalize, sort_graph, subgraph_reads, topological
from tests import transformer_graphs
from tests.conftest import make_model, vi
from tests.shuffle import shuffled


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


# ---- the canonical order ---------------------------------------------------------------------------

def _canonical_names(model: onnx.ModelProto) -> list[str]:
    nodes = list(model.graph.node)
    return [nodes[k].name for k in canonical(nodes, [o.name for o in model.graph.output])]


@pytest.mark.parametrize("spelling", ["sdpa", "eager"])
def test_the_canonical_order_is_the_same_for_every_listing(spelling):
    model = transformer_graphs.llama_block(spelling)
    want = _canonical_names(model)
    assert sorted(want) == sorted(_names(model))
    for seed in range(20):
        assert _canonical_names(shuffled(model, seed)) == want
    copy = shuffled(model, 0)
    canonicalize(copy.graph)  # in place, and an order ONNX accepts
    assert _names(copy) == want
    onnx.checker.check_model(copy, full_check=True)


def test_the_canonical_order_computes_each_input_in_the_order_it_is_read():
    """Depth first from the output: Add(a2, b2) computes a2's branch, then b2's, as a program would; a
    listing with b's branch first reads the same."""
    nodes = [helper.make_node("Neg", ["x"], ["b"], "b"), helper.make_node("Relu", ["b"], ["b2"], "b2"),
             helper.make_node("Relu", ["x"], ["a"], "a"), helper.make_node("Relu", ["a"], ["a2"], "a2"),
             helper.make_node("Add", ["a2", "b2"], ["y"], "y")]
    model = make_model(nodes, [vi("x", 2)], [vi("y", 2)])
    assert canonicalize(model.graph)
    assert _names(model) == ["a", "a2", "b", "b2", "y"]
    assert not canonicalize(model.graph)  # the canonical order of a canonical listing is itself


def test_the_canonical_order_computes_the_deeper_branch_first():
    """A parallel residual, ``mlp(x) + attention(x)`` (GPT-NeoX, Falcon): the program computes attention,
    the longer branch, first; depth first in the order Add reads them would compute the MLP first and
    move the peak (GPT-NeoX's TorchScript export: +8%)."""
    node = helper.make_node
    nodes = [node("Relu", ["x"], ["q"], "attn1"), node("Exp", ["q"], ["s"], "attn2"),
             node("Neg", ["s"], ["attn"], "attn3"), node("Tanh", ["x"], ["mlp"], "mlp"),
             node("Add", ["mlp", "attn"], ["y"], "add")]
    model = make_model(nodes, [vi("x", 2)], [vi("y", 2)])
    assert not canonicalize(model.graph)
    assert _names(shuffled(model, 3)) != _names(model)
    assert _canonical_names(shuffled(model, 3)) == ["attn1", "attn2", "attn3", "mlp", "add"]


def test_nodes_no_output_needs_come_last_by_their_first_outputs_name():
    nodes = [helper.make_node("Relu", ["x"], ["zz"], "dead_z"), helper.make_node("Neg", ["x"], ["y"], "live"),
             helper.make_node("Exp", ["zz"], ["aa"], "dead_a"),
             helper.make_node("Relu", ["x"], ["mm"], "dead_m"),
             helper.make_node("Neg", ["x"], [], "no_output")]
    model = make_model(nodes, [vi("x", 2)], [vi("y", 2)])
    canonicalize(model.graph)
    # 'aa' first, its maker after the one making what it reads ('zz'); then 'mm'; a node without outputs
    # (the empty name) sorts first among them
    assert _names(model) == ["live", "no_output", "dead_z", "dead_a", "dead_m"]


def test_the_canonical_order_of_a_deep_chain_needs_no_recursion():
    n = 5000
    nodes = [helper.make_node("Relu", [f"t{k}"], [f"t{k + 1}"], f"n{k}") for k in range(n)]
    assert canonical(nodes[::-1], [f"t{n}"]) == list(range(n - 1, -1, -1))


def test_a_name_made_twice_is_refused_alike_in_every_listing(save_model):
    """Two nodes making 'a' (a graph refused): which one the error names is decided by the nodes, not by
    the listing."""
    from fusecli.pipeline import Options, analyze

    nodes = [helper.make_node("Relu", ["x"], ["a"], "first"), helper.make_node("Neg", ["x"], ["a"], "second"),
             helper.make_node("Exp", ["a"], ["y"], "exp")]
    messages = set()
    for seed in range(6):
        path = save_model(shuffled(make_model(nodes, [vi("x", 2)], [vi("y", 2)]), seed), f"m{seed}.onnx")
        with pytest.raises(FuseError) as e:
            analyze(path, Options())
        messages.add(str(e.value))
    assert messages == {"tensor 'a' is defined more than once (again by node 'first')"}
