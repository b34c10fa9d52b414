"""Fused-kernel counts of ``fusecli rewrite`` vs the optimizers users run, on the whole small-model corpus.

    python benchmarks/bench_counts.py [--out benchmarks/RESULTS-counts.md] [--no-keras]

Models: every architecture of tests/hf_models.py and of benchmarks/trial_exports.py (2 layers, hidden 64,
from `transformers` configs, random weights, their DEFAULT attention; mixture-of-experts models with
transformers' eager experts, rewritten with --routing balanced) exported by both torch exporters
(TorchScript, dynamo; dynamic batch and sequence), and Keras 3 MobileNetV2, MobileNetV3Small and
EfficientNetV2B0 (weights=None) exported as SavedModels and converted by tf2onnx (what ``fusecli
rewrite`` does with a SavedModel folder). Peers and the way fused kernels are counted:
benchmarks/peers.py. fusecli's rewrite verifies itself (relative L2 <= 1e-4 at ORT_DISABLE_ALL and
default); a model it cannot rewrite is reported with the reason.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import peers  # noqa: E402

from fusecli.rewrite import RewriteOptions, rewrite  # noqa: E402

# ORT transformers optimizer model type and (heads, hidden) per architecture (0, 0: detect)
TYPES = {"bert": "bert", "distilbert": "bert", "gpt2": "gpt2", "vit": "vit", "clip_vision": "clip",
         "t5_encoder": "t5", "swin": "swin", "bart": "bart", "phi3": "phi"}
MOE = ("mixtral", "qwen2_moe", "olmoe")
KERAS = ("MobileNetV2", "MobileNetV3Small", "EfficientNetV2B0")


def _count(label: str, path: str, model_type: str, heads: int, hidden: int, dims: dict) -> dict:
    original = onnx.load(path)
    row = {"model": label}
    try:
        routing = "balanced" if label.split(" ")[0] in MOE else None
        r = rewrite(path, RewriteOptions(batch=dims.get("batch", 1), dims=dims, routing=routing))
        row["fusecli"] = peers.fused(r.model, original)
        row["error"] = max(r.verification.worst("disabled"), r.verification.worst("default"))
        emitted = sum(a.pattern == "attention" for a in r.applied)
        declined = [w.removeprefix("not rewritten: ") for w in r.warnings
                    if w.startswith("not rewritten: attention at")]
        row["attention"] = f"{emitted} of {emitted + len(declined)}" + (
            f" ({' '.join(declined[0].split())[:90]})" if declined else "")
        if r.verification.model_skipped:
            row["note"] = f"whole model not run: {r.verification.model_skipped[:80]}"
    except Exception as e:  # reported, not hidden
        row["fusecli"] = f"failed: {' '.join(str(e).split())[:80]}"
    row["ORT EXTENDED"] = peers.fused(peers.ort_extended(path, path + ".ort.onnx"), original)
    for name, make in (("ORT transformers", lambda: peers.ort_transformers(path, model_type, heads, hidden)),
                       ("onnxscript", lambda: peers.onnxscript_ort(path))):
        try:
            row[name] = peers.fused(make(), original)
        except Exception as e:
            row[name] = f"failed: {type(e).__name__}"
    print(label, {k: (sum(v.values()) if not isinstance(v, (str, float)) else v) for k, v in row.items()},
          flush=True)
    return row


def hf_rows(work: Path) -> list[dict]:
    from tests import hf_models

    rows = []
    names = hf_models.ALL + hf_models.MORE_TEXT + hf_models.MORE_VISION + hf_models.MOE
    for exporter in ("torchscript", "dynamo"):
        for name in names:
            path = str(work / f"{name}_{exporter}.onnx")
            try:
                hf_models.export(name, path, exporter, True, 2, 16, attn="default")
            except Exception as e:
                failed = f"export failed: {type(e).__name__}"
                rows.append({"model": f"{name} ({exporter})", "fusecli": failed})
                continue
            dims = {"batch": 2, "seq": 16} if hf_models.spec(name).seq_axis else {"batch": 2}
            rows.append(_count(f"{name} ({exporter})", path, TYPES.get(name, "bert"), 2, 64, dims))
    return rows


def trial_rows(work: Path) -> list[dict]:
    import trial_exports

    rows = []
    for name in trial_exports.ARCHS:
        model, _ = trial_exports.build(name)
        for exporter in ("torchscript", "dynamo"):
            path = str(work / f"trial_{name}_{exporter}.onnx")
            try:
                trial_exports.export(model, path, exporter)
            except Exception as e:
                failed = f"export failed: {type(e).__name__}"
                rows.append({"model": f"{name} ({exporter})", "fusecli": failed})
                continue
            dims = {"batch": trial_exports.BATCH, "seq": trial_exports.SEQ}
            rows.append(_count(f"{name} ({exporter})", path, TYPES.get(name, "bert"), 2, 64, dims))
    return rows


def keras_rows(work: Path) -> list[dict]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras

    from fusecli.rewrite.source import convert_savedmodel

    rows = []
    for name in KERAS:
        folder = work / name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            getattr(keras.applications, name)(weights=None, input_shape=(224, 224, 3)).export(str(folder),
                                                                                             verbose=False)
        path = str(work / f"{name}.onnx")
        onnx.save(convert_savedmodel(str(folder)), path)
        rows.append(_count(f"Keras {name} (tf2onnx)", path, "bert", 0, 0, {}))
    return rows


def table(rows: list[dict]) -> str:
    cols = ("fusecli", "ORT EXTENDED", "ORT transformers", "onnxscript")
    lines = ["| model | " + " | ".join(cols) + " | fusecli >= best | attention emitted |",
             "|---|" + "---:|" * len(cols) + "---|---|"]

    def cell(v):
        if v is None:
            return "n/a"
        if isinstance(v, str):
            return v
        return f"{sum(v.values())}" + (" (" + ", ".join(f"{k} {n}" for k, n in sorted(v.items())) + ")"
                                       if v else "")

    for r in rows:
        mine = r.get("fusecli")
        best = max((sum(r[c].values()) for c in cols[1:] if isinstance(r.get(c), dict)), default=0)
        ok = "yes" if isinstance(mine, dict) and sum(mine.values()) >= best else "**no**"
        if isinstance(mine, str) and mine.startswith("export failed"):
            ok = "n/a"  # the exporter's own refusal: nothing to rewrite
        lines.append(f"| {r['model']} | " + " | ".join(cell(r.get(c)) for c in cols)
                     + f" | {ok} | {r.get('attention', 'n/a')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS-counts.md"))
    ap.add_argument("--no-keras", action="store_true", help="skip the TensorFlow / tf2onnx models")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-counts-") as tmp:
        rows = hf_rows(Path(tmp)) + trial_rows(Path(tmp)) + ([] if args.no_keras else keras_rows(Path(tmp)))
    md = table(rows)
    worst = max((r["error"] for r in rows if "error" in r), default=0.0)
    about = __doc__.split("\n\n", 2)[2].strip()
    text = (f"# fusecli rewrite: fused kernels on the small-model corpus\n\n"
            f"`python benchmarks/bench_counts.py{' --no-keras' if args.no_keras else ''}`\n\n{about}\n\n"
            f"{md}\n\nEvery fusecli output above verified; largest relative L2 error {worst:.2g}. Keras "
            "applications with weights=None end in a near-uniform softmax, so their verification says little "
            "about the convs; tests/rewrite/kernels/test_layout.py and graph/test_fold_scales.py check those "
            "folds on graphs with signal.\n")
    Path(args.out).write_text(text)
    print(md)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
