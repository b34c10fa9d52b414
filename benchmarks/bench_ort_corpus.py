"""fusecli's rewrite against ONNX Runtime's transformers optimizer, graph by graph (issue 42's corpus).

    python benchmarks/bench_ort_corpus.py [--exports all|none|bert:torchscript,...] [--only SUBSTR]
                                          [--out benchmarks/RESULTS-ort-corpus.md]

The corpus: the hand-built graphs of the kind ONNX Runtime's transformers optimizer is tested with, made by
the public builders of fusecli's tests (imported, not copied; called with the defaults and the variants the
tests parametrize), plus transformers exports of small configs (tests/hf_models.py: 2 layers, hidden 64,
2 heads; attn "default"; TorchScript and dynamo exporters where they export).

Per graph:
- ORT: ``onnxruntime.transformers.optimizer.optimize_model`` (benchmarks/peers.py ``ort_transformers``,
  opt_level 0, CPU) with each model type the case lists (heads / hidden from the builder's constants or the
  config); the model type whose optimized model runs and has the most fused kernels is kept ("ORT's best").
  Its fused kernels are counted by ``peers.fused``; "ORT runs" = that model loads and runs in onnxruntime
  (CPU); its outputs are compared with the original's on the same random inputs (integer inputs drawn
  from {0, 1}; relative L2 > 1e-3: flagged, ORT fused wrongly, and measured again with every integer input
  1, to tell a mask read differently from a wrong computation).
- fusecli: ``rewrite`` (verification on, CPU target), the written file loaded in onnxruntime and run on the
  same inputs (compared with the original too); its fused kernels counted by the same ``peers.fused``.
- Verdict: for every kernel family ORT wrote (FAMILY below), fusecli wrote at least as many: "fusecli >= ORT";
  else the families fusecli misses, with fusecli's 'not rewritten' lines.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import peers  # noqa: E402

from fusecli.core.errors import FuseError  # noqa: E402
from fusecli.rewrite import RewriteOptions, rewrite  # noqa: E402
from tests import transformer_graphs as tg  # noqa: E402
from tests.fusion import models as fm  # noqa: E402
from tests.rewrite import test_peer_graphs as pg  # noqa: E402
from tests.rewrite.graph.test_edit import gpt2_embedding  # noqa: E402
from tests.rewrite.helpers import ort_run  # noqa: E402
from tests.rewrite.test_array_budget import spelled_layer_norm  # noqa: E402

# Kernel families: one ORT kernel and the fusecli kernel that does the same work count as one family.
# Attention: Attention (packed QKV), MultiHeadAttention and GroupQueryAttention all compute softmax(QK^T)V
# for a whole attention block, so any of them covers one attention ORT fused. Every other op type is its own
# family (SkipLayerNormalization and SkipSimplifiedLayerNormalization apart, LayerNormalization apart from
# SkipLayerNormalization: a Skip kernel also absorbs the residual Add, so it is more work fused).
FAMILY = {"Attention": "attention", "MultiHeadAttention": "attention", "GroupQueryAttention": "attention",
          "PackedAttention": "attention", "PackedMultiHeadAttention": "attention"}
# A kernel that fuses a superset of another's work covers one of those ORT wrote, where fusecli has one to
# spare: EmbedLayerNormalization = Gathers + Adds + LayerNorm (it covers ORT's LayerNormalization, or
# its SkipLayerNormalization of the embedding sum), SkipLayerNormalization = Add + LayerNorm,
# BiasGelu = Add + Gelu, GemmFastGelu = MatMul + FastGelu.
COVERS = {"LayerNormalization": ("SkipLayerNormalization", "EmbedLayerNormalization"),
          "SkipLayerNormalization": ("EmbedLayerNormalization",),
          "SimplifiedLayerNormalization": ("SkipSimplifiedLayerNormalization",),
          "Gelu": ("BiasGelu",), "FastGelu": ("GemmFastGelu",),
          # FastGelu with its bias input: Add + tanh-GELU, BiasGelu's work (ORT writes BiasGelu, erf's GELU,
          # for ONNX's Gelu(approximate="tanh") + bias: further from the original, 2.9e-6 against 1.2e-7)
          "BiasGelu": ("FastGelu",)}
WRONG = 1e-3  # relative L2 between ORT's optimized model and the original above which ORT fused wrongly


def families(kernels: Counter) -> Counter:
    out = Counter()
    for op, n in kernels.items():
        out[FAMILY.get(op, op)] += n
    return out


@dataclass
class Case:
    name: str
    make: Callable[[str], str]  # writes the model to the given path, returns the path
    types: tuple[str, ...]  # ORT model types to try
    heads: int
    hidden: int
    dims: dict
    source: str = ""
    attentions: Callable[[], int] | None = None  # an export's attention calls as PyTorch counts them


@dataclass
class Row:
    case: Case
    ort_type: str = ""
    ort: Counter = field(default_factory=Counter)
    ort_runs: bool = False
    ort_error: str = ""
    ort_diff: float | None = None
    ort_diff_ones: float | None = None  # where ort_diff > WRONG: again with every integer input all 1
    original_runs: bool = False
    fuse: Counter = field(default_factory=Counter)
    fuse_error: str = ""
    fuse_loads: bool | None = None
    fuse_diff: float | None = None  # the written model against the original, on the same random inputs
    fuse_load_error: str = ""
    fuse_said: list[str] = field(default_factory=list)
    attentions: int | None = None  # PyTorch's attention calls in one forward (exports only)
    seconds: float = 0.0

    def attention_kernels(self) -> int:
        return families(self.fuse).get("attention", 0)

    def missing(self) -> dict[str, tuple[int, int]]:
        """ORT's families fusecli wrote fewer of: {family: (fusecli's, covering kernels included; ORT's)}."""
        o, f = families(self.ort), families(self.fuse)
        spare = Counter({k: n - o.get(k, 0) for k, n in f.items() if n > o.get(k, 0)})
        out = {}
        for k, n in sorted(o.items()):
            have = f.get(k, 0)
            for c in COVERS.get(k, ()):  # greedy: a spare covering kernel is spent on one shortfall
                take = min(max(n - have, 0), spare[c])
                have, spare[c] = have + take, spare[c] - take
            if have < n:
                out[k] = (have, n)
        return out


