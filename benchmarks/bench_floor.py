"""The floor under ``fusecli analyze --json`` on the 100k-node chain: what any analysis that keeps the graph
as Python objects pays before its first rule runs.

Run ``python benchmarks/bench_floor.py [--runs 3] [--nodes 100000]`` from the repository root (the chain is
``bench_scale.synthetic``'s, built once under ``benchmarks/work/``). Each piece is a whole process, every
piece once per round, medians and spreads (min-max) of wall seconds and peak RSS:

- imports: what an ONNX analysis imports (fusecli's pipeline, onnx, numpy), timed inside the process;
- ONNX's shape inference: ``onnx.load`` and ``onnx.shape_inference.infer_shapes`` with data propagation
  (C++; fusecli's "shape inference" stage is this call);
- the graph as objects: one ``ir.Tensor`` per value and one ``ir.Node`` per node with producer and consumer
  links, nothing else (no attributes, shapes or kinds), from names already read;
- a backward of the same size: one node and one gradient tensor per forward input, nothing else;
- the JSON document: fusecli's own ``analyze --json`` output for the chain, held as Python objects and
  encoded compact by ``output.json_pieces`` (json's C encoder), the encoding timed;
- ``fusecli analyze --json --batch 2`` itself, for comparison.

Writes ``benchmarks/RESULTS-floor.md``. Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_analyze import ROOT, machine_info
from bench_scale import child_env, synthetic

IMPORTS = """
start = time.perf_counter()
import fusecli.pipeline, fusecli.load.onnx, onnx, numpy
"""
SHAPES = """
import onnx, onnx.shape_inference
m = onnx.load(MODEL)
start = time.perf_counter()
onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
"""
OBJECTS = """
import gc, onnx
from fusecli.core.ir import Node, Tensor
gc.disable()  # as fusecli's gc_paused
raw = [(n.name, n.op_type, list(n.input), list(n.output)) for n in onnx.load(MODEL).graph.node]
start = time.perf_counter()
tensors = {}
def tensor(name):
    t = tensors.get(name)
    if t is None:
        t = tensors[name] = Tensor(name)
    return t
nodes = []
for name, op, ins, outs in raw:
    node = Node(name, op, op, [tensor(x) for x in ins], [tensor(x) for x in outs])
    for t in node.inputs:
        t.consumers.append(node)
    for t in node.outputs:
        t.producer = node
    nodes.append(node)
if BACKWARD:
    start = time.perf_counter()
    grads = []
    for node in reversed(nodes):
        grads.append(Node("gradients/" + node.name, node.op_type + "Grad", "grad",
                          [Tensor("grad/" + node.outputs[0].name), *node.inputs],
                          [Tensor("grad/" + t.name) for t in node.inputs]))
"""
ENCODE = """
import gc, json
from fusecli.core.output import json_pieces
gc.disable()
doc = json.load(open(DOC))
start = time.perf_counter()
size = sum(len(p) for p in json_pieces(doc))
"""


# the child's own peak RSS, read where it ends (wait4's figure can carry another process's peak)
PEAK = "import re; peak = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]) / 1024"


def piece(code: str, **names) -> list[str]:
    """A child process running ``code`` that prints the seconds since its ``start`` and its peak RSS."""
    head = "import time\n" + "".join(f"{k} = {v!r}\n" for k, v in names.items())
    return [sys.executable, "-c", head + code + f"\nseconds = time.perf_counter() - start\n{PEAK}\n"
            "print(seconds, peak)\n"]


def run(cmd: list[str]) -> tuple[float, float]:
    """Seconds and peak RSS in MiB: the child's own figures when it prints them, else wall and wait4's."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT,
                            env=child_env(), text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd[:3])}")
    if cmd[1] == "-c":
        seconds, peak = out.strip().splitlines()[-1].split()
        return float(seconds), float(peak)
    return wall, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS-floor.md")
    args = ap.parse_args()
    model = str(synthetic(args.nodes))
    with tempfile.TemporaryDirectory() as tmp:
        doc = str(Path(tmp) / "analysis.json")
        with open(doc, "w") as f:  # the document the encoding piece re-encodes
            subprocess.run([sys.executable, "-m", "fusecli", "analyze", model, "--json", "--batch", "2"],
                           stdout=f, cwd=ROOT, check=True)
        pieces = {
            "imports": piece(IMPORTS),
            "ONNX shape inference (C++)": piece(SHAPES, MODEL=model),
            "the graph as objects": piece(OBJECTS, MODEL=model, BACKWARD=False),
            "a backward of the same size": piece(OBJECTS, MODEL=model, BACKWARD=True),
            "the JSON document, encoded": piece(ENCODE, DOC=doc),
            "fusecli analyze --json --batch 2": [sys.executable, "-m", "fusecli", "analyze", model, "--json",
                                                 "--batch", "2"],
        }
        got: dict[str, list[tuple[float, float]]] = {k: [] for k in pieces}
        for _ in range(args.runs):
            for name, cmd in pieces.items():
                got[name].append(run(cmd))
        json_mib = os.path.getsize(doc) / 2**20

    def spread(xs: list[float], fmt: str) -> str:
        return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"

    rows = [f"| {name} | {spread([s for s, _ in v], '{:.2f}')} | {spread([r for _, r in v], '{:,.0f}')} |"
            for name, v in got.items()]
    floor = sum(statistics.median(s for s, _ in got[k]) for k in list(pieces)[:-1])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip() or "?"
    how = f"python benchmarks/bench_floor.py --nodes {args.nodes} --runs {args.runs}"
    lines = ["# The floor under a 100k-node analysis", "",
             f"Written by `{how}` at commit {commit}: the {args.nodes:,}-node residual chain, "
             f"{json_mib:,.0f} MiB of `analyze --json`. Each piece a whole process, rounds interleaved, "
             "medians (min-max). Seconds are the timed part of each piece (the whole process for "
             "fusecli); peak RSS is the whole process's.",
             "", "| piece | seconds | peak RSS MiB |", "|---|---|---|", *rows, "",
             f"The pieces before fusecli's own line sum to {floor:.2f} s: the time an analysis that holds "
             "the graph and its backward as Python objects and writes this document spends before any rule, "
             "pattern or liveness sweep runs.", "", "## Machine", "", "| | |", "|---|---|",
             *(f"| {k} | {v} |" for k, v in machine_info())]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
