"""Each rank's memory under a data-parallel layout against real torch.distributed ranks: fusecli's
``parallel.ranks`` for the export of a tests/hf_models.py model (default attention, batch 2 per rank)
against ``torch_ranks.py`` run under ``torchrun`` on 2 gloo ranks (DDP, DDP + ZeroRedundancyOptimizer,
FSDP2 with and without ``reshard_after_forward`` and with a bf16 MixedPrecisionPolicy; ``ckpt``: every
block under activation checkpointing; ``tp``: tensor parallel, ``parallelize_module`` with
ColwiseParallel and RowwiseParallel on each block's linears). Per rank:
saved activations within 2% (what autograd's hooks see, less the gathered parameters FSDP frees after
each block), the peak over forward, backward and the optimizer step within the 2% these models reach
(the issue asked for 10%), parameters, gradients and optimizer state exact.

Sequences: 16 (the parameters and their buffers dominate: where a layout's mechanisms show), 128, and the
longest the model's positions allow (rotary Llama and Qwen2: 1024; GPT-2 and DistilBERT have 256 learned
positions). One torchrun per model runs every configuration (multi-process: this module alone).
"""

from __future__ import annotations

import functools

import pytest

from fusecli.parallel.layout import Layout
from fusecli.parallel.ranks import rank_memory
from fusecli.pipeline import Options, analyze
from fusecli.plan.candidates import block_candidates, rng_state_bytes
from tests.parallel.judges import run_judge

pytest.importorskip("torch")
pytest.importorskip("transformers")

BATCH = 2
WORLD = 2
SAVED_TOLERANCE = 0.02
PEAK_TOLERANCE = 0.02
LONG = {"llama": 1024, "qwen2": 1024, "gpt2": 256, "distilbert": 256}
RUNS = ("ddp:16", "zero1:16", "fsdp:16", "fsdp:16:no-reshard", "fsdp:16:bf16", "ddp:128", "zero1:128",
        "fsdp:128", "fsdp:128:no-reshard", "fsdp:128:bf16", "fsdp:16:ckpt", "fsdp:128:ckpt", "ddp:128:ckpt")
# ckpt: every block checkpointed (torch.utils.checkpoint, non-reentrant, before sharding; fusecli: each
# block candidate applied), held to the same bound; amp: the forward under CPU autocast to bf16
# (torchtitan's mixed precision without FSDP; fusecli: --precision amp-bf16 on the fp32 export)
MODELS = [  # (model, exporter, kv_heads): TorchScript cannot export sdpa's GQA, so its Llama has 2 K/V heads
    ("llama", "dynamo", None), ("llama", "torchscript", 2), ("qwen2", "dynamo", None),
    ("gpt2", "dynamo", None), ("gpt2", "torchscript", None), ("distilbert", "dynamo", None),
    ("distilbert", "torchscript", None), ("qwen2", "dynamo", 2)]


# tensor parallel over 2 ranks where torch's ColwiseParallel/RowwiseParallel apply (nn.Linear; GPT-2's
# Conv1D is not one) and the heads divide (2 K/V heads; the 1-K/V-head form: test_layout); sequence
# parallel (sp) where the judge knows torchtitan's plan for the block (Llama-like: torch_ranks.SP_NORMS)
TENSOR_PARALLEL = {("llama", 2): ("tp:16", "tp:128", "tp:1024", "tp:16:sp", "tp:128:sp", "tp:1024:sp",
                                  "tp:128:amp", "tp:1024:sp:amp", "ddp:128:amp"),
                   ("distilbert", None): ("tp:16", "tp:128", "tp:256")}
ONLY_PARALLEL = {("qwen2", 2): ("tp:128", "tp:128:sp", "tp:1024:sp")}  # nothing else run on this model


def _runs(model: str, kv_heads: int | None = None) -> tuple[str, ...]:
    if (model, kv_heads) in ONLY_PARALLEL:
        return ONLY_PARALLEL[model, kv_heads]
    return RUNS + (f"fsdp:{LONG[model]}", f"ddp:{LONG[model]}") + TENSOR_PARALLEL.get((model, kv_heads), ())


# FSDP2 x TP, DDP x TP and HSDP on a (2, 2) mesh: 4 ranks (the tensor-parallel pairs, the shard groups
# innermost), run apart from the rest
MESH = {("llama", 2): ("fsdp_tp:16", "fsdp_tp:128", "fsdp_tp:1024:sp", "fsdp_tp:128:no-reshard",
                       "fsdp_tp:128:bf16", "hsdp:16", "hsdp:128", "hsdp:128:bf16", "ddp_tp:128",
                       "ddp_tp:1024:sp", "ddp_tp:128:amp")}
MESH_WORLD = 4


@functools.cache
def measured(model: str, kv_heads: int | None, out: str, runs: tuple[str, ...] | None = None,
             world: int = WORLD) -> dict[str, dict[int, dict]]:
    """run -> rank -> what torch_ranks.py measured there (``runs``: _runs' unless given)."""
    args = ["--model", model, "--runs", ",".join(runs or _runs(model, kv_heads)), "--batch", str(BATCH)]
    args += ["--kv-heads", str(kv_heads)] if kv_heads is not None else []
    return run_judge("torch_ranks.py", args, out, world)


