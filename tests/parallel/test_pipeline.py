"""Each stage's memory under pipeline parallelism against real torch.distributed ranks: fusecli's
``parallel.ranks`` with ``Layout(pp=P, ...)`` for the export of a tests/hf_models.py model (default
attention) against ``torch_pipeline.py`` run under ``torchrun`` on P gloo ranks (2, and 4 stages of a
4-layer Llama), torch's own ``ScheduleGPipe`` and ``Schedule1F1B`` over 2 to 8 microbatches of a batch of
4 (8 for 4 stages: Schedule1F1B takes no fewer microbatches than stages); ``amp``: the step under
CPU autocast to bf16 (fusecli: --precision amp-bf16 on the fp32 export), whose weight copies autocast
makes once and keeps for every microbatch. With data parallel over 2 (a (2, 2) mesh of 4 ranks, pp
outermost) each stage is DDP over its replicas (``--dp-replicate 2``; ``zero1`` with
ZeroRedundancyOptimizer) or FSDP2 over its shards (``--dp-shard 2``, fully_shard on the stage's blocks
and module as torchtitan applies it in a pipeline; ``reshard``: the blocks' reshard_after_forward, False
by default as torchtitan's under a pipeline; ``bf16``: MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32), fusecli's --precision bf16 on the fp32 export), or tensor parallel over 2
(``--tp 2``, the stages' blocks as test_ranks.py's ``tp`` makes them, on models with 2 K/V heads), and
torchtitan's 3-D layout (FSDP2 over tensor parallel in a pipeline: 8 ranks); ``ckpt``: every block
checkpointed (fusecli's block candidates, all chosen); and ScheduleInterleaved1F1B with 2 stages per
rank (its actions checked against torch's own order); decoders (Llama, Qwen2, GPT-2) and an encoder
(DistilBERT fed packed sequences, as a stage takes one tensor); every rank of every stage is checked. DDP is
measured under Schedule1F1B with more microbatches than stages: under ScheduleGPipe, or 1F1B with as
many microbatches as stages, torch 2.13's reducer fails its own assert (``rebuilt parameter indices
size is not same as original model parameters size``) at the second step's first forward.

Per stage: saved activations within 2% (the most autograd holds at once, every microbatch in flight
counted; the stage's input, a receive buffer, and the token ids excepted, as the judge sees them),
the peak over the schedule and the optimizer step within 2% (the issue asked for 10%), parameters,
gradients and optimizer state to the byte, and the receive buffers exactly.

The stages torch runs make no cache: the dynamo exports are made without one (``cache=False``); the
TorchScript exporter cannot export that form, and its Llama's export with a cache saves what the
stages do. One torchrun per model runs every configuration (multi-process: this module alone).
"""

from __future__ import annotations

import functools

import pytest

from fusecli.parallel.interleaved import rank_actions
from fusecli.parallel.layout import Layout
from fusecli.parallel.ranks import rank_memory
from fusecli.pipeline import Options, analyze
from fusecli.plan.candidates import block_candidates, rng_state_bytes
from tests.parallel.judges import run_judge

pytest.importorskip("torch")
pytest.importorskip("transformers")

BATCH = {2: 4, 4: 8}  # stages -> the global batch of a step
SAVED_TOLERANCE = 0.02
PEAK_TOLERANCE = 0.02
# the degrees besides the stages': "ddp" (DDP 2), "fsdp" (FSDP2 2), "tp" (TP 2), "fsdp_tp" (torchtitan's
# 3-D: FSDP2 2 over TP 2, 8 ranks), "v2" (none: interleaved 1F1B's 2 stages per rank) -> (dp_replicate,
# dp_shard, tp)
DEGREES = {"": (1, 1, 1), "ddp": (2, 1, 1), "fsdp": (1, 2, 1), "tp": (1, 1, 2), "fsdp_tp": (1, 2, 2),
           "v2": (1, 1, 1)}
