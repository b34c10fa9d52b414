"""fusecli's predicted training-step peak against what eager PyTorch allocates.

Per model (tests/hf_models.py: 2 layers, hidden 64, random weights, its DEFAULT attention), per torch exporter
and per sequence length: fusecli analyzes the export (dynamic batch and seq, exported once under
``benchmarks/work/peak/``, git-ignored, and reused) at ``--batch 2 --dim seq=S`` and its ``peak_bytes`` and
``saved_activation_bytes`` are set against PyTorch's, measured on CPU in fp32 with the model in eval(), loss
``sum(output)``: ``hf_models.pytorch_peak_bytes`` (the profiler's allocation events, parameters, buffers and
inputs resident) and ``hf_models.pytorch_saved_bytes`` (saved_tensors_hooks). Vision models have no seq
axis: one row per exporter at their one image size. Mixture-of-experts models are analyzed with
``--routing balanced`` (PyTorch routes seed 0's random tokens).

Models with learned position tables (GPT-2, BERT, BART: 256 positions in tests/hf_models.py) cannot run a
longer sequence; when a seq above 256 is asked for, every model's position table is raised to the largest
seq asked for, in the export and in PyTorch alike (the export's file name says ``_posN``). A failed export or
analysis is a row saying why (torch 2.13: llama_gqa's TorchScript export, sdpa with enable_gqa; mixtral's
dynamo export, a guard on the experts' data-dependent token counts).

    python benchmarks/bench_peak.py [--models gpt2,bert] [--seqs 128,1024] [--exporters torchscript,dynamo]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests import hf_models as hf  # noqa: E402

WORK = ROOT / "benchmarks" / "work" / "peak"
MODELS = ("gpt2", "llama_gqa", "bert", "bart", "vit", "mixtral")
EXPORTERS = ("torchscript", "dynamo")
SEQS = (128, 1024)
BATCH = 2
TABLE = 256  # the position tables of tests/hf_models.py's configs


@contextlib.contextmanager
def positions(n: int | None):
    """hf_models' configs with position tables of ``n`` entries (None: as they are)."""
    if n is None or n <= TABLE:
        yield
        return
    original = hf._config

    def config(name):
        c = original(name)
        if getattr(c, "max_position_embeddings", None) is not None:  # GPT-2's n_positions via attribute_map
            c.max_position_embeddings = max(c.max_position_embeddings, n)
        return c

    hf._config = config
    try:
        yield
    finally:
        hf._config = original


FAILED: dict[Path, str] = {}  # export -> why it failed


class Failed(Exception):
    """An export or an analysis that did not complete, and why."""


def export(name: str, exporter: str, table: int | None) -> Path:
    """The export's path under WORK, made once (in a child process: torch's exporters print much, and a
    failure's last line is the reason); ``Failed`` says why an export failed, once per file."""
    suffix = f"_pos{table}" if table is not None and table > TABLE else ""
    path = WORK / f"{name}_default_{exporter}{suffix}.onnx"
    if path in FAILED:
        raise Failed(FAILED[path])
    if not path.exists():
        WORK.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.onnx")
        t = time.perf_counter()
        code = ("import sys; sys.path.insert(0, 'benchmarks'); import bench_peak as b; "
                "n, e, t, p = sys.argv[1:]; b.export_here(n, e, int(t) or None, p)")
        done = subprocess.run([sys.executable, "-c", code, name, exporter, str(table or 0), str(tmp)],
                              cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in done.stderr.splitlines() if ln.strip()]
            raised = [ln for ln in lines if re.match(r"[\w.]*(Error|Exception|Node): ", ln)]  # cause first
            FAILED[path] = f"export: {(raised[:1] or lines[-1:] or [f'exit {done.returncode}'])[0]}"
            raise Failed(FAILED[path])
        os.replace(tmp, path)
        print(f"exported {path.name} in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    return path


def export_here(name: str, exporter: str, table: int | None, path: str) -> None:
    with positions(table):
        hf.export(name, path, exporter=exporter, attn="default")


def fusecli(path: Path, name: str, seq: int | None) -> dict:
    args = [sys.executable, "-m", "fusecli", "analyze", str(path), "--json", "--batch", str(BATCH)]
    if seq is not None:
        args += ["--dim", f"seq={seq}"]
    if name in hf.MOE:
        args += ["--routing", "balanced"]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise Failed(f"fusecli exit {done.returncode}: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout)["memory"]


@functools.cache
def pytorch(name: str, seq: int, table: int | None) -> tuple[dict, int]:
    with positions(table):
        peak = hf.pytorch_peak_bytes(name, BATCH, seq, attn="default")
        saved = hf.pytorch_saved_bytes(name, BATCH, seq, attn="default")
    return peak, saved


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.3f}"


def ratio(a: int | None, b: int | None) -> str:
    return "-" if a is None or not b else f"{a / b:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated hf_models names")
    ap.add_argument("--seqs", default=",".join(map(str, SEQS)), help="comma-separated sequence lengths")
    ap.add_argument("--exporters", default=",".join(EXPORTERS), help="torchscript,dynamo")
    opts = ap.parse_args()
    models = [m for m in opts.models.split(",") if m]
    seqs = [int(s) for s in opts.seqs.split(",") if s]
    exporters = [e for e in opts.exporters.split(",") if e]
    table = max(seqs) if max(seqs) > TABLE else None
    print("| model | exporter | seq | fusecli peak MiB | PyTorch peak MiB | ratio | fusecli saved MiB "
          "| PyTorch saved MiB | ratio | PyTorch peak at |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in models:
        text = hf.spec(name).seq_axis
        for exporter in exporters:
            for seq in seqs if text else [None]:
                row = f"| {name} | {exporter} | {seq if text else '-'} |"
                try:
                    path = export(name, exporter, table if text else None)
                    ours = fusecli(path, name, seq)
                    peak, saved = pytorch(name, seq if text else 16, table if text else None)
                except Exception as e:  # one failing export or analysis does not end the table
                    why = str(e).splitlines()[0][:200]
                    why = why if isinstance(e, Failed) else f"{type(e).__name__}: {why}"
                    print(f"{row} failed: {why} |||||||", flush=True)
                    continue
                flag = "*" if ours["incomplete"] else ""
                our_peak, our_saved = ours["peak_bytes"], ours["saved_activation_bytes"]
                print(f"{row} {mib(our_peak)}{flag} | {mib(peak['peak'])} | {ratio(our_peak, peak['peak'])} "
                      f"| {mib(our_saved)}{flag} | {mib(saved)} | {ratio(our_saved, saved)} "
                      f"| {peak['peak_op']} |", flush=True)
    print("\n`*`: fusecli left a tensor of unknown size out of the total (JSON memory.incomplete).")


if __name__ == "__main__":
    main()
