"""render --unfold and --shape-ops from the command line: what each draws, and where they are documented."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from fusecli.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _render(model: str, *args: str) -> tuple[str, int]:
    r = CliRunner().invoke(main, ["render", model, "--dot", "--batch", "2", *args])
    assert r.exit_code == 0, r.output
    return r.stdout, len(re.findall(r"^\s+n\d+ \[", r.stdout, re.M))


def test_layers_fold_unless_unfold_and_shape_ops_show_on_request(hf_onnx):
    model = hf_onnx("gpt2", "torchscript", attn="default", layers=4)
    folded, boxes = _render(model, "--view", "after")
    unfolded, unfolded_boxes = _render(model, "--view", "after", "--unfold")
    everything, every_box = _render(model, "--view", "after", "--unfold", "--shape-ops")
    assert "x4 (0…3)" in folded and "x4" not in unfolded
    assert boxes < unfolded_boxes < every_box
    assert "/inner/h.3/mlp/c_fc/Gemm" in unfolded and "/inner/h.3/mlp/c_fc/Gemm" not in folded
    assert "/inner/h.3/attn/c_attn/Shape" in everything and "/inner/h.3/attn/c_attn/Shape" not in unfolded


def test_help_and_reference_name_both_options():
    text = CliRunner().invoke(main, ["render", "--help"]).output
    reference = (ROOT / "docs" / "cli.md").read_text()
    render_entry = reference.split("fusecli render  MODEL")[1].split("\nfusecli ")[0]
    render_section = reference.split("`render` draws with")[1].split("\n## ")[0]
    for option in ("--unfold", "--shape-ops"):
        assert option in text and option in render_entry
        assert f"`{option}`" in render_section  # and what it does