@functools.cache
def _analysis(path: str, seq: int, precision: str | None):
    return analyze(path, Options(batch=BATCH, dims={"seq": seq}, precision=precision))


def _layout(mode: str, flags: list[str]) -> Layout:
    if mode == "fsdp":
        return Layout(dp_shard=WORLD, reshard_after_forward="no-reshard" not in flags)
    if mode == "tp":
        return Layout(tp=WORLD, sp="sp" in flags)
    if mode == "fsdp_tp":
        return Layout(dp_shard=MESH_WORLD // 2, tp=2, sp="sp" in flags,
                      reshard_after_forward="no-reshard" not in flags)
    if mode == "ddp_tp":
        return Layout(dp_replicate=MESH_WORLD // 2, tp=2, sp="sp" in flags)
    if mode == "hsdp":
        return Layout(dp_replicate=MESH_WORLD // 2, dp_shard=2,
                      reshard_after_forward="no-reshard" not in flags)
    return Layout(dp_replicate=WORLD, zero=1 if mode == "zero1" else None)


# (model, run) -> the peak's bound where it is wider than PEAK_TOLERANCE, and why (both exporters alike)
WIDER = {
    ("gpt2", "fsdp:128:bf16"): (0.04, "0.97: GPT-2's one-device peak under a bf16 model cast reads low "
                                      "(tests/precision: a strict xfail there)"),
    ("distilbert", "fsdp:128:bf16"): (0.06, "0.955: the one-device peak under a bf16 model cast reads low"),
    ("distilbert", "fsdp:128:no-reshard"): (0.03, "0.978: PyTorch's forward peak at the last LayerNorm is "
                                                  "higher (RESULTS-peak.md: the BERT family)"),
    ("distilbert", "tp:128"): (0.04, "0.977: PyTorch's peak in a post-norm block's LayerNorm backward holds "
                                     "about one more (batch, seq, hidden) tensor than fusecli counts there; "
                                     "cause not found (Llama's tensor parallel is within 1.1%)"),
    ("distilbert", "tp:256"): (0.04, "0.972: as at seq 128"),
    ("gpt2", "fsdp:128:ckpt"): (0.04, "1.03: GPT-2's checkpointed blocks' re-run reads high on both "
                                      "exporters (every other model's within 0.5%); cause not found"),
    ("gpt2", "ddp:128:ckpt"): (0.04, "1.03: as under FSDP2"),
}


def _cases():
    for model, exporter, kv in MODELS:
        for run in _runs(model, kv):
            yield pytest.param(model, exporter, kv, run, id=f"{model}-{exporter}-{run.replace(':', '-')}")
    for (model, kv), runs in MESH.items():
        for exporter in ("torchscript", "dynamo"):
            for run in runs:
                yield pytest.param(model, exporter, kv, run, id=f"{model}-{exporter}-{run.replace(':', '-')}")


@pytest.mark.parametrize(("model", "exporter", "kv_heads", "run"), list(_cases()))
def test_each_rank_is_torchs(hf_onnx, tmp_path_factory, model, exporter, kv_heads, run):
    mesh = run.startswith(("fsdp_tp", "ddp_tp", "hsdp"))
    folder = tmp_path_factory.getbasetemp() / f"ranks-{model}-{kv_heads}{'-mesh' if mesh else ''}"
    world = MESH_WORLD if mesh else WORLD
    got = measured(model, kv_heads, str(folder), MESH[model, kv_heads] if mesh else None,
                   world)[run.replace(":", "-")]
    assert sorted(got) == list(range(world))
    mode, seq, *flags = run.split(":")
    a = _analysis(hf_onnx(model, exporter, attn="default", kv_heads=kv_heads), int(seq),
                  "bf16" if "bf16" in flags else "amp-bf16" if "amp" in flags else None)
    chosen = block_candidates(a.graph, a.joint, a.liveness, a.sizes, rng_state_bytes(a)) if "ckpt" in flags \
        else None
    predicted = {r: e for e in rank_memory(a, _layout(mode, flags), chosen=chosen) for r in e.ranks}
    assert sorted(predicted) == list(range(world))
    for rank, m in got.items():
        p = predicted[rank]
        print(f"{model} {exporter} {run} rank {rank}: peak {p.peak_bytes} / {m['peak_bytes']} = "
              f"{p.peak_bytes / m['peak_bytes']:.4f} ({p.peak_phase}; torch {m['peak_op']}), saved "
              f"{p.saved_activation_bytes / m['saved_bytes']:.4f}")
        assert p.saved_activation_bytes == pytest.approx(m["saved_bytes"], rel=SAVED_TOLERANCE)
        bound = WIDER.get((model, run), (PEAK_TOLERANCE, ""))[0]
        assert p.peak_bytes == pytest.approx(m["peak_bytes"], rel=bound)
        # the export's parameters, each as torch holds it on this rank; the rotary inverse frequencies,
        # a buffer torch keeps and the export writes as an initializer, are the few bytes allowed
        for key in ("parameter_bytes", "gradient_bytes", "optimizer_bytes"):
            assert getattr(p, key) == pytest.approx(m[key], abs=256), key
