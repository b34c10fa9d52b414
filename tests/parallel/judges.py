"""Running a judge (torch_ranks.py, torch_pipeline.py) under ``torchrun`` and reading what its ranks wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_judge(script: str, args: list[str], out: str, world: int) -> dict[str, dict[int, dict]]:
    """run -> rank -> what ``script`` measured there, run on ``world`` gloo ranks (one thread each)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
               str(HERE / script), *args, "--out", out]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    results: dict[str, dict[int, dict]] = {}
    for path in Path(out).glob("*/rank_*.json"):
        m = json.loads(path.read_text())
        results.setdefault(path.parent.name, {})[m["rank"]] = m
    return results
