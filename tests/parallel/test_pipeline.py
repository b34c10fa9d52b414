"""Each stage's memory under pipeline parallelism against real torch.distributed ranks: fusecli's
``parallel.ranks`` with ``Layout(pp=2, ...)`` for the export of a tests/hf_models.py model (default
attention) against ``torch_pipeline.py`` run under ``torchrun`` on 2 gloo ranks, torch's own
``ScheduleGPipe`` and ``Schedule1F1B`` over 2 or 4 microbatches of a batch of 4.

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
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fusecli.parallel.layout import Layout
from fusecli.parallel.ranks import rank_memory
from fusecli.pipeline import Options, analyze

pytest.importorskip("torch")
pytest.importorskip("transformers")

HERE = Path(__file__).resolve().parent
BATCH = 4
WORLD = 2
SAVED_TOLERANCE = 0.02
PEAK_TOLERANCE = 0.02
# (model, exporter, kv_heads, layers) -> runs (SCHEDULE:SEQ:MICROBATCHES)
MODELS = {
    ("llama", "torchscript", 2, 2): ("gpipe:128:4", "1f1b:128:4", "1f1b:128:2"),
    ("llama", "dynamo", None, 4): ("gpipe:128:4", "1f1b:128:4", "1f1b:1024:2"),
    ("gpt2", "dynamo", None, 2): ("gpipe:128:4", "1f1b:128:4", "1f1b:256:2"),
    ("qwen2", "dynamo", None, 2): ("1f1b:128:4",),
}


@functools.cache
def measured(model: str, kv_heads: int | None, layers: int, runs: tuple[str, ...], out: str) -> dict:
    """run -> rank -> what torch_pipeline.py measured there."""
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
            str(HERE / "torch_pipeline.py"), "--model", model, "--runs", ",".join(runs),
            "--batch", str(BATCH), "--layers", str(layers), "--out", out]
    if kv_heads is not None:
        args += ["--kv-heads", str(kv_heads)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(args, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    results: dict[str, dict[int, dict]] = {}
    for path in Path(out).glob("*/rank_*.json"):
        m = json.loads(path.read_text())
        results.setdefault(path.parent.name, {})[m["rank"]] = m
    return results


@functools.cache
def _analysis(path: str, seq: int):
    return analyze(path, Options(batch=BATCH, dims={"seq": seq}))


def _cases():
    for (model, exporter, kv, layers), runs in MODELS.items():
        for run in runs:
            yield pytest.param(model, exporter, kv, layers, run,
                               id=f"{model}-{exporter}-{layers}layers-{run.replace(':', '-')}")


@pytest.mark.parametrize(("model", "exporter", "kv_heads", "layers", "run"), list(_cases()))
def test_each_stage_is_torchs(hf_onnx, tmp_path_factory, model, exporter, kv_heads, layers, run):
    runs = MODELS[model, exporter, kv_heads, layers]
    folder = tmp_path_factory.getbasetemp() / f"pipeline-{model}-{exporter}-{layers}"
    got = measured(model, kv_heads, layers, runs, str(folder))[run.replace(":", "-")]
    assert sorted(got) == list(range(WORLD))
    schedule, seq, microbatches = run.split(":")
    path = hf_onnx(model, exporter, attn="default", kv_heads=kv_heads, layers=layers,
                   cache=exporter == "torchscript")
    a = _analysis(path, int(seq))
    layout = Layout(pp=WORLD, microbatches=int(microbatches), pp_schedule=schedule)
    predicted = {r: e for e in rank_memory(a, layout) for r in e.ranks}
    assert sorted(predicted) == list(range(WORLD))
    for rank, m in got.items():
        p = predicted[rank]
        print(f"{model} {exporter} {run} stage {rank}: peak {p.peak_bytes} / {m['peak_bytes']} = "
              f"{p.peak_bytes / m['peak_bytes']:.4f} ({p.peak_phase}; torch {m['peak_op']}), saved "
              f"{p.saved_activation_bytes / m['saved_bytes']:.4f}")
        assert m["microbatches_in_flight_max"] == (int(microbatches) if schedule == "gpipe" else
                                                   min(WORLD - rank, int(microbatches)))
        assert p.saved_activation_bytes == pytest.approx(m["saved_bytes"], rel=SAVED_TOLERANCE)
        assert p.peak_bytes == pytest.approx(m["peak_bytes"], rel=PEAK_TOLERANCE)
        assert p.buffer_bytes == m["recv_buffer_bytes"]
        # the rotary inverse frequencies, a buffer torch keeps and the export writes as an initializer,
        # are the few bytes allowed
        for key in ("parameter_bytes", "gradient_bytes", "optimizer_bytes"):
            assert getattr(p, key) == pytest.approx(m[key], abs=256), key