def _hand(name: str, build: Callable[[], onnx.ModelProto], source: str, types=("bert", "gpt2"),
          heads: int = 2, hidden: int = 16, dims: dict | None = None) -> Case:
    def make(path: str) -> str:
        onnx.save(build(), path)
        return path
    return Case(name, make, types, heads, hidden, dims or {"batch": 2, "seq": 5, "N": 2}, source)


def hand_cases() -> list[Case]:
    """The public ModelProto builders of the tests, with the variants the tests parametrize."""
    peer, tgs = "tests/rewrite/test_peer_graphs.py", "tests/transformer_graphs.py"
    fus = "tests/fusion/models.py"
    past = dict(pg.PAST)
    att = ("bert", "gpt2", "conformer")
    c = [_hand("scalar_bias_attention", pg.scalar_bias_attention, peer, att, pg.HEADS, pg.HIDDEN)]
    for axis, on_q in [(2, True), (-1, True), (2, False), (1, True)]:
        c.append(_hand(f"merged_heads_attention(axis={axis},scale_on_q={on_q})",
                       lambda a=axis, q=on_q: pg.merged_heads_attention(a, q), peer, ("bert", "bart", "gpt2"),
                       pg.HEADS, pg.HIDDEN))
    for label, kw in [("", {}), ("alibi", {"alibi": True}), ("fill=-10000", {"fill": -10000.0}),
                      ("weight=4", {"weight": 4.0})]:
        c.append(_hand(f"gpt2_past_attention({label})", lambda k=kw: pg.gpt2_past_attention(**k), peer,
                       ("gpt2", "bert"), pg.HEADS, pg.HIDDEN, past))
    for seg, pos, dec in [(True, "buffer", False), (True, "buffer", True), (False, "input", False)]:
        c.append(_hand(f"embedding_model(segment={seg},positions={pos},decomposed={dec})",
                       lambda s=seg, p=pos, d=dec: pg.embedding_model(s, p, d), peer, ("bert",),
                       pg.HEADS, pg.HIDDEN))
    c.append(_hand("fast_gelu_mlp", pg.fast_gelu_mlp, peer, ("bert", "gpt2"), pg.HEADS, pg.HIDDEN))
    rot = ("bert", "gpt_neox", "qwen3")
    for kw in [{}, {"bound": "shape"}, {"scale": 0.5}, {"table": "constant"}, {"swap": True},
               {"layout": "bsnd"}, {"pos_batch": 2}, {"interleaved": True},
               {"interleaved": True, "table": "constant"}, {"interleaved": True, "scale": 0.5},
               {"interleaved": True, "swap": True}]:
        label = ",".join(f"{k}={v}" for k, v in kw.items())
        c.append(_hand(f"rotary_model({label})", lambda k=kw: tg.rotary_model(**k), tgs, rot, tg.HEADS,
                       tg.HIDDEN, {"batch": 2}))
    for spelling in ("sdpa", "eager"):
        for table in ("computed", "constant"):
            c.append(_hand(f"llama_block({spelling},{table})",
                           lambda s=spelling, t=table: tg.llama_block(s, t), tgs, ("bert", "gpt2", "qwen3"),
                           tg.HEADS, tg.HIDDEN, {"batch": 1}))
    for order in (0, 1, 2):
        c.append(_hand(f"gelu_erf(order={order})", lambda o=order: fm.gelu_erf(o), fus, ("bert",), 2, 16))
    c.append(_hand("gelu_erf(arg=mul,bias)", lambda: fm.gelu_erf(arg="mul", bias=True), fus, ("bert",),
                   2, 16))
    c.append(_hand("gelu_tanh", fm.gelu_tanh, fus, ("bert", "gpt2"), 2, 16))
    for label, kw in [("pow", {}), ("mul", {"square": "mul"}), ("skip=add", {"skip": "add"}),
                      ("skip=op", {"skip": "op"})]:
        c.append(_hand(f"layer_norm({label})", lambda k=kw: fm.layer_norm(**k), fus, ("bert",), 2, 16))
    # the near misses tests/fusion/test_patterns.py says must not fuse (a constant or an operand broken)
    for label, build in [("gelu_erf(half=0.6)", lambda: fm.gelu_erf(half=0.6)),
                         ("gelu_erf(order=1,half=0.6)", lambda: fm.gelu_erf(order=1, half=0.6)),
                         ("gelu_erf(sqrt2=2)", lambda: fm.gelu_erf(sqrt2=2.0)),
                         ("gelu_erf(arg=mul,sqrt2=2)", lambda: fm.gelu_erf(arg="mul", sqrt2=2.0)),
                         ("gelu_erf(erf_of_other)", lambda: fm.gelu_erf(erf_of_other=True)),
                         ("gelu_erf(order=1,bias)", lambda: fm.gelu_erf(order=1, bias=True)),
                         ("gelu_tanh(cube=2)", lambda: fm.gelu_tanh(cube=2.0)),
                         ("layer_norm(exponent=3)", lambda: fm.layer_norm(exponent=3.0)),
                         ("layer_norm(mean_of=z)", lambda: fm.layer_norm(mean_of="z"))]:
        c.append(_hand(label, build, fus, ("bert", "gpt2"), 2, 16))
    c.append(_hand("spelled_layer_norm(64,[64])", lambda: spelled_layer_norm(64, [64]),
                   "tests/rewrite/test_array_budget.py", ("bert",), 2, 64))
    c.append(_hand("spelled_layer_norm(64,[1])", lambda: spelled_layer_norm(64, [1]),
                   "tests/rewrite/test_array_budget.py", ("bert",), 2, 64))
    for rev in (True, False):
        c.append(_hand(f"gpt2_embedding(reverse={rev})", lambda r=rev: gpt2_embedding(r),
                       "tests/rewrite/graph/test_edit.py", ("gpt2",), 2, 8, {"batch": 2, "seq": 5}))
    return c


