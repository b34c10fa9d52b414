"""``fusecli rewrite`` against every optimizer users run: fused-kernel counts and latency with spread.

    python benchmarks/bench_rewrite.py [--runs 30] [--threads N] [--models bert,gpt2,...]
                                       [--out benchmarks/RESULTS-rewrite.md]

Models: transformers built from configs (hidden 512, 8 heads, 4 layers, random weights, eager attention,
TorchScript exporter): BERT and ViT at batch 4 / sequence 256 (ViT: 256 patches of 16 at 256x256),
GPT-2 and Llama (grouped-query, 2 K/V heads) at batch 1 / sequence 1024; the onnx package's zoo
ResNet-50 with seeded, realistically scaled weights and a MobileNetV2 in plain torch.nn (BatchNorm kept),
both at batch 1, 3x224x224.

Peers (benchmarks/peers.py): ONNX Runtime's offline model at ORT_ENABLE_EXTENDED, ONNX Runtime's
transformers optimizer (``optimize_model``) and onnxscript's ``optimize_for_ort``. Fused kernels are
counted the same way for all (com.microsoft nodes and fusion-only ONNX ops beyond the original's).
fusecli's output is verified by ``rewrite`` itself (relative L2 <= 1e-4 at ORT_DISABLE_ALL and default).

Latency: every model is loaded at ONNX Runtime's default level (ORT_ENABLE_ALL, what users run) and
all are timed in one interleaved round-robin (the order rotates every round) after warm-up, with the
same intra-op thread count and spinning off; each row gives the median and its 25th-75th percentiles,
and fusecli's verdict against each is "faster" / "slower" only where the interquartile ranges part
(fusecli.rewrite.verify.benchverdict).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fusecli.core.errors import FuseError  # noqa: E402
from fusecli.rewrite import RewriteOptions, rewrite  # noqa: E402
from fusecli.rewrite.graph.values import Weights  # noqa: E402
from fusecli.rewrite.verify.benchverdict import Spread, compare  # noqa: E402
from fusecli.rewrite.verify.outputs import bench, default_threads, open_session, session_options  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
import peers  # noqa: E402

ZOO = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"


def resnet50(path: Path) -> Path:
    """The zoo ResNet-50 with real initializers: each ConstantOfShape weight becomes seeded random values
    (BatchNorm's gamma near 0.7 keeps activations from growing block after block)."""
    model = onnx.load(ZOO)
    rng = np.random.default_rng(0)
    weights = Weights(model)
    users = {}
    for n in model.graph.node:
        for k, name in enumerate(n.input):
            users.setdefault(name, (n.op_type, k))
    made, drop = [], set()
    for n in model.graph.node:
        if n.op_type != "ConstantOfShape":
            continue
        shape = weights.value(n.input[0]).astype(int)
        op, k = users[n.output[0]]
        if op == "Conv":
            value = rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))
        elif op == "BatchNormalization":
            value = {1: 0.7 + 0.05 * rng.standard_normal(shape), 2: 0.1 * rng.standard_normal(shape),
                     3: 0.1 * rng.standard_normal(shape), 4: 1 + 0.1 * rng.random(shape)}[k]
        else:  # the classifier's Gemm
            value = rng.standard_normal(shape) * 0.01
        made.append(numpy_helper.from_array(value.astype(np.float32), n.output[0]))
        drop.add(id(n))
    nodes = [n for n in model.graph.node if id(n) not in drop]
    used = {i for n in nodes for i in n.input}
    inits = [t for t in model.graph.initializer if t.name in used] + made
    names = {t.name for t in inits}
    graph = onnx.helper.make_graph(nodes, "resnet50", [i for i in model.graph.input if i.name not in names],
                                   list(model.graph.output), inits)
    out = onnx.helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=8)
    onnx.checker.check_model(out)
    onnx.save(out, path)
    return path


def mobilenet_v2(path: Path) -> Path:
    """A MobileNetV2 (width 1.0) in plain torch.nn, exported with BatchNorm kept (TrainingMode.PRESERVE)."""
    import torch
    from torch import nn

    def conv_bn(cin, cout, k=3, stride=1, groups=1, act=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
        return layers + ([nn.ReLU6(inplace=True)] if act else [])

    class InvertedResidual(nn.Module):
        def __init__(self, cin, cout, stride, expand):
            super().__init__()
            hidden = cin * expand
            layers = conv_bn(cin, hidden, 1) if expand != 1 else []
            layers += conv_bn(hidden, hidden, 3, stride, groups=hidden) + conv_bn(hidden, cout, 1, act=False)
            self.block = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            return x + self.block(x) if self.residual else self.block(x)

    class MobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            layers, cin = conv_bn(3, 32, 3, 2), 32
            for t, c, n, s in ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                               (6, 160, 3, 2), (6, 320, 1, 1)):
                for i in range(n):
                    layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                    cin = c
            self.features = nn.Sequential(*layers, *conv_bn(cin, 1280, 1))
            self.classifier = nn.Linear(1280, 1000)

        def forward(self, x):
            return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))

    torch.manual_seed(0)
    net = MobileNetV2().eval()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):  # trained-looking statistics, not the fresh 0 / 1
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.normal_(1, 0.1)
                m.bias.normal_(0, 0.1)
    torch.onnx.export(net, torch.randn(1, 3, 224, 224), str(path), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["logits"], training=torch.onnx.TrainingMode.PRESERVE,
                      do_constant_folding=True)
    return path


