"""precision.autocast's tables against PyTorch's own: every op they list has an autocast kernel on that
device (the dispatcher's AutocastCPU / AutocastCUDA keys, no GPU needed), the ops they leave out have
none, and on CPU each list's policy is what autocast does to an op's output dtype."""

from __future__ import annotations

import pytest

from fusecli.precision.autocast import (
    CPU_FP32,
    CPU_LOWER,
    CPU_PROMOTE,
    CUDA_FP32,
    CUDA_LOWER,
    LISTS,
)

torch = pytest.importorskip("torch")


def _has_autocast_kernel(op: str, key: str) -> bool:
    """Whether any overload of aten::op has a kernel under dispatch key ``key``."""
    packet = getattr(torch.ops.aten, op)
    names = [f"aten::{op}" if o == "default" else f"aten::{op}.{o}" for o in packet.overloads()]
    return any(_kernel(n, key) for n in names)


def _kernel(name: str, key: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
    except RuntimeError:  # a TorchScript-only overload (aten::add.t) the dispatcher does not hold
        return False


@pytest.mark.parametrize("device,ops", [("AutocastCPU", CPU_LOWER + CPU_FP32 + CPU_PROMOTE),
                                        ("AutocastCUDA", CUDA_LOWER + CUDA_FP32)])
def test_every_listed_op_has_an_autocast_kernel(device, ops):
    missing = [op for op in ops if not _has_autocast_kernel(op, device)]
    assert not missing, f"{device} has no kernel for {missing}"


@pytest.mark.parametrize("device,ops", [
    # ops an export spells that run in their inputs' dtype: no autocast kernel on that device
    ("AutocastCPU", ("add", "mul", "gelu", "relu", "silu", "layer_norm", "softmax", "exp", "pow", "tanh")),
    ("AutocastCUDA", ("add", "mul", "gelu", "relu", "silu", "tanh", "where")),
])
def test_ops_left_out_have_no_autocast_kernel(device, ops):
    assert [op for op in ops if _has_autocast_kernel(op, device)] == []


def test_cuda_lists_differ_from_cpu_where_aten_says():
    """softmax and layer_norm: float32 under CUDA autocast, the input's dtype under CPU autocast."""
    cpu_lower, cpu_fp32 = LISTS["cpu"]
    cuda_lower, cuda_fp32 = LISTS["cuda"]
    assert {"softmax", "layer_norm"} <= cuda_fp32 and not {"softmax", "layer_norm"} & cpu_fp32
    assert {"matmul", "gemm", "conv"} <= cpu_lower & cuda_lower


def test_cpu_policies_as_autocast_runs_them():
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)
    with torch.autocast("cpu", torch.bfloat16):
        assert torch.mm(x, w).dtype == torch.bfloat16  # lower_precision_fp
        y = torch.mm(x, w)
        assert torch.nn.functional.layer_norm(y, (8,)).dtype == torch.bfloat16  # runs as its input
        assert torch.softmax(y, -1).dtype == torch.bfloat16
        assert (y + x).dtype == torch.float32  # promotion: the widest input
        assert torch.prod(y, 0).dtype == torch.float32  # fp32 list
        assert torch.cat([y, x]).dtype == torch.float32  # promote list
