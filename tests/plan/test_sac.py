"""Selective activation checkpointing (plan.sac) against PyTorch: each preset applied to every block of the
same ``nn.Module`` (tests/plan/torch_sac.py: torch.utils.checkpoint with
``create_selective_checkpoint_contexts``, one CPU training step under torch.profiler), what the step holds
when forward returns (less the output) and its peak above the resident bytes, beside what fusecli reads
from the model's dynamo export (cache-less, as the checkpointed module runs) at the same batch and seq.
The judge asserts the gradients equal the unplanned model's; the ops each policy saves are compared too.

Models: Llama with grouped-query attention (2 K/V heads), GPT-2, BERT, ViT and Mixtral (4 experts, top-2; its
TorchScript export, as its dynamo export fails on the experts' data-dependent sizes; ``--routing
balanced``) from small configs (tests/hf_models.py), transformers' default attention; fp32, and Llama in
bf16 and under autocast.
"""

from __future__ import annotations

import functools
from collections import Counter

import pytest

from fusecli.core.dims import Poly
from fusecli.pipeline import Options, analyze
from fusecli.plan.planner import StepModel
from fusecli.plan.sac import ATEN_NAMES, MATMULS, SDPA, evaluate

BATCH, SEQ = 2, 128
HELD, PEAK = 0.02, 0.02  # fusecli over PyTorch: held when forward returns, peak above resident
ALL = ("none", "full", "attention", "matmul", "torchtitan", "megatron")
# (Qwen2's blocks are Llama's here: benchmarks/bench_sac.py runs it, with seq 1024)
CASES = [("llama", 2, "fp32", ALL), ("gpt2", None, "fp32", ("full", "torchtitan", "megatron")),
         ("bert", None, "fp32", ("full", "torchtitan", "megatron")),
         ("llama", 2, "bf16", ("full", "torchtitan")), ("llama", 2, "amp-bf16", ("torchtitan",)),
         ("mixtral", None, "fp32", ("full", "matmul", "torchtitan", "megatron")),
         ("vit", None, "fp32", ("none", "full", "attention", "torchtitan"))]
IMAGES = {"vit"}  # 32x32 images: no seq
# measured misses, each a named band the ratio must stay in (lower, upper) until its cause is modelled
KNOWN = {
    # megatron's MUST_SAVE keeps every op's output, also those autograd frees: fusecli reads 2-4% low
    # (BERT 18% low: its mask's and LayerNorm's outputs)
    ("megatron", "held"): (0.80, 1.0), ("megatron", "peak"): (0.86, 1.0),
    # Mixtral's experts accumulate into one buffer in place (index_add_), which the export writes as a
    # new tensor per expert, each cached under MUST_SAVE: fusecli reads 15% high
    ("mixtral", "megatron", "held"): (1.0, 1.2), ("mixtral", "megatron", "peak"): (1.0, 1.2),
    # Mixtral checkpointed without a cache: both peak in the first block's experts' backward after its
    # re-run, PyTorch 81 kB higher (0.973; 1.001 without the checkpoint); the cause not found
    ("mixtral", "full", "peak"): (0.96, 1.0),
    # ViT (32x32 images): PyTorch's resident bytes also hold the pooler the export drops (16,640 B), and
    # its peak is the patch convolution's oneDNN scratchpad in backward (memory.peak.not_counted): above
    # resident fusecli reads 3.9% high, the absolute peak 0.967 (tests/memory/test_peak.py's miss)
    ("vit", "peak"): (1.0, 1.05),
    # a bf16 model's checkpointed step peaks in sdpa's backward, beside the CPU flash kernel's work buffers,
    # which memory.peak.not_counted names (48 KiB per intra-op thread here, more in bf16): ~113 KiB low at
    # pytest's 2 threads, 0.96-0.97 at 1 (benchmarks/RESULTS-sac.md)
    ("llama", "bf16", "full", "peak"): (0.85, 0.98), ("llama", "bf16", "torchtitan", "peak"): (0.85, 0.98),
    # under CPU autocast PyTorch peaks in a bf16 mm's backward, beside the work buffer oneDNN takes inside
    # each bf16 mm (memory.peak.not_counted), whose size is the CPU's: within 2% where this test was
    # written, 0.927 on an AVX512-BF16 CPU (1,458,320 of 1,573,640 B above resident; held 0.999)
    ("llama", "amp-bf16", "torchtitan", "peak"): (0.90, 1.02),
}


def _cases():
    for model, kv_heads, precision, presets in CASES:
        for preset in presets:
            yield pytest.param(model, kv_heads, precision, preset, id=f"{model}-{precision}-{preset}")


@functools.cache
def _analysis(path: str, precision: str, routing: str | None = None, image: bool = False):
    return analyze(path, Options(batch=BATCH, dims={} if image else {"seq": SEQ}, routing=routing,
                                 precision="amp-bf16" if precision == "amp-bf16" else None))


def _band(model: str, precision: str, preset: str, what: str) -> tuple[float, float]:
    tol = HELD if what == "held" else PEAK
    for key in ((model, precision, preset, what), (model, preset, what), (model, what), (preset, what)):
        if key in KNOWN:
            return KNOWN[key]
    return 1 - tol, 1 + tol


