"""``fusecli plan`` closed on PyTorch: the plan fusecli makes from an ONNX export, applied to the same
``nn.Module`` with the helper ``--emit-pytorch`` writes, keeps what fusecli says it keeps and peaks where it
says it peaks.

Models: three decoder families (GPT-2, Llama, OPT) and BERT from small configs (4 layers so that there are
blocks to choose, hidden 64; tests/hf_models.py), transformers' default attention (sdpa), exported by both
torch exporters (the TorchScript Llama without grouped-query attention, which that exporter cannot convert
under sdpa), batch 8, seq 64. Checkpointing wants ``use_cache`` off (a cache updated again by a block's
re-run grows twice), so the module runs without one, and so is it exported, but where TorchScript cannot
trace it so (GPT-2 and Llama: ``aten::diff`` in the cache-less mask): those exports keep the cache's
copies of K and V, which the plan predicts and the run does not make (GPT-2: 1.03-1.07x).
The plan is made at budgets that leave 30%, 60% and 90% of the unplanned saved activations to them
(``--recompute blocks``: what torch.utils.checkpoint applies). The judges are autograd's:
``hf_models.saved_storages`` counts distinct non-parameter storages saved for backward
(saved_tensors_hooks) and the tensors each checkpointed module is called with, which the checkpoint holds
for its re-run; ``hf_models.peak_memory`` the live bytes the profiler records over the whole step.
"""

from __future__ import annotations

import functools
import importlib.util

import pytest

from fusecli.core.errors import FuseError
from fusecli.memory.formulas import evaluate_formula
from fusecli.pipeline import Options, analyze
from fusecli.plan.emit import write_pytorch_helper
from fusecli.plan.planner import PlanOptions, make_plan
from tests import hf_models

LAYERS, BATCH, SEQ = 4, 8, 64
# of the unplanned saved activations, left to them by the budget; at 30% a plan may not fit (a block's
# re-run in backward is alive beside the gradients): then the measured peak must not fit either
FRACTIONS = (0.3, 0.6, 0.9)
HUGE = 1 << 50
AMBIGUOUS = 0.03  # a measured peak this close to the budget may fall either side of it: fits not judged
# TorchScript cannot convert sdpa with enable_gqa: its Llama has one K/V head per query head
KV_HEADS = {("llama", "torchscript"): 2}
CACHED = {("gpt2", "torchscript"), ("llama", "torchscript")}  # exported with the cache (see above)


def _cases():
    for name in ("gpt2", "llama", "opt", "bert"):
        for exporter in ("torchscript", "dynamo"):
            yield pytest.param(name, exporter, id=f"{name}-{exporter}")


def _export(hf_onnx, name: str, exporter: str) -> str:
    return hf_onnx(name, exporter, attn="default", layers=LAYERS, kv_heads=KV_HEADS.get((name, exporter)),
                   cache=(name, exporter) in CACHED)


@functools.cache
def _analysis(path: str, batch: int, seq: int):
    return analyze(path, Options(batch=batch, dims={"seq": seq}))


def _model(name: str, exporter: str):
    return hf_models.build(name, attn="default", layers=LAYERS, kv_heads=KV_HEADS.get((name, exporter)),
                           cache=False)


