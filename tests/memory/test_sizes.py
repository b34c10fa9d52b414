"""Dims as polynomials, and binding the user's --batch / --dim to a model's input dims."""

from __future__ import annotations

import pytest
from onnx import helper

from fusecli.core.dims import DimParseError, Poly, dim_value, parse_dim
from fusecli.core.errors import UsageError
from fusecli.load import load_model
from fusecli.memory.sizes import Sizes, bind, total_formula
from tests.conftest import make_model, vi


@pytest.mark.parametrize("text, values, expected", [
    ("seq", {"seq": 7}, 7), ("2*seq", {"seq": 7}, 14), ("seq + 1", {"seq": 7}, 8), ("seq+1", {"seq": 7}, 8),
    ("batch*heads", {"batch": 2, "heads": 3}, 6), ("seq**2", {"seq": 5}, 25), ("seq^2 - seq", {"seq": 5}, 20),
    ("3", {}, 3),
])
def test_expressions_evaluate(text, values, expected):
    assert parse_dim(text).evaluate(values) == expected
    assert dim_value(text, values) == expected


@pytest.mark.parametrize("text", ["floor(seq/4)", "Max(a, b)", "seq/2", "seq**x"])
def test_non_polynomials_are_refused(text):
    with pytest.raises(DimParseError):
        parse_dim(text)


def test_a_missing_value_is_unknown_not_one():
    assert parse_dim("batch*seq").evaluate({"batch": 2}) is None


def test_polynomials_print_in_the_models_names():
    p = Poly.const(98304) * Poly.var("batch") * Poly.var("seq") \
        + Poly.const(2048) * Poly.var("batch") * Poly.var("seq") * Poly.var("seq")
    assert str(p) == "98304*batch*seq + 2048*batch*seq^2"
    assert parse_dim(str(p)) == p  # what fusecli prints, it reads back
    assert str(Poly.const(4) - Poly.var("seq")) == "4 - seq"


def _model(*inputs):
    nodes = [helper.make_node("Identity", [name], [f"{name}_out"]) for name, _ in inputs]
    return make_model(nodes, [vi(name, *shape) for name, shape in inputs],
                      [vi(f"{name}_out", *shape) for name, shape in inputs])


def test_bind_reads_names_inside_expressions(save_model):
    path = save_model(_model(("a", ["batch", "2*seq"]), ("b", ["batch*heads", "seq + 1", 64])))
    graph = load_model(path)
    sizes, warnings = bind(graph, 2, {"seq": 5, "heads": 3})
    assert sizes.variables == ("batch", "seq", "heads") and sizes.batch == 2
    assert warnings == []
    assert [sizes.shape(graph.tensors[n]) for n in ("a", "b")] == [(2, 10), (6, 6, 64)]
    assert sizes.nbytes(graph.tensors["b"]) == 6 * 6 * 64 * 4
    assert str(sizes.formula(graph.tensors["a"])) == "8*batch*seq"


def test_unnamed_input_dims_are_named(save_model):
    """A dynamic dim without a name: 'batch' on the first axis, '<input>_dim<k>' elsewhere."""
    path = save_model(_model(("ids", [None, None])))
    graph = load_model(path)
    sizes, warnings = bind(graph, 3, {"ids_dim1": 4})
    assert sizes.variables == ("batch", "ids_dim1") and sizes.shape(graph.tensors["ids"]) == (3, 4)


def test_every_dim_not_given_is_warned_about(save_model):
    graph = load_model(save_model(_model(("x", ["batch", "seq", 8]))))
    sizes, warnings = bind(graph, 2, {})
    assert sizes["seq"] == 1
    assert warnings == ["dims not given are taken as 1: seq=1 (set --dim seq=VALUE)"]
    _, warnings = bind(graph, None, {"seq": 4})
    assert warnings == ["dims not given are taken as 1: batch=1 (set --batch N)"]


def test_dims_that_do_not_fit_are_usage_errors(save_model):
    graph = load_model(save_model(_model(("x", ["batch", "seq"]))))
    with pytest.raises(UsageError, match="no dim of that name .its dims: batch, seq"):
        bind(graph, None, {"Seq": 3})
    with pytest.raises(UsageError, match="--batch 8 and --dim batch=4 disagree"):
        bind(graph, 8, {"batch": 4})
    sizes, _ = bind(graph, 4, {"batch": 4, "seq": 2})
    assert sizes.batch == 4


def test_batch_on_a_static_model_is_said_to_do_nothing(save_model):
    graph = load_model(save_model(_model(("x", [2, 3]))))
    sizes, warnings = bind(graph, 8, {})
    assert sizes.variables == () and any("--batch 8 has no effect" in w for w in warnings)


def test_totals_name_what_they_leave_out(save_model):
    graph = load_model(save_model(_model(("x", ["batch", 3]))))
    x = graph.tensors["x"]
    total, missing = total_formula([x, x])
    assert str(total) == "24*batch" and missing == 0
    x.shape = (None, 3)
    assert Sizes({"batch": 2}).nbytes(x) is None
    assert total_formula([x])[1] == 1


def test_several_batch_dims_get_one_batch_hint(save_model):
    """Issue 27: torch's auto-named dims give each input its own batch dim; --batch N sets them all, so
    the warning suggests it once."""
    ids = ("input_ids", ["input_ids_dynamic_axes_1", "input_ids_dynamic_axes_2"])
    graph = load_model(save_model(_model(ids, ("mask", ["mask_dynamic_axes_1", "mask_dynamic_axes_2"]))))
    _, warnings = bind(graph, None, {})
    assert len(warnings) == 1 and warnings[0].count("--batch N") == 1
    assert warnings[0].endswith("(set --batch N --dim input_ids_dynamic_axes_2=VALUE "
                                "--dim mask_dynamic_axes_2=VALUE)")


def test_same_dim_reads_expressions_that_do_not_parse():
    """dynamo writes a key length as '((seq**2)//seq)': the same dim as 'seq' at every size tried; a
    polynomial compares as one; unknown dims are never the same."""
    from fusecli.core.dims import same_dim

    assert same_dim("seq", "((seq**2)//seq)") and same_dim("2*batch", "batch*2") and same_dim(32, 32)
    assert not same_dim("seq", "batch") and not same_dim("seq", "((seq**2)//batch)")
    assert not same_dim(None, None) and not same_dim("unk__3", "unk__4") and not same_dim(16, "seq")