VIRTUAL = 2  # the "v2" cases' stages per rank
# (model, exporter, kv_heads, layers, stages, the other degrees: a DEGREES key) -> runs
# (SCHEDULE:SEQ:MICROBATCHES[:amp][:zero1][:reshard])
MODELS = {
    ("llama", "torchscript", 2, 2, 2, ""): ("gpipe:128:4", "1f1b:128:4", "1f1b:128:2", "gpipe:128:4:amp",
                                            "1f1b:128:4:amp"),
    ("llama", "dynamo", None, 4, 2, ""): ("gpipe:128:4", "1f1b:128:4", "1f1b:1024:2", "1f1b:128:4:ckpt",
                                          "gpipe:128:4:ckpt", "1f1b:1024:2:ckpt"),
    ("gpt2", "dynamo", None, 2, 2, ""): ("gpipe:128:4", "1f1b:128:4", "1f1b:256:2", "1f1b:256:4:amp"),
    ("qwen2", "dynamo", None, 2, 2, ""): ("1f1b:128:4",),
    ("llama", "dynamo", None, 4, 4, ""): ("1f1b:128:8", "1f1b:128:4", "gpipe:128:2"),
    ("llama", "dynamo", None, 2, 2, "ddp"): ("1f1b:128:4", "1f1b:128:4:zero1", "1f1b:128:4:amp"),
    ("gpt2", "dynamo", None, 2, 2, "ddp"): ("1f1b:128:4:zero1",),
    ("llama", "dynamo", None, 4, 2, "fsdp"): ("1f1b:128:4", "1f1b:128:4:reshard", "gpipe:128:4:reshard",
                                              "1f1b:1024:2:reshard", "1f1b:128:4:amp:reshard",
                                              "1f1b:128:4:reshard:bf16", "gpipe:128:4:bf16",
                                              "1f1b:128:4:reshard:ckpt"),
    ("gpt2", "dynamo", None, 2, 2, "fsdp"): ("1f1b:128:4:reshard", "gpipe:128:4"),
    ("llama", "dynamo", 2, 4, 2, "tp"): ("1f1b:128:4", "gpipe:128:4", "1f1b:1024:2", "1f1b:128:4:amp",
                                         "1f1b:128:4:ckpt"),
    ("qwen2", "dynamo", 2, 2, 2, "tp"): ("1f1b:128:4",),
    ("llama", "dynamo", 2, 4, 2, "fsdp_tp"): ("1f1b:128:4:reshard", "gpipe:128:4"),
    ("llama", "dynamo", None, 4, 2, "v2"): ("interleaved-1f1b:128:4", "interleaved-1f1b:128:2",
                                            "interleaved-1f1b:1024:2", "interleaved-1f1b:128:4:ckpt"),
    ("gpt2", "dynamo", None, 4, 2, "v2"): ("interleaved-1f1b:128:4",),
    # an encoder (post-norm blocks, no final norm) fed packed sequences: a stage takes one tensor, so the
    # stages read no padding, and the export fusecli reads takes the token ids alone
    ("distilbert_packed", "dynamo", None, 2, 2, ""): ("gpipe:128:4", "1f1b:128:4", "1f1b:256:2"),
    ("distilbert_packed", "torchscript", None, 2, 2, ""): ("1f1b:128:4",),
    ("distilbert_packed", "dynamo", None, 2, 2, "fsdp"): ("1f1b:128:4:reshard", "gpipe:128:4"),
}


# (model, run) -> the peak's bound where it is wider than PEAK_TOLERANCE, and why
WIDER = {
    ("llama", "1f1b:128:4:amp"): (0.03, "0.979 on the first stage: 1F1B's steady state under autocast holds "
                                        "about 43 KiB more in a weight gradient's mm than fusecli counts; "
                                        "GPipe and the last stage within 0.3%; cause not found"),
    ("gpt2", "1f1b:256:4:amp"): (0.08, "0.94-0.96: GPT-2's one-device peak under autocast reads 0.97 (DDP, "
                                       "seq 128 and 256, in an addmm's weight-gradient mm: about one "
                                       "(batch, seq, 4 hidden) bf16 tensor more than fusecli counts)"),
}


@functools.cache
def measured(model: str, kv_heads: int | None, layers: int, stages: int, data: str,
             runs: tuple[str, ...], out: str) -> dict:
    """run -> rank -> what torch_pipeline.py measured there."""
    replicate, shard, tp = DEGREES[data]
    args = ["--model", model, "--runs", ",".join(runs), "--batch", str(BATCH[stages]),
            "--layers", str(layers), "--replicas", str(replicate * shard), "--tp", str(tp)]
    args += ["--fsdp"] if shard > 1 else []
    args += ["--stages-per-rank", str(VIRTUAL)] if data == "v2" else []
    args += ["--kv-heads", str(kv_heads)] if kv_heads is not None else []
    return run_judge("torch_pipeline.py", args, out, stages * replicate * shard * tp)


