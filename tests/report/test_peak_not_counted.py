"""What the peak leaves out, said (report/peak.py), and the claim measured against PyTorch's allocations."""

from __future__ import annotations

import pytest

from fusecli.pipeline import Options, analyze
from fusecli.report.peak import LOW_PRECISION_MATMUL_WORK, peak_not_counted

pytest.importorskip("torch")
pytest.importorskip("transformers")


def _mm_allocations(a, b) -> list[int]:
    """Bytes of each allocation ``torch.mm(a, b)`` makes on CPU, in order (the profiler's raw records)."""
    import torch
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        torch.mm(a, b)
    found, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.typed[0] == _EventType.Allocation and e.typed[1].alloc_size > 0:
            found.append((e.start_time_ns, e.typed[1].alloc_size))
        stack.extend(e.children)
    return [n for _, n in sorted(found)]


def _cpu_flags() -> set[str] | None:
    """The CPU's feature flags (Linux's /proc/cpuinfo), or None where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), None)
    except OSError:
        return None


def test_a_low_precision_matmul_on_cpu_takes_a_work_buffer_fp32_does_not():
    """The note's claim: beside its output, a CPU mm in bfloat16 allocates one more buffer (oneDNN's), and one
    in float16 does where the CPU has AVX512-FP16 (measured on one CPU with it and one without); in float32
    it allocates the output only."""
    import torch

    torch.manual_seed(0)
    out = 256 * 64
    flags = _cpu_flags()
    cases = [(torch.float32, False), (torch.bfloat16, True)]
    if flags is not None:
        cases.append((torch.float16, "avx512_fp16" in flags))
    for dtype, extra in cases:
        a, b = torch.randn(256, 256, dtype=dtype), torch.randn(256, 64, dtype=dtype)
        made = _mm_allocations(a, b)
        assert made[0] == out * a.element_size(), (dtype, made)
        assert (len(made) > 1) == extra, (dtype, made)
        if extra:
            assert 0 < made[1] < 4 << 20, (dtype, made)  # within the note's measured range


def test_the_matmul_work_buffer_is_said_where_bf16_matmuls_run_on_cpu(hf_onnx):
    path = hf_onnx("llama", "dynamo", attn="default")
    said = {(p, d): LOW_PRECISION_MATMUL_WORK in peak_not_counted(
                analyze(path, Options(batch=2, dims={"seq": 32}, precision=p, device=d)))
            for p, d in (("bf16", "cpu"), ("amp-bf16", "cpu"), (None, "cpu"), ("bf16", "cuda"))}
    assert said == {("bf16", "cpu"): True, ("amp-bf16", "cpu"): True, (None, "cpu"): False,
                    ("bf16", "cuda"): False}, said