HIDDEN, HEADS, LAYERS = 512, 8, 4


def transformer(name: str, path: Path, batch: int, seq: int) -> Path:
    """A `transformers` model from a config (random weights), exported by TorchScript at fixed sizes."""
    import torch
    import transformers as tr

    size = dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                intermediate_size=4 * HIDDEN)
    if name == "bert":
        config, inputs = tr.BertConfig(vocab_size=1000, max_position_embeddings=seq, **size), "ids_mask"
    elif name == "gpt2":
        config = tr.GPT2Config(vocab_size=1000, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=seq,
                               bos_token_id=0, eos_token_id=0)
        inputs = "ids"
    elif name == "llama":
        config = tr.LlamaConfig(vocab_size=1000, max_position_embeddings=seq, num_key_value_heads=2, **size)
        inputs = "ids"
    elif name == "vit":
        config, inputs = tr.ViTConfig(image_size=16 * int(seq ** 0.5), patch_size=16, **size), "pixels"
    else:
        raise KeyError(name)
    torch.manual_seed(0)
    config._attn_implementation = "eager"
    inner = tr.AutoModel.from_config(config, attn_implementation="eager").eval()

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            keys = ("pixel_values",) if inputs == "pixels" else ("input_ids", "attention_mask")
            kw = dict(zip(keys, args, strict=False))
            return self.inner(**kw).last_hidden_state

    g = torch.Generator().manual_seed(0)
    if inputs == "pixels":
        side = 16 * int(seq ** 0.5)
        args, names = (torch.randn(batch, 3, side, side, generator=g),), ["pixel_values"]
    else:
        args, names = (torch.randint(0, 1000, (batch, seq), generator=g),), ["input_ids"]
        if inputs == "ids_mask":
            mask = torch.ones(batch, seq, dtype=torch.int64)
            mask[0, seq // 2:] = 0
            args, names = args + (mask,), names + ["attention_mask"]
    import warnings

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(Wrapped().eval(), args, str(path), dynamo=False, opset_version=17,
                          input_names=names, output_names=["output"])
    return path


# name -> (builder, batch, seq, ORT transformers optimizer model type)
MODELS = {
    "bert": (lambda p: transformer("bert", p, 4, 256), 4, 256, "bert"),
    "vit": (lambda p: transformer("vit", p, 4, 256), 4, 256, "vit"),
    "gpt2": (lambda p: transformer("gpt2", p, 1, 1024), 1, 1024, "gpt2"),
    "llama": (lambda p: transformer("llama", p, 1, 1024), 1, 1024, "gpt2"),
    "resnet50": (resnet50, 1, None, "bert"),
    "mobilenet_v2": (mobilenet_v2, 1, None, "bert"),
}
TITLES = {"bert": "BERT (b4, s256)", "vit": "ViT (b4, 256 patches)", "gpt2": "GPT-2 (b1, s1024)",
          "llama": "Llama GQA (b1, s1024)", "resnet50": "ResNet-50 (b1)", "mobilenet_v2": "MobileNetV2 (b1)"}
PEERS = ("ORT EXTENDED", "ORT transformers", "onnxscript")


def _fmt(c: Counter) -> str:
    return f"**{sum(c.values())}**" + (" (" + ", ".join(f"{k} {n}" for k, n in sorted(c.items())) + ")"
                                       if c else "")


def measure(name: str, work: Path, runs: int, threads: int) -> dict:
    build, batch, seq, model_type = MODELS[name]
    path = build(work / f"{name}.onnx")
    original = onnx.load(path)
    result = rewrite(str(path), RewriteOptions(target="cpu", mode="inference", batch=batch))
    files = {"fusecli": peers.save(result.model, str(work / f"{name}.fusecli.onnx"))}
    models = {"fusecli": result.model,
              "ORT EXTENDED": peers.ort_extended(str(path), str(work / f"{name}.ort.onnx"))}
    files["ORT EXTENDED"] = str(work / f"{name}.ort.onnx")
    for label, make in (("ORT transformers", lambda: peers.ort_transformers(str(path), model_type, HEADS,
                                                                           HIDDEN)),
                        ("onnxscript", lambda: peers.onnxscript_ort(str(path)))):
        try:
            models[label] = make()
            files[label] = peers.save(models[label], str(work / f"{name}.{label.replace(' ', '_')}.onnx"))
        except Exception as e:  # a peer that fails on a model is reported, not hidden
            models[label] = f"failed: {type(e).__name__}: {' '.join(str(e).split())[:80]}"
    counts = {k: peers.fused(m, original) if not isinstance(m, str) else m for k, m in models.items()}
    broken = {}
    for k in list(files):
        try:
            open_session(files[k], session_options("default"), k)
        except FuseError as e:  # a peer whose output onnxruntime refuses: counted, flagged, not timed
            broken[k] = " ".join(str(e).split())[:120]
            del files[k]
    sources = [("original", str(path), "default")] + [(k, files[k], "default") for k in ("ORT EXTENDED",
               "ORT transformers", "onnxscript", "fusecli") if k in files]
    timings = bench(sources, batch=batch, threads=threads, runs=runs, warmup=5)
    spreads = {t.label: Spread.of(t.times_ms) for t in timings}
    print(f"{name}: fused {dict(counts['fusecli'])}; error {result.verification.worst('disabled'):.2g} / "
          f"{result.verification.worst('default'):.2g}; " + ", ".join(
              f"{k} {s.median:.2f} ms" for k, s in spreads.items()), flush=True)
    return {"name": name, "counts": counts, "spreads": spreads, "broken": broken,
            "error": (result.verification.worst("disabled"), result.verification.worst("default"))}


def tables(rows: list[dict]) -> str:
    lines = ["### Fused kernels", "", "| model | fusecli | " + " | ".join(PEERS) + " | fusecli >= best |",
             "|---|---|" + "---|" * len(PEERS) + "---|"]
    for r in rows:
        c = r["counts"]
        best = max((sum(c[p].values()) for p in PEERS if not isinstance(c.get(p), str)
                    and p not in r["broken"]), default=0)
        cells = [(_fmt(c[p]) + (" (output does not load in onnxruntime)" if p in r["broken"] else ""))
                 if not isinstance(c.get(p), str) else c.get(p, "n/a") for p in PEERS]
        ok = "yes" if sum(c["fusecli"].values()) >= best else "**no**"
        lines.append(f"| {TITLES[r['name']]} | {_fmt(c['fusecli'])} | " + " | ".join(cells) + f" | {ok} |")
    lines += ["", "### Latency at ORT_ENABLE_ALL (ms: median [25th-75th])", "",
              "| model | original | " + " | ".join(PEERS) + " | fusecli | fusecli vs each |",
              "|---|---:|" + "---:|" * len(PEERS) + "---:|---|"]
    for r in rows:
        s = r["spreads"]
        cell = {k: f"{v.median:.1f} [{v.q1:.1f}-{v.q3:.1f}]" for k, v in s.items()}
        mine = s["fusecli"]
        words = "; ".join(f"{k}: {compare(v, mine)} ({v.median / mine.median:.2f}x)"
                          for k, v in s.items() if k != "fusecli")
        lines.append(f"| {TITLES[r['name']]} | {cell['original']} | "
                     + " | ".join(cell.get(p, "n/a") for p in PEERS) + f" | {cell['fusecli']} | {words} |")
    return "\n".join(lines)


def machine(threads: int) -> str:
    import onnxruntime
    import torch

    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"- date: {datetime.date.today().isoformat()}\n- CPU: {cpu}, {os.cpu_count()} logical CPUs, "
            f"{threads} intra-op threads for every session, spinning off\n"
            f"- {platform.system()} {platform.release()}, Python {platform.python_version()}, "
            f"onnxruntime {onnxruntime.__version__}, onnx {onnx.__version__}, torch {torch.__version__}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS-rewrite.md"))
    args = ap.parse_args()
    threads = args.threads or default_threads()
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-rewrite-") as tmp:
        rows = [measure(n, Path(tmp), args.runs, threads) for n in names]
    load = f"- load average (1 min) at start / end: {load_before:.1f} / {os.getloadavg()[0]:.1f}"
    md = tables(rows)
    print(md)
    notes = [f"- {TITLES[r['name']]}: {k}'s output is not timed: {msg}" for r in rows
             for k, msg in r["broken"].items()]
    errors = "\n".join(notes + [f"- {TITLES[r['name']]}: fusecli verified, largest relative L2 error "
                       f"{r['error'][0]:.2g} (ORT_DISABLE_ALL), {r['error'][1]:.2g} (default)" for r in rows])
    text = (f"# fusecli rewrite: benchmark\n\n`python benchmarks/bench_rewrite.py --runs {args.runs}"
            f"{'' if names == list(MODELS) else ' --models ' + ','.join(names)}` "
            f"({args.runs} interleaved runs per model after 5 warm-up runs; CPU only).\n\n"
            f"{machine(threads)}\n{load}\n\n{md}\n\n{NOTE}\n\n{errors}\n")
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")


NOTE = """"faster" / "slower" only where the interquartile ranges part (and the medians differ by 2% or
more); "no measurable difference" otherwise. On ONNX Runtime's CPU provider the fused kernels are
mostly not faster than what ORT_ENABLE_ALL makes of the original at session start (attention in
particular: MultiHeadAttention's CPU kernel computes the same matmul-softmax-matmul), so on CPU the
gains are kernel counts, portability to other providers and memory, not speed. No GPU was available
for this run: CUDA latency is not measured here."""


if __name__ == "__main__":
    main()