def _grads(model, args) -> dict:
    model.zero_grad()
    out = model(*args)
    out.float().sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _import(path: str):
    spec = importlib.util.spec_from_file_location("fusecli_plan_helper", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _budget(base, fraction: float) -> int:
    """A budget that leaves ``fraction`` of the unplanned saved activations to them."""
    return base.peak.bytes - int((1 - fraction) * base.saved.bytes)


def _applied(plan, name: str, exporter: str, tmp_path):
    """The module with the plan's helper applied, and the modules it wrapped."""
    helper = tmp_path / "plan.py"
    write_pytorch_helper(str(helper), plan, "model.onnx")
    model = _model(name, exporter)
    return model, _import(str(helper)).apply(model)


# RESULTS-peak.md "Plans": measured saved over predicted 0.98-1.00, peak 0.97-1.01 (BERT dynamo at 30%: 0.973)
SAVED_TOLERANCE, PEAK_TOLERANCE = 0.02, 0.03
CACHE_COPIES = ("GPT-2's TorchScript export keeps the KV cache's copies of K and V, which the plan predicts "
                "and the cache-less run does not make (TorchScript cannot trace it without the cache): "
                "saved 0.94, peak 0.95-0.96")
_RUNS: dict[tuple[str, str], tuple[list[tuple], bool]] = {}


def _run(hf_onnx, tmp_path_factory, name: str, exporter: str) -> tuple[list[tuple], bool]:
    """The plan at each budget of FRACTIONS applied to the module, measured once per case: rows of
    (fraction, budget, fits, predicted saved, measured saved, planned peak, measured peak), and whether the
    last plan's gradients equal the unplanned module's."""
    import torch

    key = (name, exporter)
    if key in _RUNS:
        return _RUNS[key]
    tmp_path = tmp_path_factory.mktemp(f"plan_{name}_{exporter}")
    a = _analysis(_export(hf_onnx, name, exporter), BATCH, SEQ)
    assert a.profile.name == "pytorch"
    base = make_plan(a, PlanOptions(HUGE, "none", recompute="blocks"))
    args = hf_models.example_inputs(name, BATCH, SEQ)
    reference = _grads(_model(name, exporter), args)
    rows, same_grads = [], False
    for fraction in FRACTIONS:
        budget = _budget(base, fraction)
        plan = make_plan(a, PlanOptions(budget, "none", recompute="blocks"))
        assert plan.checkpoints, (fraction, plan.sequence)
        model, wrapped = _applied(plan, name, exporter, tmp_path)
        assert len(wrapped) == len(plan.checkpoints)
        measured = sum(b for _, _, b in hf_models.saved_storages(model, args, held_by=wrapped))
        peak = hf_models.peak_memory(model, args)["peak"]
        row = (fraction, budget, plan.fits, plan.planned_saved.bytes, measured, plan.planned_peak.bytes, peak)
        print(f"planned-vs-measured {name} {exporter} {fraction:.0%} budget={budget} fits={plan.fits} "
              f"saved {row[3]}/{measured}={measured / row[3]:.3f} "
              f"peak {row[5]}/{peak}={peak / row[5]:.3f}")  # shown with -s
        rows.append(row)
        if fraction == FRACTIONS[-1]:
            grads = _grads(model, args)
            same_grads = grads.keys() == reference.keys() and all(
                torch.allclose(grads[k], g, rtol=1e-5, atol=1e-6) for k, g in reference.items())
    _RUNS[key] = rows, same_grads
    return _RUNS[key]


@pytest.mark.parametrize(("name", "exporter"), list(_cases()))
def test_plan_applied_in_pytorch_fits_where_it_says_and_keeps_the_gradients(hf_onnx, tmp_path_factory,
                                                                             name, exporter):
    rows, same_grads = _run(hf_onnx, tmp_path_factory, name, exporter)
    judged = 0
    for fraction, budget, fits, _, _, planned_peak, peak in rows:
        if abs(peak - budget) > AMBIGUOUS * budget:
            assert fits == (peak <= budget), (fraction, peak, budget, planned_peak)
            judged += 1
    assert rows[-1][2]  # 90% of the activations left: the plan fits
    assert same_grads
    assert judged >= 2


def _ratio_cases():
    for name, exporter in (p.values for p in _cases()):
        cached = (name, exporter) == ("gpt2", "torchscript")
        marks = [pytest.mark.xfail(strict=True, reason=CACHE_COPIES)] if cached else []
        yield pytest.param(name, exporter, marks=marks, id=f"{name}-{exporter}")


@pytest.mark.parametrize(("name", "exporter"), list(_ratio_cases()))
def test_plan_applied_in_pytorch_keeps_and_peaks_what_it_predicts(hf_onnx, tmp_path_factory, name, exporter):
    rows, _ = _run(hf_onnx, tmp_path_factory, name, exporter)
    for fraction, _, _, predicted, measured, planned_peak, peak in rows:
        assert measured / predicted == pytest.approx(1, abs=SAVED_TOLERANCE), (fraction, measured, predicted)
        assert peak / planned_peak == pytest.approx(1, abs=PEAK_TOLERANCE), (fraction, peak, planned_peak)


@pytest.mark.parametrize(("name", "exporter"), list(_cases()))
def test_planned_peak_is_monotone_in_the_budget(hf_onnx, name, exporter):
    a = _analysis(_export(hf_onnx, name, exporter), BATCH, SEQ)
    base = make_plan(a, PlanOptions(HUGE))
    peaks = []
    for i in range(10):  # from no room for activations to all of them
        budget = _budget(base, i / 9)
        try:
            plan = make_plan(a, PlanOptions(budget))
        except FuseError:  # below the floor
            continue
        final = plan.planned_peak or plan.peak
        assert plan.fits == (final.bytes <= budget)
        peaks.append(final.bytes)
    assert len(peaks) >= 5
    assert peaks == sorted(peaks), peaks  # budgets ascend: a smaller budget never gives a larger peak


@pytest.mark.parametrize(("name", "exporter"), list(_cases()))
def test_largest_batch_fits_by_the_measured_peak(hf_onnx, tmp_path, name, exporter):
    a = _analysis(_export(hf_onnx, name, exporter), BATCH, SEQ)
    base = make_plan(a, PlanOptions(HUGE, "none"))

    def at(formula: str, batch: int) -> int:
        return evaluate_formula(formula, {"batch": batch, "seq": SEQ})

    def measured(batch: int, plan=None) -> int:
        model = _model(name, exporter)
        if plan is not None:
            model, _ = _applied(plan, name, exporter, tmp_path)
        return hf_models.peak_memory(model, hf_models.example_inputs(name, batch, SEQ))["peak"]

    # halfway between the peaks at batch 3 and 4: batch 3 fits, 4 does not, by PyTorch's own peaks
    budget = (at(base.peak.formula, 3) + at(base.peak.formula, 4)) // 2
    plan = make_plan(a, PlanOptions(budget, "none"))
    assert plan.largest == 3
    assert measured(3) <= budget < measured(4)
    # with a plan: the largest batch it reports, its checkpoints applied, measured there and one above
    plan = make_plan(a, PlanOptions(_budget(base, 0.7), "none", recompute="blocks"))
    largest = plan.planned_largest
    assert largest >= BATCH
    assert at(plan.planned_peak.formula, largest) <= plan.options.budget < \
        at(plan.planned_peak.formula, largest + 1)
    assert measured(largest, plan) <= plan.options.budget
    if (name, exporter) not in CACHED:  # the cached export holds K/V copies this run does not make
        assert plan.options.budget < measured(largest + 1, plan)


def test_a_model_that_fits_says_so_and_the_floor_is_an_error(hf_onnx):
    a = _analysis(_export(hf_onnx, "gpt2", "torchscript"), BATCH, SEQ)
    plan = make_plan(a, PlanOptions(HUGE))
    assert plan.fits and plan.chosen == 0 and plan.planned_peak is None
    bare = make_plan(a, PlanOptions(HUGE, "none"))  # no optimizer state: liveness's own peak and saved
    assert bare.peak.bytes == a.liveness.peak_bytes and bare.saved.bytes == a.liveness.saved_activation_bytes
    assert plan.peak.bytes - bare.peak.bytes == 8 * plan.lines[0].bytes // 4  # AdamW: two fp32 moments
    assert evaluate_formula(plan.peak.formula, plan.dims) == plan.peak.bytes
    assert plan.largest > BATCH
    with pytest.raises(FuseError, match="below the parameters' own memory") as e:
        make_plan(a, PlanOptions(plan.floor - 1))
    assert f"{plan.floor:,}" in str(e.value)
    make_plan(a, PlanOptions(plan.floor))  # the floor itself is a budget, if one nothing fits in



def test_keras_blocks_are_named_as_the_layers_recompute_grad_wraps(tmp_path):
    """A Keras 3 SavedModel of four residual blocks (each a layer of layers): the plan names them by the
    names ``model.get_layer`` takes, the first block first."""
    pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")

    class Block(keras.layers.Layer):
        def __init__(self, width, **kw):
            super().__init__(**kw)
            self.norm = keras.layers.LayerNormalization(name="norm")
            self.fc1 = keras.layers.Dense(4 * width, activation="gelu", name="fc1")
            self.fc2 = keras.layers.Dense(width, name="fc2")

        def call(self, x):
            return x + self.fc2(self.fc1(self.norm(x)))

    inp = keras.Input((16, 32))
    x = inp
    for i in range(4):
        x = Block(32, name=f"block_{i}")(x)
    model = keras.Model(inp, x)
    model.export(str(tmp_path / "stack"), verbose=False)
    a = analyze(str(tmp_path / "stack"), Options(batch=64))
    assert a.profile.name == "tensorflow"
    base = make_plan(a, PlanOptions(HUGE, "none"))
    plan = make_plan(a, PlanOptions(_budget(base, 0.6), "none"))
    assert plan.fits and plan.checkpoints and plan.checkpoints[0] == "block_0"
    for name in plan.checkpoints:
        assert isinstance(model.get_layer(name), Block)
    from fusecli.plan.text import apply_lines

    assert "tf.recompute_grad" in "\n".join(apply_lines(plan))


def test_recomputable_fusions_come_first_priced_by_their_verdict(hf_onnx):
    """Llama's SwiGLU is training-safe if recomputed (the fused backward re-runs SiLU): cheaper per byte
    than a block, so the sequence takes it first, freeing what its verdict says."""
    a = _analysis(_export(hf_onnx, "llama", "dynamo"), BATCH, SEQ)
    plan = make_plan(a, PlanOptions(HUGE, "none"))
    kinds = [s.candidate.kind for s in plan.sequence]
    assert "fusion" in kinds and "block" in kinds
    assert kinds == sorted(kinds, key=lambda k: k != "fusion")  # every fusion before every block
    verdicts = {f"{m.pattern.name} at {m.root.name}": m.verdict.recompute for m in a.matches
                if m.verdict.recompute is not None}
    for s in plan.sequence:
        if s.candidate.kind == "fusion":
            rc = verdicts[s.candidate.name]
            assert s.freed_bytes == rc.bytes_freed - rc.bytes_kept and s.flops == rc.flops
    per_byte = [s.flops / s.freed_bytes for s in plan.sequence]
    assert max(per_byte[:kinds.count("fusion")]) < min(per_byte[kinds.count("fusion"):])
