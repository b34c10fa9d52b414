"""``fusecli analyze`` and ``rewrite`` on graphs whose weights are Constant nodes (onnxscript's models).

Run ``python benchmarks/bench_constant_weights.py [--runs 5] [--quick]`` from the repository root; it
writes ``benchmarks/RESULTS-constant-weights.md`` (``--quick``: the small models only, to
``benchmarks/work/RESULTS-constant-weights-quick.md``).

Models: ``onnxscript.rewriter.models``' BART encoder, Whisper encoder and decoder, SmolLM (``_smollm_1``,
``_smollm_2``) and Phi-2, each built by its ``make_model_with_random_weights()`` (numpy seeded) and saved
by onnx_ir twice (``tests/load/onnxscript_models.py``): as built, every weight a Constant node and no
initializer, and with onnx_ir's LiftConstantsToInitializersPass applied. Files go to
``benchmarks/work/constant_weights/`` (git-ignored) and are built once.

Measured, on the Constant-node file, whole processes A/B interleaved, medians of ``--runs`` runs:
``fusecli analyze MODEL --json`` against ``python -c "import onnx; onnx.load(MODEL)"`` (time and peak
RSS, each child's own ``ru_maxrss``); and for SmolLM, ``fusecli rewrite MODEL -o OUT`` against
``fusecli analyze MODEL --json``, without verification, verified as by default (fused regions) and
with ``--verify model``. Checked once per model (recorded, not timed): the matches (pattern, nodes,
verdicts) on both files are the same, the backward graph of the Constant-node file is not empty, and
how many weights came from Constant nodes.
Benchmarks are not tests: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_analyze import ROOT, Sample, _met, _show, interleaved, machine_info, run_once

WORK = ROOT / "benchmarks" / "work" / "constant_weights"
ALL = ("bart_encoder", "whisper_encoder", "whisper_decoder", "smollm_1", "smollm_2", "phi2")
QUICK = ("bart_encoder", "whisper_encoder", "whisper_decoder")
REWRITE = ("smollm_1", "smollm_2")


def ensure(name: str) -> tuple[Path, Path]:
    """Build the two files of a model in their own process (the biggest holds GBs while it is made)."""
    code = ("import sys; from pathlib import Path; from tests.load.onnxscript_models import save; "
            "save(sys.argv[1], Path(sys.argv[2]))")
    subprocess.run([sys.executable, "-c", code, name, str(WORK)], check=True, cwd=ROOT)
    return WORK / f"{name}.constants.onnx", WORK / f"{name}.initializers.onnx"


def fusecli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fusecli", *args]


def analysis(path: Path) -> dict:
    out = subprocess.run(fusecli("analyze", str(path), "--json"), capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        raise RuntimeError(f"fusecli analyze {path.name} failed: {out.stderr.strip()[-300:]}")
    return json.loads(out.stdout)


def matches(doc: dict) -> list:
    return sorted((p["pattern"], tuple(p["nodes"]), p["inference_safe"], p["training_safe"])
                  for p in doc["patterns"])


# the same work timed inside the process, after the imports (``import onnx`` alone is most of a small
# model's whole-process time, for both commands)
_IN_PROCESS = {
    "analyze": "import sys, time; from fusecli.pipeline import analyze; "
               "from fusecli.report.document import to_json; t = time.perf_counter(); "
               "to_json(analyze(sys.argv[1])); print(time.perf_counter() - t)",
    "load": "import sys, time, onnx; t = time.perf_counter(); onnx.load(sys.argv[1]); "
            "print(time.perf_counter() - t)",
}


def in_process(path: Path, runs: int) -> tuple[float, float]:
    """Medians of the in-process seconds of analyze and of onnx.load, interleaved."""
    times: dict[str, list[float]] = {"analyze": [], "load": []}
    for _ in range(runs):
        for what, code in _IN_PROCESS.items():
            out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                                 cwd=ROOT, check=True)
            times[what].append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times["analyze"]), statistics.median(times["load"])


def fresh_output(a: list[str], b: list[str], runs: int, label: str, output: str) -> tuple[Sample, Sample]:
    """``interleaved``, the output of A removed before each of its runs (deleting the last run's
    hundreds of MiB is not part of a rewrite)."""
    sa, sb = Sample([]), Sample([])
    for i in range(runs):
        if os.path.exists(output):
            os.remove(output)
        sa.runs.append(run_once(a))
        sb.runs.append(run_once(b))
        print(f"  {label} run {i + 1}/{runs}: A {_show(sa.runs[-1])} | B {_show(sb.runs[-1])}",
              file=sys.stderr, flush=True)
        if not (sa.runs[-1].ok and sb.runs[-1].ok):
            break
    return sa, sb


def size_mib(path: Path) -> str:
    return f"{path.stat().st_size / 1024 ** 2:,.0f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs of each command (median taken)")
    ap.add_argument("--rewrite-runs", type=int, default=3, help="runs of the verified rewrite")
    ap.add_argument("--quick", action="store_true", help="the small models only, no rewrite")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or (ROOT / "benchmarks" / "work" / "RESULTS-constant-weights-quick.md" if args.quick
                       else ROOT / "benchmarks" / "RESULTS-constant-weights.md")
    names = QUICK if args.quick else ALL
    speed, checks, rewrites, notes = [], [], [], []
    for name in names:
        print(f"{name}: building (once)", file=sys.stderr, flush=True)
        constants, initializers = ensure(name)
        c, i = analysis(constants), analysis(initializers)
        same = matches(c) == matches(i)
        checks.append([name, str(c["forward"]["constant_weights"]), str(c["backward"]["nodes"]),
                       str(i["backward"]["nodes"]), str(len(c["patterns"])),
                       "yes" if same else "**no**"])
        if not same:
            notes.append(f"{name}: matches differ: {sorted(set(matches(c)) ^ set(matches(i)))[:4]}")
        print(f"{name} ({size_mib(constants)}): analyze vs onnx.load", file=sys.stderr, flush=True)
        load = [sys.executable, "-c", f"import onnx; onnx.load({str(constants)!r})"]
        a, b = interleaved(fusecli("analyze", str(constants), "--json"), load, args.runs, name)
        if not (a.ok and b.ok):
            speed.append([name, "failed", "", "", "", "", "", ""])
            notes.append(f"{name}: {a.error or b.error}")
            continue
        t, m = a.seconds / b.seconds, a.rss_mib / b.rss_mib
        ia, ib = in_process(constants, args.runs)
        inside = f"{ia:.3f} s / {ib:.3f} s = {ia / ib:.3f}x {_met(ia / ib, 0.2)}"
        speed.append([f"{name} ({size_mib(constants)})", f"{a.seconds:.2f} s", f"{b.seconds:.2f} s",
                      f"{t:.3f}x {_met(t, 0.2)}", inside,
                      f"{a.rss_mib:,.0f} MiB", f"{b.rss_mib:,.0f} MiB", f"{m:.3f}x {_met(m, 0.3)}"])
        if name in REWRITE and not args.quick:
            with tempfile.TemporaryDirectory(dir=WORK) as tmp:
                target = str(Path(tmp) / "out.onnx")
                analyze_cmd = fusecli("analyze", str(constants), "--json")
                print(f"{name}: rewrite --no-verify vs analyze", file=sys.stderr, flush=True)
                r, a2 = fresh_output(fusecli("rewrite", str(constants), "-o", target, "--no-verify"),
                                     analyze_cmd, args.runs, name, target)
                print(f"{name}: rewrite (verified, the default) vs analyze", file=sys.stderr, flush=True)
                v, a3 = fresh_output(fusecli("rewrite", str(constants), "-o", target), analyze_cmd,
                                     args.runs, name, target)
                print(f"{name}: rewrite --verify model vs analyze", file=sys.stderr, flush=True)
                w, a4 = fresh_output(fusecli("rewrite", str(constants), "-o", target, "--verify", "model"),
                                     analyze_cmd, args.rewrite_runs, name, target)
                done = subprocess.run(fusecli("rewrite", str(constants), "-o", target, "--json"),
                                      capture_output=True, text=True, cwd=ROOT)
                doc = json.loads(done.stdout) if done.returncode == 0 else {}
                kernels = ", ".join(f"{k} {n}" for k, n in doc.get("kernels", {}).items()) or "none"
                check = doc.get("verification") or {}
                regions = check.get("regions") or {}
                verified = (f"{check.get('ok')} ({regions.get('count')} regions, {regions.get('distinct')} "
                            f"distinct; whole model: {check.get('model_skipped') or 'run'})")
                for label, x, y in (("rewrite --no-verify", r, a2), ("rewrite, verified (default)", v, a3),
                                    ("rewrite --verify model", w, a4)):
                    ratio = x.seconds / y.seconds if x.ok and y.ok else float("nan")
                    rewrites.append([f"{name}: {label}", f"rewrites: {kernels}; verified: {verified}",
                                     f"{x.seconds:.2f} s" if x.ok else "failed",
                                     f"{y.seconds:.2f} s", f"{ratio:.2f}x {_met(ratio, 3.0)}",
                                     f"{x.rss_mib:,.0f} MiB"])
                for label, x in (("verified rewrite", v), ("rewrite --verify model", w)):
                    if not x.ok:  # a verification that fails exits 1
                        notes.append(f"{name}: {label} failed: {x.error}")
    lines = ["# fusecli on graphs whose weights are Constant nodes", "",
             "Written by `python benchmarks/bench_constant_weights.py`. Whole processes (interpreter start "
             f"included), medians of {args.runs} runs each, A/B interleaved; peak RSS is each process's own "
             "`ru_maxrss`. Models: onnxscript's `onnxscript.rewriter.models` graphs, "
             "`make_model_with_random_weights()`, saved by onnx_ir with every weight a Constant node "
             "(0 initializers).", "",
             "## analyze vs `onnx.load` of the same file (targets: <= 0.2x time, <= 0.3x peak memory)", "",
             "Whole processes (`fusecli analyze MODEL --json` and "
             "`python -c \"import onnx; onnx.load(MODEL)\"`), and the same work timed inside the process "
             "after its imports (analyze + the JSON document, "
             "and `onnx.load`): `import onnx` alone, which both commands pay, is most of a small model's "
             "whole-process time.", "",
             "| model | analyze | onnx.load | time ratio | in process: analyze / onnx.load | analyze RSS | "
             "onnx.load RSS | memory ratio |", "|---|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in speed]
    lines += ["", "## The same analysis as with initializers", "",
              "Constant-node file analyzed by default (`--constant-weights parameters`) against the same "
              "graph with its Constants of 16+ elements lifted to initializers.", "",
              "| model | weights from Constant nodes | backward nodes | backward nodes (initializers) | "
              "matches | same matches |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(r) + " |" for r in checks]
    if rewrites:
        lines += ["", "## rewrite vs analyze (target <= 3x)", "",
                  f"`fusecli rewrite MODEL -o OUT` against `fusecli analyze MODEL --json`, medians of "
                  f"{args.runs} (--no-verify, default) and {args.rewrite_runs} (--verify model) interleaved "
                  "runs; OUT is removed before each rewrite. The default verification runs each fused "
                  "region against the nodes it replaced in onnxruntime (reading only their weights), at "
                  "two optimization levels; `--verify model` runs the original and the rewritten model "
                  "whole, each at two levels (four sessions over every weight).", "",
                  "| rewrite | what it did | time | analyze | ratio | rewrite RSS |",
                  "|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(r) + " |" for r in rewrites]
    lines += ["", "## Machine", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in machine_info()]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    text = "\n".join(lines) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
