"""The fused-training view (the seed's Fig. 4) on the BN + Add + ReLU sample and on an attention export."""

from __future__ import annotations

import re

from click.testing import CliRunner

from fusecli.cli import main
from fusecli.pipeline import Options, analyze
from fusecli.render_training import build_training_dot


def _edges(source: str) -> list[str]:
    return re.findall(r'->\s*\w+\s*\[[^\]]*label="([^"]*)"', source)


def test_bn_add_relu_is_the_seed_figure(sample):
    a = analyze(sample("bn_add_relu"), Options(batch=2))
    source, count = build_training_dot(a)
    assert "BatchNormalization + Add + Relu\\n(bn_add_act)\\ntraining-safe" in source
    assert "ReluGrad + BatchNormGrad\\n(bn_grad_relu_grad)" in source
    labels = _edges(source)
    crossing = {lab.split()[0] for lab in labels if lab.endswith("KiB") or lab.endswith(" B")}
    # x (BN's input, here conv_a's output), gamma, the statistics and y cross; dz leaves the fused backward
    assert {"conv_a_out", "bn_scale", "bn_mean", "bn_var", "y", "dz"} <= crossing
    assert "y 16.0 KiB" in labels and count < 15


def test_recomputed_tensors_are_dashed(hf_onnx):
    a = analyze(hf_onnx("gpt2", dynamic=False), Options(batch=2))
    source, _ = build_training_dot(a)
    assert "(attention)\\ntraining-safe if recomputed" in source
    assert re.search(r'label="[^"]*Softmax[^"]* 4\.0 KiB \(recomputed\)"[^\]]*style=dashed', source)


def test_cli_view(sample, tmp_path):
    out = tmp_path / "f.dot"
    r = CliRunner().invoke(main, ["render", sample("bn_add_relu"), "--view", "fused-training",
                                  "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "bn_grad_relu_grad" in out.read_text()


def test_a_recompute_that_frees_nothing_says_so(hf_onnx):
    """Issue 27: at seq=16 BERT's recomputable fusions keep as much as they free; their boxes say so."""
    a = analyze(hf_onnx("bert", dynamic=False), Options(batch=2))
    nothing = [m for m in a.matches if m.verdict.recompute is not None and m.verdict.recompute.frees_nothing]
    assert nothing
    source, _ = build_training_dot(a)
    labels = re.findall(r'label="([^"]*training-safe if recomputed[^"]*)"', source)
    assert labels and all(lab.endswith("training-safe if recomputed,\\nfrees nothing") for lab in labels)
