"""fusecli's per-rank memory against real torch.distributed ranks, beside DeepSpeed's and Megatron's
closed forms.

Per model (tests/hf_models.py, 2 layers, hidden 64, default attention, batch 2 per rank) and layout, the
ranks are measured by tests/parallel/torch_ranks.py under ``torchrun`` (2 gloo ranks, CPU) and fusecli
predicts them from the model's dynamo export (``parallel.ranks``). Beside them, for the same step:

- DeepSpeed's ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs``
  (no offload): ZeRO-1/2 ``4 P + 16 P / N``, ZeRO-3 ``4 L + 18 P / N`` (P parameters, L the largest
  module's own, N ranks): model states only, as its docs say;
- Megatron-LM's ``theoretical_memory_usage``: weights and optimizer ``18 P`` (distributed optimizer:
  ``(6 + 12 / N) P``; tensor or pipeline parallel: ``18 P / t``, ``18 P / p``) plus activations by
  Korthikanti et al. 2022 for L layers (no recomputation, 16-bit activations): ``s b h (34 + 5 a s / h)``
  per layer, ``s b h (10 + 24 / t + 5 a s / (h t))`` under tensor parallelism, ``s b h (34 + 5 a s / h) / t``
  with sequence parallelism; under a pipeline, the first stage's L / p layers times the microbatches it
  holds (``min(p, m)`` under 1F1B, ``m`` under GPipe), at the microbatch's b.

Runs: ``MODE:SEQ[:flags]`` of tests/parallel/torch_ranks.py (``tp:128:sp``: tensor and sequence parallel,
which needs ``--kv-heads 2``), and ``pp:SCHEDULE:SEQ:MICROBATCHES`` of tests/parallel/torch_pipeline.py
(batch 4 through 2 stages).

    python benchmarks/bench_parallel.py [--models llama,gpt2] [--runs ddp:128,fsdp:128:bf16,pp:1f1b:128:4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests import hf_models as hf  # noqa: E402

WORLD, BATCH, PIPELINE_BATCH = 2, 2, 4
RUNS = ("ddp:128", "zero1:128", "fsdp:128", "fsdp:128:no-reshard", "fsdp:128:bf16", "fsdp:16",
        "fsdp:16:bf16")


def measure(model: str, runs: list[str], out: Path, kv_heads: int | None) -> dict:
    """run -> rank -> what the judges measured (torch_ranks.py; torch_pipeline.py for pp: runs)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    found: dict = {}
    for judge, mine, batch in (("torch_ranks.py", [r for r in runs if not r.startswith("pp:")], BATCH),
                               ("torch_pipeline.py", [r[3:] for r in runs if r.startswith("pp:")],
                                PIPELINE_BATCH)):
        if not mine:
            continue
        args = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
                str(ROOT / "tests" / "parallel" / judge), "--model", model, "--runs", ",".join(mine),
                "--batch", str(batch), "--out", str(out / judge)]
        args += ["--kv-heads", str(kv_heads)] if kv_heads else []
        subprocess.run(args, check=True, capture_output=True, env=env)
        prefix = "pp-" if judge == "torch_pipeline.py" else ""
        for p in (out / judge).glob("*/rank_*.json"):
            m = json.loads(p.read_text())
            found.setdefault(prefix + p.parent.name, {})[m["rank"]] = m
    return found


def shapes(model: str) -> dict:
    m = hf.build(model, attn="default")
    params = sum(dict((p.data_ptr(), p.numel()) for p in m.parameters()).values())
    largest = max(sum(p.numel() for p in mod.parameters(recurse=False)) for mod in m.modules())
    c = m.inner.config
    return {"P": params, "L": largest, "layers": c.num_hidden_layers, "h": c.hidden_size,
            "a": c.num_attention_heads}


