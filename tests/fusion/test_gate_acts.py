"""The x * gate(x) activations (silu, quick_gelu, hard_swish), BN + SiLU recomputed, bias_softmax,
bias_dropout and near misses, on small ONNX models that run in ONNX Runtime."""

from __future__ import annotations

import pytest

from fusecli.spellings.acts import gate_act_kind
from tests.fusion.models import Net, analyze_model, found, only

N, C, HW = 2, 4, 8
ELEMS = N * C * HW * HW  # elements of one conv-sized activation at batch N


def bn_silu(beta: float | None = None, conv_reads_bn: bool = False):
    net = Net()
    c = net.conv()
    b = net.bn(c)
    gate_in = b if beta is None else net.op("Mul", "beta", b, net.param("beta_c", value=beta))
    y = net.op("Mul", "silu", b, net.op("Sigmoid", "sig", gate_in))
    outs = (y, net.op("Relu", "other", b)) if conv_reads_bn else (y,)
    return net.model(*outs)


def test_bn_silu_is_training_safe_if_the_bn_output_is_recomputed(tmp_path):
    a = analyze_model(bn_silu(), tmp_path, batch=N)
    m = only(a, "bn_act")
    assert [n.name for n in m.nodes] == ["bn", "sig", "silu"] and gate_act_kind(m.roles) == "silu"
    v = m.verdict
    assert v.inference_safe and not v.training_safe and v.state == "training-safe if recomputed"
    rc = v.recompute
    assert sorted(rc.tensors) == ["bn_out", "sig_out"]  # Mul's backward reads both
    assert rc.bytes_freed == 2 * ELEMS * 4 and rc.bytes_kept == 0  # x and the statistics are kept anyway
    assert rc.flops == ELEMS * (2 + 4)  # a per-channel multiply-add, then the sigmoid again
    assert "recomputed" in v.reason and "BatchNormalization" in v.reason
    # the conv before it is not recomputed: conv_bn_act stays inference only, naming the convolution
    conv = only(a, "conv_bn_act").verdict
    assert conv.state == "inference only" and conv.recompute is None and "re-run Conv conv" in conv.reason
    assert conv.check == "recompute_contraction"
    assert f"({2 * ELEMS * 3 * 3 * 3:,} FLOPs)" in conv.reason  # a multiply-add per (Cin, kh, kw) per output


def test_pytorch_keeps_the_bn_output_for_silu():
    """PyTorch's own autograd keeps BN's output for F.silu: the bytes the recompute verdict frees."""
    torch = pytest.importorskip("torch")
    conv, bn = torch.nn.Conv2d(3, C, 3, padding=1), torch.nn.BatchNorm2d(C)
    x = torch.randn(N, 3, HW, HW)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = bn(conv(x))
        torch.nn.functional.silu(y).sum().backward()
    assert any(t.data_ptr() == y.data_ptr() and t.nbytes == ELEMS * 4 for t in saved)


@pytest.mark.parametrize(("beta", "kind"), [(1.702, "quick_gelu"), (1.5, "swish")])
def test_swish_with_beta(tmp_path, beta, kind):
    a = analyze_model(bn_silu(beta), tmp_path, batch=N)
    m = only(a, "bn_act")
    assert gate_act_kind(m.roles) == kind and m.verdict.recompute is not None


def test_silu_read_elsewhere_is_a_near_miss_naming_its_check(tmp_path):
    a = analyze_model(bn_silu(conv_reads_bn=True), tmp_path, batch=N)
    m = next(m for m in a.matches if m.pattern.name == "conv_bn_act" and m.root.name == "silu")
    v = m.verdict
    assert v.state == "not fusable" and v.check == "read_outside"
    assert "bn_out" in v.reason and "also read by other" in v.reason
    assert all(f["cpu"] is False and f["gpu"] is False for f in v.frameworks.values())


