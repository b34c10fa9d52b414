"""fusecli's per-rank memory against real torch.distributed ranks, beside DeepSpeed's and Megatron's
closed forms.

Per model (tests/hf_models.py, 2 layers, hidden 64, default attention, batch 2 per rank) and layout, the
ranks are measured by tests/parallel/torch_ranks.py under ``torchrun`` (2 gloo ranks, CPU) and fusecli
predicts them from the model's dynamo export (``parallel.ranks``). Beside them, for the same step:

- DeepSpeed's ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs``
  (no offload): ZeRO-1/2 ``4 P + 16 P / N``, ZeRO-3 ``4 L + 18 P / N`` (P parameters, L the largest
  module's own, N ranks): model states only, as its docs say;
- Megatron-LM's ``theoretical_memory_usage``: weights and optimizer ``18 P`` (distributed optimizer:
  ``(6 + 12 / N) P``) plus activations by Korthikanti et al. 2022, ``L s b h (34 + 5 a s / h)`` bytes
  for L layers (no recomputation, 16-bit activations).

    python benchmarks/bench_parallel.py [--models llama,gpt2] [--runs ddp:128,fsdp:128:bf16]
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

WORLD, BATCH = 2, 2
RUNS = ("ddp:128", "zero1:128", "fsdp:128", "fsdp:128:no-reshard", "fsdp:128:bf16", "fsdp:16",
        "fsdp:16:bf16")


def measure(model: str, runs: list[str], out: Path) -> dict:
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
            str(ROOT / "tests" / "parallel" / "torch_ranks.py"), "--model", model, "--runs", ",".join(runs),
            "--batch", str(BATCH), "--out", str(out)]
    subprocess.run(args, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return {p.parent.name: {**json.loads(p.read_text())} for p in out.glob("*/rank_0.json")}


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


def megatron(mode: str, seq: int, s: dict) -> int:
    p, n = s["P"], WORLD
    states = (6 + 12 / n) * p if mode in ("zero1", "fsdp") else 18 * p
    acts = s["layers"] * seq * BATCH * s["h"] * (34 + 5 * s["a"] * seq / s["h"])
    return int(states + acts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama,gpt2")
    ap.add_argument("--runs", default=",".join(RUNS))
    args = ap.parse_args()
    from fusecli.parallel.layout import Layout
    from fusecli.parallel.ranks import rank_memory
    from fusecli.pipeline import Options, analyze

    print("| model | layout | seq | rank 0 measured MiB | fusecli | ratio | DeepSpeed | ratio | Megatron "
          "| ratio |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            runs = args.runs.split(",")
            got = measure(model, runs, Path(tmp) / model)
            path = hf.export(model, str(Path(tmp) / f"{model}.onnx"), "dynamo", attn="default")
            s = shapes(model)
            for run in runs:
                mode, seq, *flags = run.split(":")
                m = got[run.replace(":", "-")]
                a = analyze(path, Options(batch=BATCH, dims={"seq": int(seq)},
                                          precision="bf16" if "bf16" in flags else None))
                reshard = "no-reshard" not in flags
                layout = Layout(dp_shard=WORLD, reshard_after_forward=reshard) if mode == "fsdp" else \
                    Layout(dp_replicate=WORLD, zero=1 if mode == "zero1" else None)
                f = next(e for e in rank_memory(a, layout) if 0 in e.ranks).peak_bytes
                ds, mg = deepspeed(mode, reshard, s), megatron(mode, int(seq), s)
                mib = m["peak_bytes"] / 2**20

                cells = [("-", "-") if v is None else (f"{v / 2**20:.3f}", f"{v / m['peak_bytes']:.2f}")
                         for v in (f, ds, mg)]
                print(f"| {model} | {layout.name}{' bf16' if 'bf16' in flags else ''} | {seq} | {mib:.3f} | "
                      + " | ".join(" | ".join(c) for c in cells) + " |")


if __name__ == "__main__":
    main()
