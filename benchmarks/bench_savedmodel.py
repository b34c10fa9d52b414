"""Whole-process ``fusecli analyze`` of Keras SavedModels against ``tf.saved_model.load`` of the same folder.

Run ``python benchmarks/bench_savedmodel.py [--runs 5] [--only NAME] [--out PATH]`` from the repository
root. The models are built once under ``benchmarks/work/savedmodel/`` (git-ignored): the Keras
applications ResNet-50, MobileNetV2, EfficientNetB0 and DenseNet-121 (weights=None, 64x64 inputs, 10
classes; Keras 3 by ``model.export``, Keras 2 (tf-keras) by ``tf.saved_model.save``), every one with a
dynamic batch, and the Keras 3 transformer encoder of ``tests/grad/keras_apps.py`` with a dynamic
sequence (``keras.Input((None, 64))``, 2 blocks, a GELU FFN), and that encoder (ReLU FFN) with a position
embedding read at ``arange(shape(x)[1])``: a Range that only TensorFlow's shape inference sizes.

Each row is ``analyze --json --batch 2`` (the encoders with ``--dim x_dim1=32``) and a process that
imports TensorFlow and calls ``tf.saved_model.load``, interleaved (A, B, A, B...: both share the
machine's noise), ``--runs`` of each; the ratio is taken per round, and the table gives the median times,
the median ratio and the ratios' range. ``TensorFlow`` says whether analyze imported TensorFlow (the
JSON's ``tensorflow.imported``). Benchmarks are not tests: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_analyze import ROOT, WORK, Run, machine_info, run_once  # noqa: E402

MODELS = WORK / "savedmodel"
SIZE = 64
APPS = [(pkg, app) for pkg in ("keras", "tf_keras")
        for app in ("ResNet50", "MobileNetV2", "EfficientNetB0", "DenseNet121")]
ENCODER = "keras_encoder_dynamic_seq"
POSITIONS = "keras_encoder_positions"  # the same with a position embedding read at arange(shape(x)[1])
BUILD = """
import importlib, os, shutil, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
name, path, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
tmp = path + ".tmp"
shutil.rmtree(tmp, ignore_errors=True)
if "encoder" in name:
    sys.path.insert(0, ".")
    from tests.grad.keras_apps import saved_encoder
    shutil.copytree(saved_encoder("gelu") if name.endswith("seq") else saved_encoder("relu", positions=True),
                    tmp)
else:
    pkg, app = name.split("_", 1) if not name.startswith("tf_keras") else ("tf_keras", name[9:])
    keras = importlib.import_module(pkg)
    keras.utils.set_random_seed(0)
    model = getattr(keras.applications, app)(weights=None, input_shape=(size, size, 3), classes=10)
    model.export(tmp, verbose=False) if pkg == "keras" else tf.saved_model.save(model, tmp)
os.replace(tmp, path)
"""
TF_LOAD = ("import os, sys; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'; import tensorflow as tf; "
           "tf.saved_model.load(sys.argv[1])")


def names() -> list[str]:
    return [f"{pkg}_{app}" for pkg, app in APPS] + [ENCODER, POSITIONS]


def built(name: str) -> Path:
    path = MODELS / name
    if not (path / "saved_model.pb").exists():
        MODELS.mkdir(parents=True, exist_ok=True)
        print(f"building {name} ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-c", BUILD, name, str(path), str(SIZE)], check=True, cwd=ROOT,
                       capture_output=True)
    return path


def analyze_cmd(name: str, path: Path, json_out: bool = True) -> list[str]:
    dims = ["--dim", "x_dim1=32"] if "encoder" in name else []
    return [sys.executable, "-m", "fusecli", "analyze", str(path), "--batch", "2", *dims,
            *(["--json"] if json_out else [])]


def imported_tensorflow(name: str, path: Path) -> str:
    done = subprocess.run(analyze_cmd(name, path), capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        return "failed"
    record = json.loads(done.stdout).get("tensorflow") or {}
    return f"yes ({len(record.get('sized', []))} tensors)" if record.get("imported") else "no"


def measure(name: str, runs: int) -> dict:
    path = built(name)
    ours: list[Run] = []
    theirs: list[Run] = []
    for i in range(runs):
        ours.append(run_once(analyze_cmd(name, path)))
        theirs.append(run_once([sys.executable, "-c", TF_LOAD, str(path)]))
        print(f"  {name} round {i + 1}/{runs}: analyze {ours[-1].seconds:.2f} s | tf.saved_model.load "
              f"{theirs[-1].seconds:.2f} s", file=sys.stderr, flush=True)
    ok = all(r.ok for r in ours + theirs)
    ratios = [a.seconds / b.seconds for a, b in zip(ours, theirs, strict=True)]
    return {"name": name, "ok": ok, "analyze": statistics.median(r.seconds for r in ours),
            "load": statistics.median(r.seconds for r in theirs), "ratio": statistics.median(ratios),
            "low": min(ratios), "high": max(ratios), "tensorflow": imported_tensorflow(name, path),
            "error": next((r.error for r in ours + theirs if not r.ok), "")}


def table(rows: list[dict], runs: int) -> str:
    lines = ["# SavedModels: fusecli analyze against tf.saved_model.load", "",
             f"`python benchmarks/bench_savedmodel.py --runs {runs}`, "
             f"{datetime.date.today().isoformat()}: whole processes, interleaved, medians of {runs}; the "
             "ratio is per round (median, and its range). Keras applications at 64x64 (weights=None, 10 "
             "classes, dynamic batch), `analyze --json --batch 2`; the encoders with `--dim x_dim1=32`.", "",
             *(f"- {k}: {v}" for k, v in machine_info()), "",
             "| model | analyze s | tf.saved_model.load s | ratio | ratio range | TensorFlow imported |",
             "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        if not r["ok"]:
            lines.append(f"| {r['name']} | failed: {r['error']} | | | | |")
            continue
        lines.append(f"| {r['name']} | {r['analyze']:.2f} | {r['load']:.2f} | {r['ratio']:.3f}x | "
                     f"{r['low']:.3f}-{r['high']:.3f}x | {r['tensorflow']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", action="append", help="a model name (repeatable): " + ", ".join(names()))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS-savedmodel.md"))
    args = ap.parse_args()
    rows = [measure(n, args.runs) for n in (args.only or names())]
    text = table(rows, args.runs)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
