"""Graph surgery on a model whose nodes the file lists out of topological order (ONNX Runtime loads such
a file): the rewrite sorts it first, prunes by reachability, and writes nodes in an order ONNX accepts;
a cycle or an input nothing makes is refused in one line; a broken result is never written."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import fusecli.rewrite.run as run_mod
from fusecli.cli import main
from fusecli.core.errors import FuseError
from fusecli.rewrite.graph.edit import prune, sort_input
from tests.conftest import make_model, vi
from tests.rewrite.helpers import assert_same_outputs, ops
from tests.rewrite.test_array_budget import spelled_layer_norm


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _one_error_line(r) -> str:
    assert r.exit_code == 1, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def gpt2_embedding(reverse: bool = True) -> onnx.ModelProto:
    """GPT-2's embedding as its exporters write it (token and position Gathers, the position ids made
    from the ids' shape), 11 nodes, listed consumers first when ``reverse``."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((50, 8)).astype(np.float32), "wte"),
             numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "wpe"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([0], np.int64), "axis0"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [helper.make_node("Gather", ["wte", "input_ids"], ["tok"], "wte_gather"),
             helper.make_node("Shape", ["input_ids"], ["ids_shape"], "shape"),
             helper.make_node("Gather", ["ids_shape", "one"], ["seq"], "seq_len", axis=0),
             helper.make_node("Range", ["zero", "seq", "one"], ["pos"], "range"),
             helper.make_node("Unsqueeze", ["pos", "axis0"], ["pos_ids"], "unsqueeze"),
             helper.make_node("Gather", ["wpe", "pos_ids"], ["pos_emb"], "wpe_gather"),
             helper.make_node("Add", ["tok", "pos_emb"], ["emb"], "add"),
             helper.make_node("Identity", ["emb"], ["drop"], "dropout"),
             helper.make_node("Mul", ["drop", "half"], ["scaled"], "mul"),
             helper.make_node("Add", ["scaled", "drop"], ["mixed"], "mix"),
             helper.make_node("Relu", ["mixed"], ["hidden"], "relu")]
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    hidden = helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "seq", 8])
    graph = helper.make_graph(nodes[::-1] if reverse else nodes, "gpt2_embedding", [ids], [hidden], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


@pytest.mark.parametrize("verify", [[], ["--no-verify"]])
def test_out_of_order_embedding_is_written_whole_and_loads(tmp_path, verify):
    """The 11-node graph became 1 node (--no-verify, exit 0) or ended in 'onnxruntime cannot load the
    rewritten model' (exit 1) when prune kept a node only if a later one read it."""
    src = _save(gpt2_embedding(), tmp_path / "emb.onnx")
    out = tmp_path / "out.onnx"
    r = run("rewrite", src, "-o", out, "--batch", "2", "--dim", "seq=5", *verify)
    assert r.exit_code == 0, r.output
    written = onnx.load(out)
    assert len(written.graph.node) == 11
    onnx.checker.check_model(written, full_check=True)  # in topological order
    assert_same_outputs(src, written, batch=2, dims={"seq": 5})


def test_out_of_order_fusable_graph_is_rewritten_and_verified(tmp_path, sample):
    model = onnx.load(sample("conv_bn_relu"))
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    src = _save(model, tmp_path / "reversed.onnx")
    out = tmp_path / "out.onnx"
    r = run("rewrite", src, "-o", out, "--batch", "2")
    assert r.exit_code == 0, r.output
    assert ops(onnx.load(out)) == {"com.microsoft.FusedConv": 1} and "verified" in r.stdout
    assert_same_outputs(sample("conv_bn_relu"), onnx.load(out))


def test_prune_keeps_what_the_outputs_need_whatever_the_order():
    model = gpt2_embedding()
    dead = helper.make_node("Neg", ["tok"], ["unused"], "dead")  # nothing reads it
    model.graph.node.insert(0, dead)
    model.graph.initializer.append(numpy_helper.from_array(np.ones(3, np.float32), "stale"))
    assert prune(model) == 1
    assert len(model.graph.node) == 11 and "dead" not in [n.name for n in model.graph.node]
    assert "stale" not in [t.name for t in model.graph.initializer]
    assert {"wte", "wpe"} <= {t.name for t in model.graph.initializer}


def _cyclic() -> onnx.ModelProto:
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], "n1"), helper.make_node("Relu", ["a"], ["b"], "n2"),
             helper.make_node("Relu", ["a"], ["y"], "n3")]
    return make_model(nodes, [vi("x", 2)], [vi("y", 2)])


