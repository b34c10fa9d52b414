"""``fusecli render`` on 80-layer decoders (issue 27: folded views draw <= 150 boxes in <= 10 s).

Run ``python benchmarks/bench_render.py [--models gpt2 llama] [--layers 80]`` from the repository root.
Each model (tests/hf_models.py, hidden 64, transformers' default attention, random weights) is exported
once under ``benchmarks/work/`` (git-ignored) by both torch exporters. For ``--view after`` and
``--view fused-training``: one whole process ``fusecli render MODEL --view V -o OUT.svg`` (analysis,
DOT, Graphviz layout) timed wall-clock, the boxes it draws, whether the SVG says "x80"; then
``--unfold --dot`` (no layout: thousands of boxes) and whether every layer is drawn. Writes
``benchmarks/RESULTS-render.md``. Benchmarks are not tests: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from bench_analyze import ROOT, WORK, built_once

EXPORTERS = ("torchscript", "dynamo")
VIEWS = ("after", "fused-training")
SIZES = ("--batch", "2", "--dim", "seq=16")
# Llama with one K/V head per query head: the TorchScript exporter has no sdpa with enable_gqa
KV_HEADS = {"llama": 2}


def export(name: str, exporter: str, layers: int) -> Path:
    path = WORK / f"{name}_{exporter}_{layers}layers.onnx"
    code = (f"import sys; from tests import hf_models; KV_HEADS = {KV_HEADS!r}; "
            "hf_models.export(sys.argv[1], sys.argv[2], sys.argv[3], True, attn='default', "
            "layers=int(sys.argv[4]), kv_heads=KV_HEADS.get(sys.argv[1]))")
    return built_once(path, code, name, str(path), exporter, str(layers), quiet=True)


def render(model: Path, view: str, *args: str) -> tuple[float, int, str]:
    """Wall seconds of one whole process, the boxes it says it drew, and what it wrote."""
    out = WORK / f"{model.stem}.{view}.{'dot' if '--dot' in args else 'svg'}"
    cmd = [sys.executable, "-m", "fusecli", "render", str(model), "--view", view, *SIZES, *args]
    cmd += [] if "--dot" in args else ["-o", str(out)]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True)
    seconds = time.perf_counter() - start
    text = done.stdout if "--dot" in args else out.read_text()
    m = re.search(r"\((?:\S+) view, (\d+) nodes", done.stderr)
    boxes = int(m.group(1)) if m else len(re.findall(r"^\tn\d+ \[", text, re.M))
    return seconds, boxes, text


def every_layer(text: str, layers: int, model: Path) -> bool:
    """The unfolded DOT draws an op of every layer (names '/h.K/' or dynamo's module paths)."""
    from fusecli.core.scopes import node_scope
    from fusecli.pipeline import Options, analyze

    a = analyze(str(model), Options(batch=2))
    seen = set()
    for n in a.graph.nodes:
        scope = node_scope(n)
        index = next((s.split(".")[1] for s in scope if re.fullmatch(r"(h|layers)\.\d+", s)), None)
        if index is not None and re.search(r'tooltip="?' + re.escape(n.name) + r'"?[ \]]', text):
            seen.add(int(index))
    return seen == set(range(layers))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["gpt2"])
    ap.add_argument("--layers", type=int, default=80)
    args = ap.parse_args()
    rows = []
    for name in args.models:
        for exporter in EXPORTERS:
            model = export(name, exporter, args.layers)
            for view in VIEWS:
                seconds, boxes, svg = render(model, view)
                _, unfolded, dot = render(model, view, "--unfold", "--dot")
                row = (f"| {name} ({exporter}) | {view} | {boxes} | {seconds:.1f} | "
                       f"{'yes' if f'x{args.layers} ' in svg else 'no'} | {unfolded} | "
                       f"{'yes' if every_layer(dot, args.layers, model) else 'no'} |")
                print(row, flush=True)
                rows.append(row)
    head = ["| model | view | boxes (default) | seconds (whole process, with dot -Tsvg) | "
            f"x{args.layers} drawn | boxes (--unfold) | --unfold draws every layer |",
            "|---|---|---:|---:|---|---:|---|"]
    (ROOT / "benchmarks" / "RESULTS-render.md").write_text(
        f"# fusecli render: {args.layers}-layer decoders, folded\n\n`python benchmarks/bench_render.py "
        f"--models {' '.join(args.models)} --layers {args.layers}`\n\n" + "\n".join(head + rows) + "\n")


if __name__ == "__main__":
    main()
