"""fusecli's CUDA predictions against PyTorch on CUDA, from one prepared script.

Two halves, so that the GPU machine (minutes of time, no network) runs PyTorch only:

    python benchmarks/gpu_check.py predict --out DIR    # here: exports, fusecli --device cuda: predicted.json
    python benchmarks/gpu_check.py measure --out DIR    # there: PyTorch on CUDA: measured.json, the table
    python benchmarks/gpu_check.py --dry-run --out DIR  # both halves on the CPU at tiny sizes, same code

Per model (tests/hf_models.py's small configs with their default attention: Llama with grouped-query
attention, Qwen2, GPT-2, BERT, ViT), precision (bf16 model cast, amp-bf16 autocast, fp32), sequence (1024
and 4096; the learned-position models at their 256 positions; ViT at its one image size) and batch 2:
the sdpa kernel fusecli predicts and the one PyTorch runs (the profiler's op names), what autograd saves
(``saved_tensors_hooks``, distinct storages that are no parameter, buffer or input) and the step's peak
(CUDA: ``torch.cuda.reset_peak_memory_stats`` and ``max_memory_allocated`` less the bytes allocated before
the step; CPU: ``hf_models.peak_memory``); then every block checkpointed (fusecli's block candidates, the
same submodules under ``torch.utils.checkpoint``), the same two figures. Selective checkpointing policies
are not modelled yet: no row for them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = ("llama", "qwen2", "gpt2", "bert", "vit")
PRECISIONS = ("bf16", "amp-bf16", "fp32")
SEQS = (1024, 4096)
LEARNED = {"gpt2": 256, "bert": 256}  # position tables: their longest
BATCH = 2
KERNELS = {"flash": "_scaled_dot_product_flash_attention", "efficient": "_efficient_attention",
           "cudnn": "_scaled_dot_product_cudnn_attention", "math": "_scaled_dot_product_attention_math"}


def cases(dry: bool) -> list[dict]:
    from tests import hf_models as hf

    models = ("llama", "gpt2") if dry else MODELS
    out = []
    for name in models:
        seqs = (None,) if hf.spec(name).inputs[0] == "pixel_values" else \
            (16,) if dry else sorted({min(s, LEARNED.get(name, s)) for s in SEQS})
        for precision in (("bf16", "fp32") if dry else PRECISIONS):
            for seq in seqs:
                for checkpointed in (False, True):
                    out.append({"model": name, "precision": precision, "seq": seq,
                                "checkpointed": checkpointed})
    return out


def predict(out: Path, dry: bool) -> None:
    """fusecli's figures for every case, at ``--device cuda`` (``cpu`` for a dry run)."""
    from fusecli.core.dims import Poly
    from fusecli.pipeline import Options, analyze
    from fusecli.plan.candidates import block_candidates
    from fusecli.plan.planner import StepModel
    from tests import hf_models as hf

    device = "cpu" if dry else "cuda"
    rows, exports = [], {}
    for case in cases(dry):
        name = case["model"]
        if name not in exports:
            exports[name] = hf.export(name, str(out / f"{name}.onnx"), "dynamo", attn="default",
                                      cache=False)
        dims = {} if case["seq"] is None else {"seq": case["seq"]}
        a = analyze(exports[name], Options(batch=BATCH, dims=dims, device=device,
                                           precision=case["precision"]))
        kernels = sorted({k["kernel"] for k in a.joint.meta.get("attention_kernels", {}).values()})
        row = {**case, "kernels": kernels, "saved_bytes": a.liveness.saved_activation_bytes,
               "peak_bytes": a.liveness.peak_bytes, "modules": []}
        if case["checkpointed"]:  # every block: the step model's lifetimes with each block re-run
            blocks = block_candidates(a.graph, a.joint, a.liveness, a.sizes)
            step = StepModel(a.joint, a.liveness, a.sizes, Poly())
            row.update(modules=[c.name for c in blocks], peak_bytes=step.peak_bytes(blocks),
                       saved_bytes=step.saved(blocks).evaluate(a.sizes) or 0)
        rows.append(row)
    (out / "predicted.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))


def measure(out: Path, dry: bool) -> None:
    """PyTorch's figures for every predicted case, on CUDA (the CPU for a dry run)."""
    import torch

    from tests import hf_models as hf

    predicted = json.loads((out / "predicted.json").read_text())
    cuda = not dry
    if cuda and not torch.cuda.is_available():
        sys.exit("measure: no CUDA device (use --dry-run on a CPU)")
    device = torch.device("cuda" if cuda else "cpu")
    rows = []
    for row in predicted["rows"]:
        started = time.time()
        model = hf.build(row["model"], attn="default", cache=False)
        args = hf.example_inputs(row["model"], BATCH, row["seq"] or 16)
        model, args = hf.at_precision(model, args, row["precision"])
        model, args = model.to(device), tuple(a.to(device) for a in args)
        held = []
        for path in row["modules"]:
            sub = model.get_submodule("inner." + path.removeprefix("inner."))
            forward = sub.forward
            sub.forward = (lambda f: lambda *a, **k: torch.utils.checkpoint.checkpoint(
                f, *a, use_reentrant=False, **k))(forward)
            held.append(sub)
        autocast = torch.autocast(device.type, torch.bfloat16) if row["precision"] == "amp-bf16" else \
            torch.autocast(device.type, enabled=False)
        with autocast:
            saved = sum(b for _, _, b in hf.saved_storages(model, args, held_by=held))
        kernels = _kernels(model, args, autocast)
        if cuda:
            for p in model.parameters():
                p.grad = None
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            with autocast:
                loss = model(*args).float().sum()
            loss.backward()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base + _resident(model, args)
            name = torch.cuda.get_device_name()
        else:
            with autocast:
                peak = hf.peak_memory(model, args)["peak"]
            name = "cpu"
        rows.append({**row, "measured_kernels": kernels, "measured_saved": saved, "measured_peak": peak,
                     "device_name": name, "seconds": round(time.time() - started, 1)})
        del model
        if cuda:
            torch.cuda.empty_cache()
    (out / "measured.json").write_text(json.dumps({"rows": rows}, indent=1))
    print(table(rows))


def _resident(model, args) -> int:
    """Parameters, buffers and inputs: allocated before the step, as fusecli's peak counts them."""
    seen = {}
    for t in (*model.parameters(), *model.buffers(), *args):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _kernels(model, args, autocast) -> list[str]:
    """The sdpa kernels one forward runs, by the aten ops the profiler records."""
    from torch.profiler import profile

    with profile() as prof, autocast:
        model(*args)
    names = {e.name for e in prof.events()}
    return sorted(k for k, op in KERNELS.items() if any(op in n for n in names))


def table(rows: list[dict]) -> str:
    lines = ["| model | precision | seq | checkpointed | kernel fusecli / PyTorch | saved ratio | peak ratio "
             "|", "|---|---|---:|---|---|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['precision']} | {r['seq'] or '-'} | "
                     f"{'yes' if r['modules'] else 'no'}"
                     f" | {','.join(r['kernels']) or '-'} / {','.join(r['measured_kernels']) or '-'}"
                     f" | {r['saved_bytes'] / max(r['measured_saved'], 1):.3f}"
                     f" | {r['peak_bytes'] / max(r['measured_peak'], 1):.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("half", nargs="?", choices=["predict", "measure"], default=None)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--dry-run", action="store_true", help="both halves on the CPU at tiny sizes")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dry_run or args.half == "predict":
        predict(args.out, args.dry_run)
    if args.dry_run or args.half == "measure":
        measure(args.out, args.dry_run)


if __name__ == "__main__":
    main()
