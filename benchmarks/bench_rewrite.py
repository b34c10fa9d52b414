"""``fusecli rewrite`` against ONNX Runtime on ResNet-50 and a MobileNetV2-like net: medians and ratios.

    python benchmarks/bench_rewrite.py [--runs 50] [--threads N] [--out benchmarks/RESULTS-rewrite.md]

Models: the onnx package's zoo ResNet-50 (``light_resnet50.onnx``) with its ConstantOfShape weights
replaced by seeded, realistically scaled initializers (He-scaled convs, BatchNorm near identity), and a
MobileNetV2-like net written in plain torch.nn (inverted residual blocks, ReLU6, BatchNorm kept in the
export), exported with ``torch.onnx.export(dynamo=False)``. Both at batch 1, 3x224x224.

For each model, five sessions are timed in one interleaved round-robin (the order rotates every round),
after warm-up, all with the same intra-op thread count and ``session.intra_op.allow_spinning = 0``:
the original and the rewritten model with graph optimizations disabled, ONNX Runtime's own offline
optimization (ORT_ENABLE_EXTENDED, written to a file, then loaded with optimizations disabled), and the
original and the rewritten model at ONNX Runtime's default level (ORT_ENABLE_ALL).
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

from fusecli.rewrite import RewriteOptions, rewrite  # noqa: E402
from fusecli.rewrite.values import Weights  # noqa: E402
from fusecli.rewrite.verify import bench, default_threads, ort_optimized  # noqa: E402

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


def measure(name: str, path: Path, work: Path, runs: int, threads: int) -> dict:
    result = rewrite(str(path), RewriteOptions(target="cpu", mode="inference"))
    rewritten = work / f"{path.stem}.rewritten.onnx"
    onnx.save(result.model, rewritten)
    ort_file = ort_optimized(str(path), str(work / f"{path.stem}.ort-extended.onnx"), "extended")
    ort_ops = Counter(n.op_type for n in onnx.load(ort_file, load_external_data=False).graph.node)
    timings = bench([("original", str(path), "disabled"), ("rewritten", str(rewritten), "disabled"),
                     ("ORT offline (EXTENDED)", ort_file, "disabled"),
                     ("original, default opts", str(path), "default"),
                     ("rewritten, default opts", str(rewritten), "default")],
                    threads=threads, runs=runs, warmup=10)
    ms = {t.label: t.median_ms for t in timings}
    print(f"{name}: nodes {result.nodes_before} -> {result.nodes_after}; rewrites {result.kernel_counts()}; "
          f"max rel. error {result.verification.worst('disabled'):.2g}", flush=True)
    return {"name": name, "ms": ms, "nodes": (result.nodes_before, result.nodes_after),
            "ort_nodes": sum(ort_ops.values()),
            "fused": Counter(result.ops_after).get("com.microsoft.FusedConv", 0),
            "ort_fused": ort_ops.get("FusedConv", 0), "error": result.verification.worst("disabled"),
            "kernels": result.kernel_counts()}


def table(rows: list[dict]) -> str:
    lines = ["| model | comparison | A median (ms) | B median (ms) | A / B |", "|---|---|---:|---:|---:|"]
    for r in rows:
        ms = r["ms"]
        for label, a, b in (("original vs rewritten, ORT opts disabled", "original", "rewritten"),
                            ("ORT offline EXTENDED vs rewritten, both loaded with opts disabled",
                             "ORT offline (EXTENDED)", "rewritten"),
                            ("original vs rewritten, ORT default opts", "original, default opts",
                             "rewritten, default opts")):
            lines.append(f"| {r['name']} | {label} | {ms[a]:.2f} | {ms[b]:.2f} | {ms[a] / ms[b]:.2f}x |")
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
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "RESULTS-rewrite.md"))
    args = ap.parse_args()
    threads = args.threads or default_threads()
    with tempfile.TemporaryDirectory(prefix="bench-rewrite-") as tmp:
        work = Path(tmp)
        rows = [measure("ResNet-50 (zoo graph, seeded weights)", resnet50(work / "resnet50.onnx"), work,
                        args.runs, threads),
                measure("MobileNetV2-like (torch, BN kept)", mobilenet_v2(work / "mobilenet_v2.onnx"), work,
                        args.runs, threads)]
    md = table(rows)
    print(md)
    details = "\n".join(
        f"- {r['name']}: nodes {r['nodes'][0]} -> {r['nodes'][1]} (ORT EXTENDED: {r['ort_nodes']}); "
        f"FusedConv {r['fused']} (ORT EXTENDED: {r['ort_fused']}); rewrites {dict(r['kernels'])}; "
        f"verified, largest relative L2 error {r['error']:.2g}" for r in rows)
    text = (f"# fusecli rewrite: benchmark\n\n`python benchmarks/bench_rewrite.py --runs {args.runs}` "
            f"(batch 1, 3x224x224, median of {args.runs} interleaved runs after 10 warm-up runs).\n\n"
            f"{machine(threads)}\n\n{md}\n\nA / B above 1 means B is faster.\n\n{details}\n")
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
