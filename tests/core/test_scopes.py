"""fusecli.core.scopes: where a node sits whoever exported it, and two models' scopes paired."""

from __future__ import annotations

from fusecli.core.scopes import fold, node_scope, pair_scopes


def test_scopes_pair_by_unique_suffix():
    pairs = pair_scopes({"model/dense", "model/dense_*", "model"},
                        {"StatefulPartitionedCall/model/dense", "StatefulPartitionedCall/model/dense_*",
                         "StatefulPartitionedCall/model", "StatefulPartitionedCall"})
    assert pairs == {"StatefulPartitionedCall/model/dense": "model/dense",
                     "StatefulPartitionedCall/model/dense_*": "model/dense_*",
                     "StatefulPartitionedCall/model": "model"}


def test_loader_keeps_dynamos_module_path(save_model):
    from onnx import helper

    from fusecli.load import load_model
    from tests.conftest import make_model, vi

    scopes = {"a": "['', 'inner', 'inner.encoder.layer.0', 'relu']", "b": "['', 'relu_1']",
              "c": "not a list", "d": "['', '_empty_nn_module_stack_from_metadata_hook', 'x']"}
    nodes = []
    for i, (name, value) in enumerate(scopes.items()):
        node = helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], f"node_{name}")
        helper.set_metadata_props(node, {"pkg.torch.onnx.name_scopes": value})
        nodes.append(node)
    g = load_model(save_model(make_model(nodes, [vi("t0", 2)], [vi("t4", 2)])))
    modules = {n.name: n.meta.get("module") for n in g.nodes}
    assert modules == {"node_a": "inner.encoder.layer.0", "node_b": None, "node_c": None, "node_d": None}
    assert [node_scope(n) for n in g.nodes] == [("inner", "encoder", "layer.0"), (), (), ()]


def test_fold_keeps_list_indices_with_their_list():
    from fusecli.core.ir import Node

    node = Node("/inner/encoder/layer.11/attention/self/MatMul_1", "MatMul", "matmul")
    assert node_scope(node) == ("inner", "encoder", "layer.11", "attention", "self")
    assert fold(node_scope(node)) == "inner/encoder/layer.*/attention/self"
    node.meta["module"] = "inner.encoder.layer.11.attention.self"
    assert fold(node_scope(node)) == "inner/encoder/layer.*/attention/self"