@pytest.mark.parametrize(("model", "kv_heads", "precision", "preset"), list(_cases()))
def test_policy_holds_and_peaks_as_torch(hf_onnx, model, kv_heads, precision, preset):
    torch_sac = pytest.importorskip("tests.plan.torch_sac")
    path = hf_onnx(model, torch_sac.EXPORTER.get(model, "dynamo"), attn="default", kv_heads=kv_heads,
                   cache=False, precision="bf16" if precision == "bf16" else "fp32")
    a = _analysis(path, precision, "balanced" if model in torch_sac.ROUTED else None, image=model in IMAGES)
    got = evaluate(a, preset)
    m = torch_sac.measure(model, preset, batch=BATCH, seq=SEQ, precision=precision, kv_heads=kv_heads,
                          assert_grads=(model, preset) not in torch_sac.MUTATES_CACHE)
    values = dict(a.sizes.items())
    resident = StepModel(a.joint, a.liveness, values, Poly()).resident.evaluate(values)
    held = got.held_at_forward_end / m["held_at_forward_end"]
    peak = (got.peak_bytes - resident) / m["peak_above_resident"]
    print(f"{model} {precision} {preset}: held {got.held_at_forward_end}/{m['held_at_forward_end']} = "
          f"{held:.3f}, peak above resident {got.peak_bytes - resident}/{m['peak_above_resident']} = "
          f"{peak:.3f}")
    for what, ratio in (("held", held), ("peak", peak)):
        lo, hi = _band(model, precision, preset, what)
        assert lo <= ratio <= hi, f"{what} {ratio:.3f} outside [{lo}, {hi}]"
    # the ops the policy names, saved as often as PyTorch's policy saved them (both blocks)
    named = MATMULS | SDPA | set(ATEN_NAMES.values())
    ours = Counter(c.op for calls in got.calls.values() for c, saved in calls if saved and c.op in named)
    theirs = Counter({op.removesuffix(".default"): n for op, n in m["saved_ops"].items()
                      if op.removesuffix(".default") in named})
    assert ours == theirs


def test_a_save_list_is_the_preset_it_spells(hf_onnx):
    """--sac-save with matmul's ops is the matmul preset; full is plain block checkpointing."""
    a = _analysis(hf_onnx("llama", "dynamo", attn="default", kv_heads=2, cache=False), "fp32")
    listed = evaluate(a, None, save=[*sorted(MATMULS), "aten._scaled_dot_product_flash_attention_for_cpu"])
    matmul = evaluate(a, "matmul")
    assert (listed.held_at_forward_end, listed.peak_bytes) == (matmul.held_at_forward_end, matmul.peak_bytes)
    none, full = evaluate(a, "none"), evaluate(a, "full")
    assert full.saved_activation_bytes < matmul.saved_activation_bytes < none.saved_activation_bytes
    assert full.recompute_flops > matmul.recompute_flops > 0 == none.recompute_flops


# plan --sac: a plan whose block checkpoints run under the policy, its --emit-pytorch helper applied to the
# module (4 blocks to choose from, as tests/plan/test_planner.py plans them), at budgets leaving 30%, 60% and
# 90% of the unplanned saved activations to them
PLAN_LAYERS, PLAN_BATCH, PLAN_SEQ, HUGE = 4, 8, 64, 1 << 50
PLAN_PEAK = 0.03  # as test_planner's PEAK_TOLERANCE


@pytest.mark.parametrize("preset", ["torchtitan", "attention", "chosen"])
def test_sac_plan_applied_in_pytorch_peaks_where_it_says(hf_onnx, tmp_path, preset):
    """A preset on the blocks plan --sac checkpoints; "chosen": plan --recompute ops's policy, which
    re-runs no more FLOPs than the block plan at the same budget."""
    import torch

    from fusecli.plan.emit import write_pytorch_helper
    from fusecli.plan.planner import PlanOptions, make_plan
    from fusecli.plan.sac import policy_of, sac_candidates
    from fusecli.plan.sac_choose import plan_ops
    from tests import hf_models
    from tests.plan.test_planner import _grads, _import

    path = hf_onnx("llama", "dynamo", attn="default", layers=PLAN_LAYERS, cache=False)
    a = analyze(path, Options(batch=PLAN_BATCH, dims={"seq": PLAN_SEQ}))
    blocks = [c for c, _ in sac_candidates(a, policy_of(preset))] if preset != "chosen" else None
    base = make_plan(a, PlanOptions(HUGE, "none", recompute="blocks"))
    args = hf_models.example_inputs("llama", PLAN_BATCH, PLAN_SEQ)

    def module():
        return hf_models.build("llama", attn="default", layers=PLAN_LAYERS, cache=False)

    reference = _grads(module(), args)
    for fraction in (0.3, 0.6, 0.9):
        budget = base.peak.bytes - int((1 - fraction) * base.saved.bytes)
        if preset == "chosen":
            plan = plan_ops(a, PlanOptions(budget, "none"))
            whole = make_plan(a, PlanOptions(budget, "none", recompute="blocks"))
            assert sum(st.flops for st in plan.steps) <= sum(st.flops for st in whole.steps)
            assert plan.fits == whole.fits
        else:
            plan = make_plan(a, PlanOptions(budget, "none", recompute="blocks"), blocks)
            plan.sac = (preset, None)
        assert plan.checkpoints, fraction
        helper = tmp_path / f"plan_{preset}_{fraction}.py"
        write_pytorch_helper(str(helper), plan, "model.onnx")
        model = module()
        assert len(_import(str(helper)).apply(model)) == len(plan.checkpoints)
        peak = hf_models.peak_memory(model, args)["peak"]
        planned = (plan.planned_peak or plan.peak).bytes
        print(f"sac plan {preset} {fraction:.0%}: {len(plan.checkpoints)} blocks, fits={plan.fits}, "
              f"saved calls {sum(d.saved for d in plan.decisions)}/{len(plan.decisions)}, "
              f"peak {planned}/{peak} = {planned / peak:.3f}")
        assert planned / peak == pytest.approx(1, abs=PLAN_PEAK), fraction
        grads = _grads(model, args)
        assert grads.keys() == reference.keys()
        assert all(torch.allclose(grads[k], g, rtol=1e-5, atol=1e-6) for k, g in reference.items())


