"""benchmarks/gpu_check.py, the script a GPU machine runs, dry-run here: both halves on the CPU at tiny
sizes through the same code (exports, fusecli's predictions, PyTorch's saved bytes, kernels and peak), so
that the one short run a GPU gets does not fail on a path no test took. Run once (module fixture)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("gpu_check")
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", "--out",
                           str(out)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads((out / "measured.json").read_text())["rows"]


def test_the_dry_run_predicts_measures_and_tabulates(dry_run):
    stdout, rows = dry_run
    assert {r["model"] for r in rows} == {"llama", "gpt2"}
    assert {r["precision"] for r in rows} == {"bf16", "fp32"}
    assert any(r["modules"] for r in rows) and any(not r["modules"] for r in rows)
    assert stdout.startswith("| model") and stdout.count("\n| ") == len(rows)  # header, a row per case
    for r in rows:
        assert r["kernels"] == r["measured_kernels"] == ["flash"], r
    for r in rows:  # the saved sets, checkpointed or not (bf16's with its blocks' casts), and fp32's peak
        assert r["saved_bytes"] == pytest.approx(r["measured_saved"], rel=0.02), r
        if r["precision"] == "fp32":
            assert r["peak_bytes"] == pytest.approx(r["measured_peak"], rel=0.02), r


@pytest.mark.xfail(strict=True, reason="issue 53 item 6: the peak under a bf16 model cast at a short "
                   "sequence, where the weights are much of the step, reads 0.87-0.93")
def test_bf16_peak_at_a_short_sequence(dry_run):
    _, rows = dry_run
    for r in rows:
        if r["precision"] == "bf16":
            assert r["peak_bytes"] == pytest.approx(r["measured_peak"], rel=0.02), r