EXPORT_TYPES = {"bert": ("bert",), "gpt2": ("gpt2",), "bart": ("bart",), "vit": ("vit",),
                "gpt_neox": ("gpt_neox",), "whisper_encoder": ("bart", "bert"),
                "hubert": ("bert", "conformer")}
DECODER_TYPES = ("gpt2", "bert", "qwen3")  # llama-like decoders: optimize_model has no llama model type
# name:exporter[:attn]; attn "default" (what transformers picks: sdpa where supported) unless said
EXPORTS = (
    "bert:torchscript", "bert:dynamo", "gpt2:torchscript", "gpt2:dynamo", "llama:torchscript",
    "llama:torchscript:eager", "llama:dynamo", "qwen2:torchscript", "qwen2:torchscript:eager", "qwen2:dynamo",
    "mistral:torchscript", "mistral:torchscript:eager", "mistral:dynamo", "bart:torchscript", "bart:dynamo",
    "vit:torchscript", "vit:dynamo", "gemma:torchscript", "gemma:dynamo", "phi3:torchscript", "phi3:dynamo",
    "gpt_neox:torchscript", "gpt_neox:dynamo", "whisper_encoder:torchscript", "whisper_encoder:dynamo",
    "hubert:torchscript", "cohere:torchscript", "cohere:dynamo",
    # grouped-query K/V (4 query heads, 2 K/V heads): repeat_kv in TorchScript, enable_gqa in dynamo; falcon's
    # K/V broadcast after one fused query_key_value projection
    "llama_gqa:torchscript", "llama_gqa:dynamo", "qwen3_gqa:torchscript", "qwen3_gqa:dynamo",
    "starcoder2_gqa:torchscript", "starcoder2_gqa:dynamo", "falcon_gqa:torchscript", "falcon_gqa:dynamo",
    # eager attention: the spelling ORT's attention fusions were written for
    "bert:torchscript:eager", "gpt2:torchscript:eager", "bart:torchscript:eager", "vit:torchscript:eager",
    "whisper_encoder:torchscript:eager", "gpt_neox:torchscript:eager", "phi3:torchscript:eager")