@functools.cache
def _analysis(path: str, batch: int, seq: int, precision: str | None):
    return analyze(path, Options(batch=batch, dims={"seq": seq}, precision=precision))


def _cases():
    for (model, exporter, kv, layers, stages, data), runs in MODELS.items():
        for run in runs:
            yield pytest.param(model, exporter, kv, layers, stages, data, run,
                               id=f"{model}-{exporter}-{layers}layers-{stages}stages"
                                  f"{'-' + data if data else ''}-{run.replace(':', '-')}")


@pytest.mark.parametrize(("model", "exporter", "kv_heads", "layers", "stages", "data", "run"),
                         list(_cases()))
def test_each_stage_is_torchs(hf_onnx, tmp_path_factory, model, exporter, kv_heads, layers, stages, data,
                              run):
    runs = MODELS[model, exporter, kv_heads, layers, stages, data]
    folder = tmp_path_factory.getbasetemp() / f"pipeline-{model}-{exporter}-{layers}-{stages}-{data}"
    got = measured(model, kv_heads, layers, stages, data, runs, str(folder))[run.replace(":", "-")]
    replicate, shard, tp = DEGREES[data]
    world = stages * replicate * shard * tp
    assert sorted(got) == list(range(world))
    schedule, seq, microbatches, *flags = run.split(":")
    path = hf_onnx(model, exporter, attn="default", kv_heads=kv_heads, layers=layers,
                   cache=exporter == "torchscript")
    a = _analysis(path, BATCH[stages], int(seq),
                  "amp-bf16" if "amp" in flags else "bf16" if "bf16" in flags else None)
    layout = Layout(pp=stages, dp_replicate=replicate, dp_shard=shard, tp=tp,
                    zero=1 if "zero1" in flags else None,
                    reshard_after_forward="reshard" in flags or shard == 1,
                    microbatches=int(microbatches), pp_schedule=schedule)
    if data == "v2":
        layout = Layout(pp=stages, microbatches=int(microbatches), pp_schedule=schedule, virtual=VIRTUAL)
    chosen = block_candidates(a.graph, a.joint, a.liveness, a.sizes, rng_state_bytes(a)) if "ckpt" in flags \
        else None
    predicted = {r: e for e in rank_memory(a, layout, chosen=chosen) for r in e.ranks}
    assert sorted(predicted) == list(range(world))
    for rank, m in got.items():
        p = predicted[rank]
        print(f"{model} {exporter} {layers} blocks, {layout.name}, {run} rank {rank}: peak {p.peak_bytes} / "
              f"{m['peak_bytes']} = "
              f"{p.peak_bytes / m['peak_bytes']:.4f} ({p.peak_phase}; torch {m['peak_op']}), saved "
              f"{p.saved_activation_bytes / m['saved_bytes']:.4f}")
        if data == "v2":  # torch's own order of actions, and the (stage, microbatch) pairs in flight
            assert m["actions"] == [f"{x.chunk}{'F' if x.forward else 'B'}{x.microbatch}"
                                    for x in rank_actions(rank, stages, VIRTUAL, int(microbatches))]
            assert m["microbatches_in_flight_max"] == p.in_flight
        else:
            assert m["microbatches_in_flight_max"] == (int(microbatches) if schedule == "gpipe" else
                                                       min(stages - m["stage"], int(microbatches)))
        assert p.saved_activation_bytes == pytest.approx(m["saved_bytes"], rel=SAVED_TOLERANCE)
        bound = WIDER.get((model, run), (PEAK_TOLERANCE, ""))[0]
        assert p.peak_bytes == pytest.approx(m["peak_bytes"], rel=bound)
        if shard == 1:  # FSDP's buffers (its gathered parameters) are judged by the peak
            assert p.buffer_bytes == m["recv_buffer_bytes"] + m.get("ddp_bucket_bytes", 0)
        # the rotary inverse frequencies, a buffer torch keeps and the export writes as an initializer,
        # are the few bytes allowed
        for key in ("parameter_bytes", "gradient_bytes", "optimizer_bytes"):
            assert getattr(p, key) == pytest.approx(m[key], abs=256), key