def test_sort_input_refuses_a_cycle_and_an_undefined_input():
    cyclic = _cyclic()
    with pytest.raises(FuseError, match=r"the graph has a cycle \(through node 'n1'\)"):
        sort_input(cyclic)
    dangling = make_model([helper.make_node("Add", ["x", "ghost"], ["y"], "add")], [vi("x", 2)], [vi("y", 2)])
    with pytest.raises(FuseError, match=r"node 'add' reads 'ghost'"):
        sort_input(dangling)


def test_a_cycle_is_one_error_line_and_nothing_written(tmp_path):
    out = tmp_path / "out.onnx"
    line = _one_error_line(run("rewrite", _save(_cyclic(), tmp_path / "c.onnx"), "-o", out, "--no-verify"))
    assert "cycle" in line and not out.exists()


@pytest.mark.parametrize("external", [False, True], ids=["inline", "data file"])
@pytest.mark.parametrize("existed", [False, True], ids=["new", "over old"])
def test_a_broken_result_is_never_written(tmp_path, monkeypatch, existed, external):
    """--no-verify once wrote whatever the rewrite left: now onnx's checker and an onnxruntime session
    read the written part before it replaces the output (a prune that drops the output's maker stands in
    for any bug). Past 2 GB (a data file beside it), an old OUT.onnx.data is left as it was too."""
    import fusecli.rewrite.graph.save as save

    real = run_mod.prune

    def broken(model):
        dropped = real(model)
        kept = [n for n in model.graph.node if n.name != "relu"]
        del model.graph.node[:]
        model.graph.node.extend(kept)
        return dropped + 1

    monkeypatch.setattr(run_mod, "prune", broken)
    if external:
        monkeypatch.setattr(save, "PROTOBUF_LIMIT", 1000)
        monkeypatch.setattr(save, "EXTERNAL_THRESHOLD", 16)
    src = _save(gpt2_embedding(reverse=False), tmp_path / "emb.onnx")
    out = tmp_path / "out.onnx"
    old = {"out.onnx": b"before", "out.onnx.data": b"old data"} if existed else {}
    for name, data in old.items():
        (tmp_path / name).write_bytes(data)
    line = _one_error_line(run("rewrite", src, "-o", out, "--no-verify", "--batch", "2"))
    assert line.startswith(f"error: {out}: the model fails onnx's checker (") and \
        line.endswith("; nothing written"), line
    assert sorted(os.listdir(tmp_path)) == sorted(["emb.onnx", *old])
    assert all((tmp_path / name).read_bytes() == data for name, data in old.items())


def undeclared_contrib_domain() -> onnx.ModelProto:
    """A LayerNorm written out (test_array_budget's), then a com.microsoft FastGelu, the domain used but not
    imported (as ONNX Runtime's own GPT-2 test graphs do: onnxruntime loads them, onnx's checker does not);
    the LayerNorm becomes ONNX's LayerNormalization, so the rewrite itself writes no com.microsoft op."""
    model = spelled_layer_norm(16, [16])
    gelu = helper.make_node("FastGelu", ["y"], ["hidden"], "fast_gelu", domain="com.microsoft")
    model.graph.node.append(gelu)
    model.graph.output[0].name = "hidden"
    return model


def test_a_contrib_domain_used_without_its_import_is_imported_and_said(tmp_path):
    """The model onnxruntime loads is rewritten: the com.microsoft import it lacks is added (one warning
    line), so the written file passes onnx's full checker, which it failed as the input does."""
    import onnxruntime as ort

    model = undeclared_contrib_domain()
    src = _save(model, tmp_path / "ln_fast_gelu.onnx")
    ort.InferenceSession(src, providers=["CPUExecutionProvider"])  # onnxruntime takes it as it is
    with pytest.raises(onnx.checker.ValidationError, match="com.microsoft"):
        onnx.checker.check_model(model, full_check=True)
    out = tmp_path / "out.onnx"
    r = run("rewrite", src, "-o", out)
    assert r.exit_code == 0, r.output
    said = [line for line in r.output.splitlines() if "without importing the domain" in line]
    assert len(said) == 1 and "imports com.microsoft version 1" in said[0], r.output
    written = onnx.load(out)
    onnx.checker.check_model(written, full_check=True)
    assert {(o.domain, o.version) for o in written.opset_import} >= {("com.microsoft", 1)}
    kinds = {n.op_type for n in written.graph.node}
    assert kinds == {"LayerNormalization", "FastGelu"}, kinds
    x = {"x": np.random.default_rng(1).standard_normal((1, 4, 16)).astype(np.float32)}
    want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, x)[0]
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