def test_silu_alone_and_quick_gelu_after_matmul(tmp_path):
    net = Net(x=("N", 16))
    h = net.op("Add", "bias", net.op("MatMul", "mm", "x", net.param("w", 16, 8)), net.param("b", 8))
    gate = net.op("Sigmoid", "sig", net.op("Mul", "beta", h, net.param("k", value=1.702)))
    g = net.op("Mul", "qg", h, gate)
    a = analyze_model(net.model(g), tmp_path, batch=N)
    m = only(a, "matmul_bias_act")
    assert gate_act_kind(m.roles) == "quick_gelu" and m.verdict.state == "inference only"
    assert "re-run MatMul mm" in m.verdict.reason  # the matmul output is what backward reads
    s = only(a, "silu")
    assert [n.name for n in s.nodes] == ["beta", "sig", "qg"]
    assert s.verdict.state == "training-safe if recomputed"


@pytest.mark.parametrize("form", ["div6", "mul_sixth", "hard_sigmoid"])
def test_hard_swish_decomposed(tmp_path, form):
    net = Net()
    x = "x"
    if form == "hard_sigmoid":
        y = net.op("Mul", "hs", x, net.op("HardSigmoid", "gate", x, alpha=1 / 6, beta=0.5))
    else:
        r6 = net.op("Clip", "gate", net.op("Add", "plus3", x, net.param("three", value=3.0)),
                    net.param("lo", value=0.0), net.param("hi", value=6.0))
        xr = net.op("Mul", "xr", x, r6)
        y = net.op("Div", "hs", xr, net.param("six", value=6.0)) if form == "div6" else \
            net.op("Mul", "hs", xr, net.param("sixth", value=1 / 6))
    a = analyze_model(net.model(y), tmp_path, batch=N)
    m = only(a, "hard_swish")
    assert m.root.name == "hs" and gate_act_kind(m.roles) == "hard_swish"
    assert m.verdict.state in ("training-safe", "training-safe if recomputed")


def test_bias_softmax_and_bias_dropout(tmp_path):
    net = Net(x=("N", 4, 16), z=("N", 4, 16))
    sm = net.op("Softmax", "sm", net.op("Add", "mask_add", "x", net.param("mask", 1, 4, 16)), axis=-1)
    d = net.op("Dropout", "drop", net.op("Add", "bias", "x", net.param("b", 16)))
    y = net.op("Add", "res", d, "z")
    a = analyze_model(net.model(sm, y), tmp_path, batch=N)
    assert found(a, "bias_softmax") == [["mask_add", "sm"]] and only(a, "bias_softmax").verdict.training_safe
    assert found(a, "bias_dropout") == [["bias", "drop", "res"]]
    assert only(a, "bias_dropout").verdict.training_safe


def test_memory_total_and_human_report(tmp_path):
    import json

    import onnx
    from click.testing import CliRunner

    from fusecli.cli import main
    from fusecli.fusion.recompute import saved_if_recomputed

    a = analyze_model(bn_silu(), tmp_path, batch=N)
    assert saved_if_recomputed(a.matches, a.liveness) == a.liveness.saved_bytes - 2 * ELEMS * 4
    path = str(tmp_path / "bn_silu.onnx")
    onnx.save(bn_silu(), path)
    r = CliRunner().invoke(main, ["analyze", path, "--batch", str(N), "--json"])
    doc = json.loads(r.stdout)
    assert doc["memory"]["saved_bytes_if_recomputed"] == doc["memory"]["saved_bytes"] - 2 * ELEMS * 4
    [bn] = [p for p in doc["patterns"] if p["pattern"] == "bn_act"]
    assert bn["verdict"] == "training-safe if recomputed"
    assert bn["recompute"] == {"tensors": ["bn_out", "sig_out"], "flops": ELEMS * 6,
                               "bytes_freed": 2 * ELEMS * 4, "bytes_kept": 0,
                               "net_bytes_freed": 2 * ELEMS * 4}
    human = CliRunner().invoke(main, ["analyze", path, "--batch", str(N)]).output
    assert "training-safe if recomputed" in human
    assert "if every recomputable fusion that frees memory is taken (1 of 1)" in human
