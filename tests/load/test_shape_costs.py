"""A declared shape is a promise about cost (load/shape_tools.check_shape_costs): a rank, or a tensor an
op reads as a shape, beyond the RANK budget ends every command in one line and exit 1, before the shape
tools build anything from it (issue 54's 381-byte file grew to 24 GB in onnxruntime's symbolic shape
inference). Each case runs as a process under an address-space cap, its time and peak RSS measured."""

from __future__ import annotations

import os

import pytest

from tests import hostile as H
from tests.test_hostile import assert_one_error, run_cli

CASES = [
    (H.rank_from_declared_dim, r"ConstantOfShape 'cos' reads 'e' as a shape of 73,786,976,294,838,206,464 "
                               r"elements: over fusecli's budget of 64 dims of one tensor"),
    (H.declared_rank, r"graph input 'x' declares 1,000 dims: over fusecli's budget of 64 dims"),
    (H.shape_input_claims, r"Reshape 'r' reads 's' as a shape of 1,000,000 elements"),
    (lambda f: H.shape_input_claims(f, "Tile", 10**15),
     r"Tile 'r' reads 's' as a shape of 1,000,000,000,000,000 elements"),
    (lambda f: H.shape_input_claims(f, "Expand", 65), r"Expand 'r' reads 's' as a shape of 65 elements"),
    (lambda f: H.shape_constant_claims(f, "ConstantOfShape"),
     r"ConstantOfShape 'r' reads 's' as a shape of 200 elements"),
    (lambda f: H.shape_constant_claims(f, "Reshape", 10**5), r"Reshape 'r' reads 's' as a shape of 100,000"),
]
INVALID = r"not a valid model: onnxruntime refuses it"  # rewrite asks onnxruntime first; either line will do
COMMANDS = ["analyze", "render --dot", "rewrite", "rewrite --no-verify", "plan --budget 1GiB", "diff"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_over_budget_shape_is_one_error_line(case, command, tmp_path):
    build, pattern = CASES[case]
    path = build(str(tmp_path / "case"))
    words = command.split()
    args = [words[0], path, *words[1:]]
    if words[0] == "rewrite":
        args += ["-o", str(tmp_path / "out.onnx")]
    if words[0] == "diff":
        args.insert(2, path)
    result = run_cli(*args)
    if words[0] == "diff":  # diff's bad input is exit 3 (1 is a regression)
        assert result[0] == 3, result[2][-400:]
        result = (1, *result[1:])
    assert_one_error(result, f"{pattern}|{INVALID}" if words[0] == "rewrite" else pattern)
    assert not os.path.exists(tmp_path / "out.onnx")


def test_a_rank_within_the_budget_is_analyzed(tmp_path):
    """The budget is the limit, not a guess: 64 dims (numpy's own) still load."""
    path = H.shape_constant_claims(str(tmp_path / "case"), "Expand", 64)
    code, out, err, *_ = run_cli("analyze", path, "--json")
    assert code == 0, err[-400:]
    assert '"unsupported"' in out


def test_the_budget_is_raised_by_its_variable(tmp_path):
    path = H.shape_constant_claims(str(tmp_path / "case"), "Expand", 70)
    code, _, err, *_ = run_cli("analyze", path, env={"FUSECLI_MAX_RANK": "80"})
    assert code == 0, err[-400:]


@pytest.mark.parametrize(("where", "pattern"), [
    ("node", r"a node's name 'nnnnnnnn.*'\.\.\. of 100,000 characters: over fusecli's budget of 65,536 "
             r"characters of one name or string"),
    ("output", r"a tensor name of Relu 'r' 'nnnn.*'\.\.\. of 100,000 characters"),
    ("dim", r"a dim name of graph input 'x' 'nnnn.*'\.\.\. of 100,000 characters"),
])
@pytest.mark.parametrize("command", ["analyze", "rewrite"])
def test_a_name_over_the_string_budget_is_one_error_line(tmp_path, where, pattern, command):
    """A 100,000-character name (a node's, a tensor's, a dim's): one line naming its start, the figure and
    the budget, before any report, picture or kernel carries it."""
    path = H.long_names(str(tmp_path / "case"), where)
    args = [command, path] + (["-o", str(tmp_path / "out.onnx")] if command == "rewrite" else [])
    assert_one_error(run_cli(*args), pattern if command == "analyze" else f"{pattern}|{INVALID}")
    assert not os.path.exists(tmp_path / "out.onnx")


def test_a_list_over_the_field_budget_is_one_error_line_and_its_variable_raises_it(tmp_path):
    """FIELD_ENTRIES, lowered to 100 by its variable: a Sum of 200 inputs is refused in one line; at 256
    it is analyzed."""
    path = H.many_inputs(str(tmp_path / "case"), 200)
    assert_one_error(run_cli("analyze", path, env={"FUSECLI_MAX_FIELD_ENTRIES": "100"}),
                     r"Sum 'sum' lists 200 inputs: over fusecli's budget of 100 entries of one node's list")
    code, _, err, *_ = run_cli("analyze", path, env={"FUSECLI_MAX_FIELD_ENTRIES": "256"})
    assert code == 0, err[-400:]