@contextlib.contextmanager
def _no_stdout():
    """The TorchScript exporter prints its whole graph on some failures, at the file-descriptor level."""
    sys.stdout.flush()
    saved = os.dup(1)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)
        try:
            yield
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)


def attention_calls(name: str, attn: str) -> int:
    """How many attentions one forward of the model runs, as PyTorch dispatches them: calls of
    scaled_dot_product_attention and of softmax (eager attention) under a TorchFunctionMode."""
    import torch
    from torch.overrides import TorchFunctionMode

    from tests import hf_models

    counted = {torch.nn.functional.scaled_dot_product_attention, torch.nn.functional.softmax, torch.softmax,
               torch.Tensor.softmax}

    class Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.calls += func in counted
            return func(*args, **(kwargs or {}))

    model, args = hf_models.build(name, attn=attn), hf_models.example_inputs(name, 2, 16)
    with torch.no_grad(), Count():
        model(*args)
    return Count.calls


def export_cases(names: list[str]) -> list[Case]:
    from tests import hf_models

    out = []
    for item in names:
        name, exporter, attn = (item.split(":") + ["default"])[:3]
        seq_dim = "samples" if name in hf_models.SPEECH else "seq"
        seq = hf_models.SAMPLES_PER_STEP * 16 if name in hf_models.SPEECH else 16

        def make(path: str, n=name, e=exporter, a=attn) -> str:
            with _no_stdout():
                return hf_models.export(n, path, e, attn=a)
        label = f"{name} ({exporter}{', ' + attn if attn != 'default' else ''})"
        out.append(Case(label, make, EXPORT_TYPES.get(name, DECODER_TYPES), 2, 64, {"batch": 2, seq_dim: seq},
                        "tests/hf_models.py export", lambda n=name, a=attn: attention_calls(n, a)))
    return out


def _runs(model, feeds=None, dims=None):
    return ort_run(model, feeds, batch=2, dims=dims, seed=7)


def rel_l2(a: dict, b: dict) -> float:
    worst = 0.0
    for k, v in a.items():
        if k not in b:
            return float("inf")
        x, y = np.asarray(v, np.float64), np.asarray(b[k], np.float64)
        if x.shape != y.shape:
            return float("inf")
        worst = max(worst, float(np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-30)))
    return worst


