"""The fused-training view (the seed's Fig. 4) on the BN + Add + ReLU sample and on an attention export."""

from __future__ import annotations

import re

from click.testing import CliRunner

from fusecli.cli import main
from fusecli.pipeline import Options, analyze
from fusecli.render.training import build_training_dot
from fusecli.render.views import build_dot


def _edges(source: str) -> list[str]:
    """Edge labels and saved-tensor notes ("name bytes"), as the DOT source writes them."""
    notes = re.findall(r'^\s*n\d+ \[label="([^"]*)"[^\]]*shape=note', source, re.M)
    return re.findall(r'->\s*\w+\s*\[[^\]]*label="([^"]*)"', source) + [n.replace("\\n", " ") for n in notes]


def test_bn_add_relu_is_the_seed_figure(sample):
    a = analyze(sample("bn_add_relu"), Options(batch=2))
    source, count = build_training_dot(a)
    assert "BatchNormalization + Add + Relu\\n(bn_add_act)\\ntraining-safe" in source
    assert "ReluGrad + BatchNormGrad\\n(bn_grad_relu_grad)" in source
    labels = _edges(source)
    crossing = {lab.split()[0] for lab in labels if lab.endswith("KiB") or lab.endswith(" B")}
    # x (BN's input, here conv_a's output), gamma, the statistics and y cross; dz leaves the fused backward
    assert {"conv_a_out", "bn_scale", "bn_mean", "bn_var", "y", "dz"} <= crossing
    notes = source.count("shape=note") - 2  # the legend has two
    assert "y 16.0 KiB" in labels and count - notes < 15


def test_recomputed_tensors_are_dashed(hf_onnx):
    a = analyze(hf_onnx("gpt2", dynamic=False), Options(batch=2))
    source, _ = build_training_dot(a)
    assert "(attention)\\ntraining-safe if recomputed" in source
    assert re.search(r'label="[^"]*Softmax[^"]*\\n4\.0 KiB \(recomputed\)"[^\]]*style=dashed', source)


def test_cli_view(sample, tmp_path):
    out = tmp_path / "f.dot"
    r = CliRunner().invoke(main, ["render", sample("bn_add_relu"), "--view", "fused-training",
                                  "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "bn_grad_relu_grad" in out.read_text()


def test_a_recompute_that_frees_nothing_says_so(hf_onnx):
    """Issue 27: at seq=16 the recomputable fusions of BERT's FFN keep as much as they free, and their boxes
    say so; its attention's frees memory (eager matmul saves q and k^T as copies anyway), and says nothing."""
    a = analyze(hf_onnx("bert", dynamic=False), Options(batch=2))
    recomputed = [m for m in a.matches if m.verdict.recompute is not None]
    nothing = {m.pattern.name for m in recomputed if m.verdict.recompute.frees_nothing}
    assert nothing and {m.pattern.name for m in recomputed} - nothing
    source, _ = build_training_dot(a)
    labels = re.findall(r'label="([^"]*training-safe if recomputed[^"]*)"', source)
    assert labels
    for lab in labels:
        pattern = re.search(r"\\n\((\w+)\)\\n", lab)[1]
        assert lab.endswith("training-safe if recomputed,\\nfrees nothing") == (pattern in nothing), lab


def test_folded_layers_say_what_backward_keeps_per_block(hf_onnx):
    """Issue 27: a 4-layer GPT-2's layers drawn once as 'x4' with the bytes backward keeps of each;
    --unfold draws every layer's backward ops, --shape-ops the shape plumbing."""
    a = analyze(hf_onnx("gpt2", "torchscript", attn="default", layers=4), Options(batch=2))
    source, count = build_dot(a, "fused-training")
    full, full_count = build_dot(a, "fused-training", unfold=True)
    every_count = build_dot(a, "fused-training", unfold=True, shape_ops=True)[1]
    assert count < full_count < every_count
    label = re.search(r'subgraph cluster_fold_\d+ \{ label="(inner/h\.\* x4 \(0…3\)[^"]*)"', source)
    sizes = re.search(r"backward keeps (\S+) (\S+) per block, (\S+) (\S+) in all", label.group(1)).groups()
    unit = {"B": 1, "KiB": 2**10, "MiB": 2**20}
    per_block, total = (float(sizes[i]) * unit[sizes[i + 1]] for i in (0, 2))
    assert per_block > 0 and abs(total - 4 * per_block) < 0.01 * total
    for k in range(4):  # backward ops named after layer k's forward ops: all drawn unfolded, layer 0's folded
        name = f"gradients/inner/h.{k}/mlp/c_fc/Gemm"
        assert re.search(re.escape(name), full) and bool(re.search(re.escape(name), source)) == (k == 0)
