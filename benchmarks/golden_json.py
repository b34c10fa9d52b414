"""Behaviour-preserving changes, checked: `analyze --json`, its report and `rewrite --json`, before and after.

A refactor or a speed-up must not change what fusecli says. This builds the corpus once under
``benchmarks/work/corpus/`` (git-ignored; ``FUSECLI_CORPUS`` names another folder, e.g. one that
worktrees share): the shipped samples, the test corpus's ``transformers`` models
(``tests/hf_models.py``: every architecture with its default attention by both torch exporters, the text
models with eager attention too), the Keras SavedModels the tests build (``tests/grad/keras_apps.py``), and
the synthetic residual graph of ``bench_analyze.py``. Then it records every command's stdout and exit code:

    python benchmarks/golden_json.py build
    python benchmarks/golden_json.py record OUT_DIR [--only SUBSTRING]
    python benchmarks/golden_json.py compare BEFORE_DIR AFTER_DIR [--subset]

``compare`` lists the outputs that differ (first differing line of each) and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("FUSECLI_CORPUS", ROOT / "benchmarks" / "work" / "corpus"))
SIZED = ["--batch", "2", "--dim", "seq=32"]  # the text models' sized run (a dim the model lacks is refused)


def _names() -> list[tuple[str, str, str]]:
    sys.path.insert(0, str(ROOT))
    from tests import hf_models as hf

    every = (hf.ALL + hf.MORE_TEXT + hf.MOE + hf.SHAPE_READS + hf.GQA + hf.REWRITE_TEXT + hf.MORE_VISION)
    out = [(n, "default", e) for n in every for e in ("torchscript", "dynamo")]
    out += [(n, "eager", "torchscript") for n in hf.TEXT]
    return out


def build() -> None:
    CORPUS.mkdir(parents=True, exist_ok=True)
    for f in sorted((ROOT / "samples").glob("*.onnx")):
        shutil.copy(f, CORPUS / f.name)
    jobs = []
    for name, attn, exporter in _names():
        path = CORPUS / f"{name}_{attn}_{exporter}.onnx"
        if not path.exists():
            jobs.append((name, attn, exporter, path))
    code = ("import sys; sys.path.insert(0, '.'); from tests import hf_models as hf; "
            "n, a, e, p = sys.argv[1:]; hf.export(n, p + '.tmp', exporter=e, attn=a); "
            "import os; os.replace(p + '.tmp', p)")

    def one(job):
        name, attn, exporter, path = job
        done = subprocess.run([sys.executable, "-c", code, name, attn, exporter, str(path)], cwd=ROOT,
                              capture_output=True, text=True)
        status = "ok" if done.returncode == 0 else f"FAILED {done.stderr.strip()[-300:]}"
        print(f"{path.name}: {status}", flush=True)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(one, jobs))
    keras = ("import sys, shutil; sys.path.insert(0, '.'); from tests.grad import keras_apps as k; "
             "out = sys.argv[1]; "
             "[shutil.copytree(k.saved_app(n), f'{out}/{n}') for n in k.APPS]; "
             "shutil.copytree(k.saved_encoder('gelu'), f'{out}/keras3_encoder_gelu_dynamic'); "
             "shutil.copytree(k.saved_encoder('relu', seq=32), f'{out}/keras3_encoder_relu_32')")
    if not (CORPUS / "keras3_encoder_relu_32").exists():
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-c", keras, tmp], cwd=ROOT, check=True)
            for d in Path(tmp).iterdir():
                shutil.copytree(d, CORPUS / d.name, dirs_exist_ok=True)
    synth = ROOT / "benchmarks" / "work" / "residual_50k.onnx"
    if synth.exists():
        shutil.copy(synth, CORPUS / synth.name)


def _commands(model: Path, out_dir: Path) -> list[tuple[str, list[str]]]:
    m = str(model)
    cmds = [("analyze", ["analyze", m, "--json"])]
    if "input_ids" in _inputs(model) or "encoder" in model.name:
        cmds.append(("analyze_sized", ["analyze", m, "--json", *SIZED]))
    if "residual_50k" not in model.name:
        cmds.append(("analyze_cuda", ["analyze", m, "--json", "--device", "cuda"]))
        cmds.append(("report", ["analyze", m, "--verbose"]))
        cmds.append(("rewrite", ["rewrite", m, "-o", str(out_dir / f"{model.stem}.fused.onnx"), "--json"]))
    return cmds


def _inputs(model: Path) -> str:
    if model.is_dir():
        return ""
    import onnx

    try:
        return " ".join(i.name for i in onnx.load(str(model), load_external_data=False).graph.input)
    except Exception:
        return ""


def record(out: Path, only: str | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    models = sorted(p for p in CORPUS.iterdir() if p.suffix == ".onnx" or p.is_dir())
    models = [m for m in models if not only or only in m.name]
    jobs = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in models:
            for tag, args in _commands(m, Path(tmp)):
                jobs.append((m, tag, args))

        def one(job):
            m, tag, args = job
            done = subprocess.run([sys.executable, "-m", "fusecli", *args], cwd=ROOT, capture_output=True,
                                  text=True, env={**os.environ, "COLUMNS": "100"})
            stdout = done.stdout.replace(tmp, "$OUT")  # rewrite's output path: a fresh folder each run
            (out / f"{m.stem}.{tag}.json").write_text(f"exit {done.returncode}\n{stdout}")

        with ThreadPoolExecutor(2) as pool:
            list(pool.map(one, jobs))
    print(f"{len(jobs)} outputs of {len(models)} models in {out}")


def compare(before: Path, after: Path, subset: bool) -> int:
    names = {p.name for p in after.iterdir()}
    names = sorted(names if subset else names | {p.name for p in before.iterdir()})
    bad = 0
    for n in names:
        a, b = before / n, after / n
        if not a.exists() or not b.exists():
            print(f"{n}: only in {'after' if not a.exists() else 'before'}")
            bad += 1
            continue
        x, y = (re.sub(r"/tmp/tmp\w+", "$OUT", p.read_text()).splitlines() for p in (a, b))
        if x != y:
            first = next(iter(difflib.unified_diff(x, y, lineterm="", n=0)), "")
            diff = [d for d in difflib.unified_diff(x, y, lineterm="", n=0)][2:6]
            print(f"{n}: differs {first and ''}" + " | ".join(d[:160] for d in diff))
            bad += 1
    print(f"{len(names) - bad} of {len(names)} identical")
    return 1 if bad else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build")
    r = sub.add_parser("record")
    r.add_argument("out", type=Path)
    r.add_argument("--only")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--subset", action="store_true", help="compare only the outputs AFTER holds")
    args = ap.parse_args()
    if args.cmd == "build":
        build()
    elif args.cmd == "record":
        record(args.out, args.only)
    else:
        sys.exit(compare(args.before, args.after, args.subset))


if __name__ == "__main__":
    main()