def _said(warnings: list[str]) -> list[str]:
    return [w for w in warnings if w.startswith("not rewritten") or "left unfused" in w
            or "onnxruntime cannot run" in w]


def run_case(case: Case, folder: str) -> Row:
    row, t0 = Row(case), time.perf_counter()
    safe = "".join(ch if ch.isalnum() else "_" for ch in case.name)[:80]
    path = case.make(os.path.join(folder, f"{safe}.onnx"))
    original = onnx.load(path)
    named = {d.dim_param for i in original.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    case.dims = {k: v for k, v in case.dims.items() if k in named}  # rewrite refuses a dim the model lacks
    try:
        feeds, want = _runs(path, dims=case.dims)
        row.original_runs = True
    except Exception as e:  # noqa: BLE001 -- the row says why
        feeds, want, row.ort_error = None, None, f"original does not run: {str(e).splitlines()[0][:200]}"
    best = None
    for t in case.types:
        try:
            opt = peers.ort_transformers(path, t, case.heads, case.hidden)
        except Exception as e:  # noqa: BLE001
            row.ort_error = row.ort_error or f"{t}: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
            continue
        kernels, runs, diff, err = peers.fused(opt, original), False, None, ""
        try:
            _, got = _runs(opt, feeds, dims=case.dims)
            runs = True
            diff = rel_l2(want, got) if want is not None else None
        except Exception as e:  # noqa: BLE001
            err = f"{t}: optimized model does not run: {str(e).splitlines()[0][:160]}"
        key = (runs, sum(kernels.values()))
        if best is None or key > best[0]:
            best = (key, t, kernels, runs, diff, err)
    if best is not None:
        _, row.ort_type, row.ort, row.ort_runs, row.ort_diff, err = best
        if row.ort_diff is not None and row.ort_diff > WRONG:  # masks and ids all 1: no padding, no holes
            ones = {k: np.ones_like(v) if v.dtype.kind == "i" else v for k, v in feeds.items()}
            opt = peers.ort_transformers(path, row.ort_type, case.heads, case.hidden)
            row.ort_diff_ones = rel_l2(_runs(path, ones)[1], _runs(opt, ones)[1])
        row.ort_error = err or ("" if row.ort_runs else row.ort_error)
    out = os.path.join(folder, f"{safe}.fused.onnx")
    try:
        r = rewrite(path, RewriteOptions(batch=2, dims=case.dims), output=out)
        row.fuse_said = _said(r.warnings)
        written = out if os.path.exists(out) else None
        if r.refused:
            row.fuse_error = f"refused: {r.refused}"
        if written is None:
            row.fuse_error = row.fuse_error or "nothing written"
        else:
            row.fuse = peers.fused(onnx.load(written), original)
            try:
                _, got = _runs(written, feeds, dims=case.dims)
                row.fuse_loads = True
                row.fuse_diff = rel_l2(want, got) if want is not None else None
            except Exception as e:  # noqa: BLE001
                row.fuse_loads, row.fuse_load_error = False, str(e).splitlines()[0][:200]
    except FuseError as e:
        row.fuse_error = str(e).splitlines()[0][:300]
    row.attentions = None if case.attentions is None else case.attentions()
    row.seconds = time.perf_counter() - t0
    return row


def _fmt(c: Counter) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "-"


def table(rows: list[Row]) -> list[str]:
    lines = ["| # | graph | ORT type | ORT fused kernels | ORT runs | ORT vs original (rel L2) | "
             "fusecli fused kernels | fusecli written loads | fusecli vs original (rel L2) | "
             "attention kernels / PyTorch's attentions | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        diff = "-" if r.ort_diff is None else \
            f"{r.ort_diff:.1e}" + (" **WRONG**" if r.ort_diff > WRONG else "") + \
            (f" ({r.ort_diff_ones:.1e} with integer inputs all 1)" if r.ort_diff_ones is not None else "")
        loads = {True: "yes", False: f"**NO**: {r.fuse_load_error}", None: f"nothing written ({r.fuse_error})"
                 if r.fuse_error else "nothing written"}[r.fuse_loads]
        if not r.original_runs:
            verdict = "the original does not run in onnxruntime"
        elif not r.ort_runs:  # ORT wrote no model that runs: nothing of its to match
            why = "ORT's model does not run" if r.ort_type else "ORT's optimizer fails"
            verdict = f"fusecli >= ORT ({why})"
        else:
            miss = r.missing()
            verdict = "fusecli >= ORT" if not miss else "**misses** " + ", ".join(
                f"{k} ({f} < {o})" for k, (f, o) in miss.items())
        ort_runs = "yes" if r.ort_runs else f"no ({r.ort_error})"
        lines.append(f"| {i} | {r.case.name} | {r.ort_type or '-'} | {_fmt(r.ort)} | {ort_runs} | {diff} | "
                     f"{_fmt(r.fuse)} | {loads} | {'-' if r.fuse_diff is None else f'{r.fuse_diff:.1e}'} | "
                     f"{_attention_cell(r)} | {verdict} |")
    return lines


def _attention_cell(r: Row) -> str:
    if r.attentions is None:
        return "-"
    cell = f"{r.attention_kernels()} / {r.attentions}"
    return cell if r.attention_kernels() == r.attentions else f"**{cell}**"


def summary(rows: list[Row]) -> list[str]:
    runnable = [r for r in rows if r.original_runs]  # "a graph ORT can run": the original runs in onnxruntime
    ok = [r for r in runnable if not r.ort_runs or not r.missing()]
    written = [r for r in rows if r.fuse_loads is not None]
    bad = [r for r in written if not r.fuse_loads]
    wrong = [r for r in rows if r.ort_diff is not None and r.ort_diff > WRONG]
    ran = [r for r in runnable if r.ort_runs]
    exports = [r for r in runnable if r.attentions is not None]
    return [f"**{len(rows)} graphs, ORT can run {len(runnable)} (its optimizer's output runs on {len(ran)}), "
            f"fusecli >= ORT on {len(ok)} of "
            f"{len(runnable)}; fusecli wrote {len(written)} models, "
            + ("all load and run" if not bad
               else f"{len(bad)} do not load: " + ", ".join(r.case.name for r in bad))
            + f"; ORT's optimized model differs from the original (rel L2 > {WRONG:g}) on {len(wrong)}"
            + (": " + ", ".join(r.case.name for r in wrong) if wrong else "") + ".**",
            "", "**Attention kernels (exports onnxruntime runs): every attention PyTorch runs has its kernel "
            "in fusecli's output on "
            f"{sum(r.attention_kernels() == r.attentions for r in exports)} of {len(exports)} exports**"
            + (" (not on: " + ", ".join(f"{r.case.name} {r.attention_kernels()} of {r.attentions}"
                                        for r in exports if r.attention_kernels() != r.attentions) + ")"
               if any(r.attention_kernels() != r.attentions for r in exports) else "")
            + "; ORT's optimizer on "
            f"{sum(families(r.ort).get('attention', 0) == r.attentions for r in exports)} of {len(exports)}."]


def findings(rows: list[Row]) -> list[str]:
    out = ["", "## Graphs where fusecli writes fewer kernels than ORT", ""]
    misses = [r for r in rows if r.ort_runs and r.original_runs and r.missing()]
    if not misses:
        out.append("None.")
    for r in misses:
        out.append(f"- **{r.case.name}** ({r.case.source}): misses "
                   + ", ".join(f"{k} (fusecli {f}, ORT {o})" for k, (f, o) in r.missing().items())
                   + (f"; fusecli: {r.fuse_error}" if r.fuse_error else ""))
        missed = r.missing()  # the lines naming a missed kernel first, then the others, 8 at most
        said = sorted(r.fuse_said, key=lambda w: not any(k in w for k in missed))
        for w in said[:8] or ["(fusecli said nothing about it: no 'not rewritten' line)"]:
            out.append(f"  - {w[:400]}")
        if len(said) > 8:
            out.append(f"  - ... {len(said) - 8} more 'not rewritten' lines")
    wrong = [r for r in rows if r.ort_diff is not None and r.ort_diff > WRONG]
    out += ["", f"## ORT's optimized model against the original (relative L2 > {WRONG:g})", ""]
    out += [f"- **{r.case.name}** (model type {r.ort_type}, fused {_fmt(r.ort)}): {r.ort_diff:.1e} on random "
            f"inputs (integer inputs drawn from {{0, 1}}: masks with holes and fully masked rows); "
            f"{r.ort_diff_ones:.1e} with every integer input 1 (no padding)"
            + (": it agrees only where nothing is masked" if r.ort_diff_ones <= WRONG
               else ": it differs even then")
            for r in wrong] or ["None."]
    off = [r for r in rows if r.fuse_diff is not None and r.fuse_diff > WRONG]
    out += ["", f"fusecli's written model against the original on the same inputs: worst relative L2 "
            f"{max((r.fuse_diff for r in rows if r.fuse_diff is not None), default=0):.1e}"
            + (f"; above {WRONG:g} on " + ", ".join(r.case.name for r in off) if off else "") + "."]
    extra = [r for r in rows if r.fuse_error and r not in misses]
    if extra:
        out += ["", "## fusecli errors / refusals on other graphs", ""]
        out += [f"- {r.case.name}: {r.fuse_error}" for r in extra]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exports", default="all", help="'all', 'none' or name:exporter,...")
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    names = list(EXPORTS) if args.exports == "all" else [] if args.exports == "none" else \
        args.exports.split(",")
    cases = hand_cases() + export_cases(names)
    cases = [c for c in cases if args.only in c.name]
    rows, skipped, t0 = [], [], time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        for case in cases:
            try:
                rows.append(run_case(case, folder))
                r = rows[-1]
                print(f"[{time.perf_counter() - t0:6.1f}s] {case.name}: ORT {_fmt(r.ort)} / fusecli "
                      f"{_fmt(r.fuse)} ({r.seconds:.1f}s)", file=sys.stderr)
            except Exception as e:  # noqa: BLE001 -- an export that fails is listed with its reason
                skipped.append((case.name, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"))
                print(f"skipped {case.name}: {skipped[-1][1]}", file=sys.stderr)
                if os.environ.get("BENCH_TRACE"):
                    traceback.print_exc()
    import onnxruntime
    import torch
    import transformers

    total = time.perf_counter() - t0
    head = ["# fusecli rewrite vs ONNX Runtime's transformers optimizer, graph by graph (issue 42)", "",
            f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; "
            f"{platform.platform()}, {os.cpu_count()} CPUs; wall {total:.0f} s",
            f"- onnxruntime {onnxruntime.__version__}, onnx {onnx.__version__}, torch {torch.__version__}, "
            f"transformers {transformers.__version__}, python {platform.python_version()}",
            f"- command: `python benchmarks/bench_ort_corpus.py {' '.join(sys.argv[1:])}`",
            "- ORT: `optimize_model(model_type, num_heads, hidden_size, opt_level=0, use_gpu=False)`, each "
            "listed model type tried, the best that runs kept; fusecli: `rewrite` (verification on, CPU "
            "target). Fused kernels: `benchmarks/peers.py fused` (com.microsoft nodes + fusion-only ONNX ops "
            "beyond the original's). Families: Attention / MultiHeadAttention / GroupQueryAttention count as "
            "one 'attention'; every other op type is its own, except that a kernel fusing a superset of "
            "another's work covers it where fusecli has one to spare (COVERS in the script: "
            "EmbedLayerNormalization covers (Skip)LayerNormalization, SkipLayerNormalization covers "
            "LayerNormalization, SkipSimplifiedLayerNormalization covers SimplifiedLayerNormalization, "
            "BiasGelu covers Gelu, FastGelu with its bias covers BiasGelu). Attention kernels per export: "
            "Attention / MultiHeadAttention / GroupQueryAttention nodes written, against the attentions one "
            "PyTorch forward runs (scaled_dot_product_attention and softmax calls, counted by a "
            "TorchFunctionMode).",
            "- Builders with a leading underscore in the tests (private to their module) are not imported.",
            "",
            *summary(rows), ""]
    body = head + table(rows) + findings(rows)
    if skipped:
        body += ["", "## Cases skipped (the graph could not be made)", ""]
        body += [f"- {n}: {why}" for n, why in skipped]
    text = "\n".join(body) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
