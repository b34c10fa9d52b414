"""Issue 27: the kernel the after view names is the one `fusecli rewrite` writes (or none)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from fusecli.cli import main
from fusecli.fusion.emitted import emitted_kernel
from fusecli.pipeline import Options, analyze
from tests.builders import Net


def _conv_bias(save_model, act: str) -> str:
    net = Net(x=("N", 3, 8, 8))
    b = net.bias(net.conv("x"))
    y = net.act("Relu", b) if act == "relu" else net.op("Mul", "swish", b, net.op("Sigmoid", "sig", b))
    return save_model(net.model(y))


def test_conv_bias_relu_is_fused_conv_and_conv_bias_swish_is_not(save_model):
    relu = analyze(_conv_bias(save_model, "relu"), Options(batch=2))
    [m] = [m for m in relu.matches if m.pattern.name == "conv_bias_act"]
    assert emitted_kernel(m) == "FusedConv"
    swish = analyze(_conv_bias(save_model, "swish"), Options(batch=2))
    ms = [m for m in swish.matches if m.pattern.name.startswith("conv_bias")]
    assert ms and all(emitted_kernel(m) != "FusedConv" for m in ms)


def test_the_kernels_named_are_the_kernels_rewrite_writes(hf_onnx, tmp_path):
    """BERT: 3-D matmul_bias stays MatMul + Add (no Gemm), attention becomes MultiHeadAttention."""
    path = hf_onnx("bert")
    a = analyze(path, Options(batch=2, dims={"seq": 16}))
    named = {m.pattern.name: emitted_kernel(m) for m in a.matches if m.pattern.phase == "forward"}
    assert named["matmul_bias"] is None and named["attention"] == "MultiHeadAttention"
    r = CliRunner().invoke(main, ["rewrite", path, "-o", str(tmp_path / "out.onnx"), "--no-verify", "--json"])
    assert r.exit_code == 0, r.output
    kernels = json.loads(r.stdout)["kernels"]
    assert "Gemm" not in kernels and kernels.get("MultiHeadAttention") == 2
    attention = next(m for m in a.matches if m.pattern.name == "attention")
    assert attention.verdict.frameworks["onnxruntime"]["cpu"] is True
    assert "MultiHeadAttention" in attention.verdict.frameworks["onnxruntime"]["note"]