def deepspeed(mode: str, reshard: bool, s: dict) -> int | None:
    p, n = s["P"], WORLD
    if mode in ("zero1",) or (mode == "fsdp" and not reshard):
        return 4 * p + 16 * p // n
    if mode == "fsdp":
        return 4 * s["L"] + 18 * p // n
    return None


def megatron(mode: str, seq: int, s: dict, flags: list[str]) -> int:
    """Megatron's first rank (the module docstring's forms)."""
    p, n, h, a = s["P"], WORLD, s["h"], s["a"]
    layer = seq * BATCH * h * (34 + 5 * a * seq / h)
    if mode == "pp":
        schedule, m = flags[0], int(flags[1])
        held = m if schedule == "gpipe" else min(WORLD, m)
        micro = seq * (PIPELINE_BATCH // m) * h * (34 + 5 * a * seq / h)
        return int(18 * p / n + s["layers"] / n * held * micro)
    if mode == "tp":
        per = layer / n if "sp" in flags else seq * BATCH * h * (10 + 24 / n + 5 * a * seq / (h * n))
        return int(18 * p / n + s["layers"] * per)
    states = (6 + 12 / n) * p if mode in ("zero1", "fsdp") else 18 * p
    return int(states + s["layers"] * layer)


def layout_of(mode: str, flags: list[str]):
    from fusecli.parallel.layout import Layout

    if mode == "pp":
        return Layout(pp=WORLD, microbatches=int(flags[1]), pp_schedule=flags[0])
    if mode == "tp":
        return Layout(tp=WORLD, sp="sp" in flags)
    if mode == "fsdp":
        return Layout(dp_shard=WORLD, reshard_after_forward="no-reshard" not in flags)
    return Layout(dp_replicate=WORLD, zero=1 if mode == "zero1" else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama,gpt2")
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--kv-heads", type=int, default=None, help="hf_models.build's kv_heads (tp: 2)")
    args = ap.parse_args()
    from fusecli.parallel.ranks import rank_memory
    from fusecli.pipeline import Options, analyze

    print("| model | layout | seq | rank | measured MiB | fusecli | ratio | DeepSpeed | ratio | Megatron "
          "| ratio |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            runs = args.runs.split(",")
            got = measure(model, runs, Path(tmp) / model, args.kv_heads)
            # the pipeline's stages make no cache (torch_pipeline.py), the other judges' models do
            paths = {cache: hf.export(model, str(Path(tmp) / f"{model}-{cache}.onnx"), "dynamo",
                                      attn="default", kv_heads=args.kv_heads, cache=cache)
                     for cache in (True, False)}
            s = shapes(model)
            for run in runs:
                mode, *rest = run.split(":")
                if mode == "pp":
                    flags, seq = [rest[0], rest[2]], rest[1]
                else:
                    seq, *flags = rest
                a = analyze(paths[mode != "pp"], Options(batch=PIPELINE_BATCH if mode == "pp" else BATCH,
                                                        dims={"seq": int(seq)},
                                                        precision="bf16" if "bf16" in flags else None))
                layout = layout_of(mode, flags)
                predicted = {r: e for e in rank_memory(a, layout) for r in e.ranks}
                ds, mg = deepspeed(mode, "no-reshard" not in flags, s), megatron(mode, int(seq), s, flags)
                for rank, m in sorted(got[run.replace(":", "-")].items()):
                    if rank and mode != "pp":
                        continue  # the data-parallel ranks: rank 0 stands for them (test_ranks: every rank)
                    cells = [("-", "-") if v is None else (f"{v / 2**20:.3f}", f"{v / m['peak_bytes']:.2f}")
                             for v in (predicted[rank].peak_bytes, ds if not rank else None,
                                       mg if not rank else None)]
                    name = layout.name + (" bf16" if "bf16" in flags else "")
                    print(f"| {model} | {name} | {seq} | {rank} | {m['peak_bytes'] / 2**20:.3f} | "
                          + " | ".join(" | ".join(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