def test_chosen_policy_peak_is_monotone_in_the_budget_and_never_costlier_than_blocks(hf_onnx):
    from fusecli.core.errors import FuseError
    from fusecli.plan.planner import PlanOptions, make_plan
    from fusecli.plan.sac_choose import plan_ops

    a = analyze(hf_onnx("llama", "dynamo", attn="default", layers=PLAN_LAYERS, cache=False),
                Options(batch=PLAN_BATCH, dims={"seq": PLAN_SEQ}))
    base = make_plan(a, PlanOptions(HUGE, "none", recompute="blocks"))
    peaks = []
    for i in range(10):  # from no room for activations to all of them
        budget = base.peak.bytes - int((1 - i / 9) * base.saved.bytes)
        try:
            plan = plan_ops(a, PlanOptions(budget, "none"))
        except FuseError:  # below the floor
            continue
        whole = make_plan(a, PlanOptions(budget, "none", recompute="blocks"))
        assert sum(s.flops for s in plan.steps) <= sum(s.flops for s in whole.steps)
        final = plan.planned_peak or plan.peak
        assert plan.fits == (final.bytes <= budget) and plan.fits == whole.fits
        peaks.append(final.bytes)
    assert len(peaks) >= 5
    assert peaks == sorted(peaks), peaks


def test_torchtitan_recomputes_the_router_mm_and_the_helper_says_so(hf_onnx, tmp_path):
    """Mixtral's router (a weight matmul, softmax, topk) is found in each block, recomputed under
    torchtitan and left out of its every-second-mm count, as torchtitan's forced-recompute shapes do; the
    helper --emit-pytorch writes asks the same of PyTorch: an mm by a (64, 4) operand (aten.linear's
    (4, 64) weight) re-run and uncounted, the other mm calls saved and re-run in turn."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy

    from fusecli.plan.emit import write_pytorch_helper
    from fusecli.plan.planner import PlanOptions, make_plan
    from fusecli.plan.sac import forced_mm_shapes, policy_of, sac_candidates, topk_warning
    from tests.plan.test_planner import _import

    a = _analysis(hf_onnx("mixtral", "torchscript", attn="default", cache=False), "fp32", "balanced")
    planned = sac_candidates(a, policy_of("torchtitan"))
    assert len(planned) == 2
    for _, calls in planned:
        routers = [(call, saved) for call, saved in calls if call.router]
        assert [(c.op, c.rhs, saved) for c, saved in routers] == [("aten.mm", (64, 4), False)]
        mms = [saved for call, saved in calls if call.op == "aten.mm" and not call.router]
        assert mms == [i % 2 == 0 for i in range(len(mms))] and len(mms) == 12  # 4 attention, 8 experts
    assert forced_mm_shapes("torchtitan", planned) == [(64, 4)] and forced_mm_shapes("matmul", planned) == []
    assert "mutated" in topk_warning(planned)
    plan = make_plan(a, PlanOptions(1 << 50, "none", recompute="blocks"), [c for c, _ in planned])
    plan.sac, plan.sac_forced_mm_shapes = ("torchtitan", None), forced_mm_shapes("torchtitan", planned)
    helper = tmp_path / "mixtral_torchtitan.py"
    write_pytorch_helper(str(helper), plan, "model.onnx")
    policy_fn = _import(str(helper)).policy()
    x, mm, linear = torch.zeros(3, 64), torch.ops.aten.mm.default, torch.ops.aten.linear.default
    asked = [policy_fn(None, mm, x, torch.zeros(64, 8)), policy_fn(None, mm, x, torch.zeros(64, 4)),
             policy_fn(None, linear, x, torch.zeros(4, 64)), policy_fn(None, mm, x, torch.zeros(64, 8)),
             policy_fn(None, mm, x, torch.zeros(64, 8))]
    save, again = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    assert asked == [save, again, again, again, save]
