"""The rewrite summary's verification lines: the dims it ran at, and whole sentences."""

from __future__ import annotations

import onnx
import pytest

from fusecli.rewrite.report import format_summary
from fusecli.rewrite.run import RewriteOptions, RewriteResult
from fusecli.rewrite.verify.outputs import OutputCheck, Verification


def _result(verification: Verification, dims: dict[str, int]) -> RewriteResult:
    return RewriteResult("model.onnx", "out.onnx", RewriteOptions(batch=2), onnx.ModelProto(), [], 10, 8,
                         {}, {}, 0, 1, verification=verification, dims=dims)


@pytest.mark.parametrize("whole", [True, False])
def test_regions_not_cut_out_are_said_in_a_whole_sentence(whole):
    check = OutputCheck("y", "float32", 1e-7, 1e-4)
    v = Verification(checks={"disabled": [check]} if whole else {}, uncut=["silu: a size is unknown", "x"],
                     model_skipped=None if whole else "--verify regions")
    text = format_summary(_result(v, {"batch": 2, "keras_tensor_dim1": 32}))
    assert "verified with onnxruntime (CPU, batch=2, keras_tensor_dim1=32):" in text
    line = next(ln for ln in text.splitlines() if "not checked on" in ln)
    assert line.endswith("the whole model's run below checks them" if whole else
                         "the whole model was not run either (--verify regions)"), line
