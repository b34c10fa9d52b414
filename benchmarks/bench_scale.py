"""``fusecli rewrite`` against ``fusecli analyze`` on 200k-node chains (issue: rewrite within 3x analyze).

Run ``python benchmarks/bench_scale.py [--nodes 200000] [--runs 3]`` from the repository root. Inputs are
built once under ``benchmarks/work/`` (git-ignored), by ``tests/rewrite/test_scale.py``'s builders:

- a unary chain (Relu, Sigmoid, Tanh, Neg, ...): nothing to fuse;
- a Conv 1x1 -> Relu chain sharing one weight: every pair becomes a FusedConv (100k regions).

Whole processes, A/B interleaved (``fusecli analyze MODEL --json`` | ``fusecli rewrite MODEL -o OUT``,
default verification), medians of ``--runs``; CPU seconds (user + system of the child) are the figure
on a shared machine, wall seconds beside them. Writes ``benchmarks/RESULTS-scale.md``. Benchmarks are not
tests: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_analyze import ROOT, WORK, built_once, interleaved, machine_info


def build(kind: str, nodes: int) -> Path:
    path = WORK / f"{kind}_chain_{nodes}.onnx"
    code = ("import sys, onnx; from tests.rewrite.test_scale import _plain_chain, _conv_chain; "
            "b = {'plain': _plain_chain, 'conv': _conv_chain}[sys.argv[1]]; "
            "onnx.save(b(int(sys.argv[2])), sys.argv[3])")
    return built_once(path, code, kind, str(nodes), str(path))


def verification_of(model: Path, out: Path) -> str:
    """What the default verification did on this model (one extra rewrite, not timed)."""
    done = subprocess.run([sys.executable, "-m", "fusecli", "rewrite", str(model), "-o", str(out), "--json"],
                          capture_output=True, text=True, cwd=ROOT)
    if done.returncode:
        return f"rewrite failed: {done.stderr.strip()[-200:]}"
    v = json.loads(done.stdout)["verification"]
    if v is None:
        return "not verified: nothing was rewritten"
    r = v["regions"]
    whole = "whole model run" if v["levels"] else f"whole model not run ({v['model_skipped']})"
    return f"{r['count']:,} regions ({r['distinct']} distinct) verified, ok={v['ok']}; {whole}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS-scale.md")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("plain", "conv"):
            model = build(kind, args.nodes)
            out = Path(tmp) / f"{kind}.onnx"
            analyze = [sys.executable, "-m", "fusecli", "analyze", str(model), "--json"]
            rewrite = [sys.executable, "-m", "fusecli", "rewrite", str(model), "-o", str(out)]
            a, r = interleaved(analyze, rewrite, args.runs, f"{kind} chain")
            if not (a.ok and r.ok):
                rows.append(f"| {kind} | failed: {a.error or r.error} | | | | |")
                continue
            rows.append(f"| {kind} chain, {args.nodes:,} nodes | {a.cpu_seconds:.1f} s ({a.seconds:.1f} s) "
                        f"| {r.cpu_seconds:.1f} s ({r.seconds:.1f} s) | {r.cpu_seconds / a.cpu_seconds:.2f}x "
                        f"({r.seconds / a.seconds:.2f}x) | {a.rss_mib:,.0f} / {r.rss_mib:,.0f} MiB "
                        f"| {verification_of(model, out)} |")
    lines = ["# fusecli rewrite vs analyze on long chains", "",
             f"Written by `python benchmarks/bench_scale.py --nodes {args.nodes} --runs {args.runs}`: whole "
             "processes, A/B interleaved, medians; CPU seconds of each process (wall in brackets). Target: "
             "rewrite (verified, the default) <= 3x analyze.", "",
             "| model | analyze CPU (wall) | rewrite CPU (wall) | ratio CPU (wall) "
             "| peak RSS analyze / rewrite | verification |",
             "|---|---|---|---|---|---|", *rows, "", "## Machine", "", "| | |", "|---|---|",
             *(f"| {k} | {v} |" for k, v in machine_info())]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
