"""fusecli's saved bytes at the precisions users train with, against PyTorch's saved_tensors_hooks.

Per model (tests/hf_models.py: 2 layers, hidden 64, random weights, default attention), batch 2, seq 32
(vision models at their one image size), PyTorch measured on CPU for three steps of the same model: fp32,
under ``torch.autocast("cpu", torch.bfloat16)`` (amp-bf16) and cast with ``model.to(torch.bfloat16)``
(bf16). fusecli analyzes (1) the fp32 exports, as exported and with ``--precision amp-bf16`` and
``--precision bf16``, and (2) the dynamo exports traced at each precision, as exported. Exports go to
``benchmarks/work/precision/`` (git-ignored) and are reused. A failed export is a row saying why
(TorchScript cannot trace a bf16 or autocast model in torch 2.13, nor sdpa with enable_gqa).

    python benchmarks/bench_precision.py [--models gpt2,llama] [--out benchmarks/RESULTS-precision.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests import hf_models as hf  # noqa: E402

WORK = ROOT / "benchmarks" / "work" / "precision"
MODELS = ("gpt2", "llama", "qwen2", "mistral", "gemma", "gpt_neox", "opt", "bert", "roberta", "bart", "vit",
          "olmo")
PRECISIONS = ("fp32", "amp-bf16", "bf16")
BATCH, SEQ = 2, 32


def fusecli_saved(path: Path, name: str, precision: str | None) -> int | str:
    dims = ["--batch", str(BATCH)] + (["--dim", f"seq={SEQ}"] if hf.spec(name).seq_axis else [])
    extra = ["--precision", precision] if precision else []
    r = subprocess.run([sys.executable, "-m", "fusecli", "analyze", str(path), "--json", *dims, *extra],
                       capture_output=True, text=True)
    if r.returncode:
        return r.stderr.strip().splitlines()[-1][:100]
    return json.loads(r.stdout)["memory"]["saved_activation_bytes"]


def export(name: str, exporter: str, precision: str) -> Path | str:
    path = WORK / f"{name}_{exporter}_{precision}.onnx"
    if not path.exists():
        try:
            hf.export(name, str(path), exporter, attn="default", precision=precision)
        except Exception as e:  # noqa: BLE001 - the row says why
            return f"export failed: {str(e).splitlines()[0][:80]}"
    return path


def ratio(got, want) -> str:
    return f"{got:,} ({got / want:.3f})" if isinstance(got, int) else str(got)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS-precision.md"))
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    WORK.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models.split(","):
        torch_bytes = {p: hf.pytorch_saved_at(name, p, BATCH, SEQ) for p in PRECISIONS}
        for exporter in ("torchscript", "dynamo"):
            path = export(name, exporter, "fp32")
            for p in PRECISIONS:
                got = path if isinstance(path, str) else fusecli_saved(path, name, None if p == "fp32" else p)
                rows.append((name, f"{exporter} fp32", "as exported" if p == "fp32" else f"--precision {p}",
                             torch_bytes[p], got))
        for p in PRECISIONS[1:]:
            path = export(name, "dynamo", p)
            got = path if isinstance(path, str) else fusecli_saved(path, name, None)
            rows.append((name, f"dynamo {p}", "as exported", torch_bytes[p], got))
        print(*rows[-8:], sep="\n", flush=True)
    lines = ["# Saved bytes at a precision: fusecli against PyTorch", "",
             f"`python benchmarks/bench_precision.py` (batch {BATCH}, seq {SEQ}, CPU; bytes of saved "
             "activations, fusecli's over PyTorch's in parentheses).", "",
             "| model | export | analyzed | PyTorch | fusecli |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {e} | {a} | {w:,} | {ratio(g, w)} |" for n, e, a, w, g in rows]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
