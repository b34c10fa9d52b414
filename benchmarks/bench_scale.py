"""Analysis at LLM scale: ``fusecli analyze`` on growing graphs, and ``fusecli rewrite`` against it.

Run ``python benchmarks/bench_scale.py [--runs 3] [--nodes 200000] [--skip-rewrite]`` from the repository
root. Inputs are built once under ``benchmarks/work/`` (git-ignored).

Scaling: ``fusecli analyze MODEL --json`` (decoders: ``--batch 2 --dim seq=128``) as whole processes, every
model once per round, rounds interleaved; medians with their spread (min-max), CPU and wall seconds and
peak RSS, and a per-stage table from the same runs (``FUSECLI_STAGE_TIMES``: each stage's seconds on
stderr), with fusecli's bytecode cached as after ``pip install`` (``child_env``). Models: synthetic
Conv-BN-Relu residual chains of 25k/50k/100k/200k nodes (``bench_analyze.build_synthetic``) and
80-layer decoders (Llama with 2 K/V heads, GPT-2; hidden 64, default attention) by both PyTorch exporters
(``tests/hf_models.export``).

Rewrite vs analyze on 200k-node chains (issue: rewrite within 3x analyze), by
``tests/rewrite/test_scale.py``'s builders:

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
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_analyze import ROOT, WORK, built_once, interleaved, machine_info

SYNTH_NODES = (25_000, 50_000, 100_000, 200_000)
DECODERS = (("llama", "torchscript"), ("llama", "dynamo"), ("gpt2", "torchscript"), ("gpt2", "dynamo"))
DECODER_LAYERS = 80
STAGE_LINE = re.compile(r"^fusecli stage: (.+): ([0-9.]+) s \(cpu ([0-9.]+) s\)$")


def build(kind: str, nodes: int) -> Path:
    path = WORK / f"{kind}_chain_{nodes}.onnx"
    code = ("import sys, onnx; from tests.rewrite.test_scale import _plain_chain, _conv_chain; "
            "b = {'plain': _plain_chain, 'conv': _conv_chain}[sys.argv[1]]; "
            "onnx.save(b(int(sys.argv[2])), sys.argv[3])")
    return built_once(path, code, kind, str(nodes), str(path))


def synthetic(nodes: int) -> Path:
    path = WORK / f"residual_{nodes // 1000}k.onnx"
    code = ("import sys; from pathlib import Path; sys.path.insert(0, 'benchmarks'); "
            "from bench_analyze import build_synthetic; build_synthetic(Path(sys.argv[1]), int(sys.argv[2]))")
    return built_once(path, code, str(path), str(nodes))


def decoder(name: str, exporter: str) -> Path:
    path = WORK / f"{name}_{exporter}_{DECODER_LAYERS}layers.onnx"
    code = ("import sys; from tests import hf_models as hf; n, e, p = sys.argv[1:4]; "
            "hf.export(n, p, exporter=e, attn='default', layers=int(sys.argv[4]), "
            "**({'kv_heads': 2} if n == 'llama' else {}))")
    return built_once(path, code, name, exporter, str(path), str(DECODER_LAYERS), quiet=True)


def child_env() -> dict[str, str]:
    """The measured processes' environment: stage times on, and fusecli's bytecode cached as an installed
    fusecli has it (pip compiles it at install; ``PYTHONDONTWRITEBYTECODE``, set on some machines, would
    make every process compile fusecli's ~80 modules again: about 0.1 s each time)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["FUSECLI_STAGE_TIMES"] = "1"
    return env


def timed_run(cmd: list[str]) -> dict:
    """One whole process with stage times: wall and CPU seconds, peak RSS (MiB), stage -> (wall, cpu)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT,
                            env=child_env(), text=True)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    stages = {}
    for line in err.splitlines():
        m = STAGE_LINE.match(line)
        if m:
            stages[m[1]] = (float(m[2]), float(m[3]))
    return {"ok": os.waitstatus_to_exitcode(status) == 0, "wall": time.perf_counter() - start,
            "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss / 1024, "stages": stages,
            "error": err.strip().splitlines()[-1][:200] if err.strip() else ""}


def _spread(xs: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def scaling(runs: int) -> list[str]:
    """The scaling tables: every model once per round, ``runs`` rounds."""
    models = [(f"residual chain, {n:,} nodes", synthetic(n), []) for n in SYNTH_NODES]
    for name, exporter in DECODERS:
        try:
            path = decoder(name, exporter)
        except subprocess.CalledProcessError:
            print(f"  {name} by {exporter}: export failed, left out", file=sys.stderr)
            continue
        models.append((f"{name} {DECODER_LAYERS} layers, {exporter}", path, ["--dim", "seq=128"]))
    results: dict[str, list[dict]] = {label: [] for label, _, _ in models}
    for _, path, dims in models[len(SYNTH_NODES):]:  # warm-up, not timed: fusecli's bytecode is written
        timed_run([sys.executable, "-m", "fusecli", "analyze", str(path), "--json", "--batch", "2", *dims])
    for i in range(runs):
        for label, path, dims in models:
            cmd = [sys.executable, "-m", "fusecli", "analyze", str(path), "--json", "--batch", "2", *dims]
            r = timed_run(cmd)
            results[label].append(r)
            failed = "" if r["ok"] else " FAILED " + r["error"]
            print(f"  round {i + 1}/{runs} {label}: {r['cpu']:.2f} s cpu {r['wall']:.2f} s wall "
                  f"{r['rss']:.0f} MiB{failed}", file=sys.stderr, flush=True)
    rows, stage_rows, names = [], [], []
    for label, rs in results.items():
        ok = [r for r in rs if r["ok"]]
        if not ok:
            rows.append(f"| {label} | failed: {rs[0]['error']} | | |")
            continue
        rows.append(f"| {label} | {_spread([r['cpu'] for r in ok])} | {_spread([r['wall'] for r in ok])} "
                    f"| {_spread([r['rss'] for r in ok], '{:,.0f}')} |")
        for stage in ok[0]["stages"]:
            if stage not in names:
                names.append(stage)
        cells = [f"{statistics.median(r['stages'].get(s, (0, 0))[1] for r in ok):.2f}" for s in names]
        stage_rows.append((label, cells))
    stage_table = [f"| model | {' | '.join(names)} |", "|---|" + "---|" * len(names),
                   *(f"| {label} | {' | '.join(cells + [''] * (len(names) - len(cells)))} |"
                     for label, cells in stage_rows)]
    return ["## Scaling: `fusecli analyze`", "",
            f"Whole processes, {runs} rounds (every model once per round, after one untimed run of each "
            "decoder); median (min-max). fusecli's bytecode cached, as an installed fusecli has it "
            "(`PYTHONDONTWRITEBYTECODE` unset for the runs). Synthetic chains: `--batch 2`; decoders: "
            "`--batch 2 --dim seq=128`.", "",
            "| model | CPU s | wall s | peak RSS MiB |", "|---|---|---|---|", *rows, "",
            "### Stages (median CPU seconds, from `FUSECLI_STAGE_TIMES` of the same runs)", "",
            "Time before the first stage (imports) and after the last (the JSON document) is in the totals "
            "above, not here.", "", *stage_table, ""]


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
    ap.add_argument("--skip-rewrite", action="store_true", help="only the scaling tables")
    ap.add_argument("--skip-scaling", action="store_true", help="only rewrite vs analyze")
    args = ap.parse_args()
    scaled = [] if args.skip_scaling else scaling(args.runs)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in () if args.skip_rewrite else ("plain", "conv"):
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
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip() or "?"
    rewrite = [] if args.skip_rewrite else [
        "## fusecli rewrite vs analyze on long chains", "",
        f"Whole processes, A/B interleaved, medians of {args.runs}; CPU seconds of each process (wall in "
        "brackets). Target: rewrite (verified, the default) <= 3x analyze.", "",
        "| model | analyze CPU (wall) | rewrite CPU (wall) | ratio CPU (wall) "
        "| peak RSS analyze / rewrite | verification |",
        "|---|---|---|---|---|---|", *rows, ""]
    lines = ["# fusecli at scale", "",
             f"Written by `python benchmarks/bench_scale.py --nodes {args.nodes} --runs {args.runs}"
             f"{' --skip-rewrite' if args.skip_rewrite else ''}` at commit {commit}.", "",
             *scaled, *rewrite, "## Machine", "", "| | |", "|---|---|",
             *(f"| {k} | {v} |" for k, v in machine_info())]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
