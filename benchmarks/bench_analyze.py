"""Whole-process benchmark of ``fusecli analyze`` against loading the same model with its own framework.

Run ``python benchmarks/bench_analyze.py [--quick]`` from the repository root. Inputs are built once
under ``benchmarks/work/`` (git-ignored):

- ``bert_large.onnx``: ``transformers.BertModel`` with BERT-large settings (hidden 1024, 24 layers,
  16 heads, intermediate 4096), random weights, exported by ``torch.onnx.export`` (about 1.3 GB);
- ``resnet50_savedmodel/``: ``keras.applications.ResNet50(weights=None)`` written by ``model.export``;
- ``residual_50k.onnx`` and ``residual_100k.onnx``: synthetic Conv-BN-Relu-Conv-BN-Add-Relu blocks with
  4 channels, valid by ``onnx.checker``.

Each comparison runs whole processes (interpreter start included), A/B/A/B interleaved so both share
the machine's noise, and takes the median of ``--runs`` (5) runs of each. Peak RSS is each child's own
``ru_maxrss`` (from ``os.wait4``). The table goes to ``benchmarks/RESULTS.md`` (``--quick``, which skips
BERT-large and the SavedModel, writes ``benchmarks/work/RESULTS-quick.md`` instead unless ``--out``).
Benchmarks are not tests: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "benchmarks" / "work"
BERT = WORK / "bert_large.onnx"
RESNET = WORK / "resnet50_savedmodel"
SYNTH = {50_000: WORK / "residual_50k.onnx", 100_000: WORK / "residual_100k.onnx"}
CHANNELS, SPATIAL = 4, 8


# -- inputs -----------------------------------------------------------------------------------------------
def build_bert(path: Path) -> None:
    """BERT-large (random init) exported to ONNX; runs in its own process (torch is big)."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                        intermediate_size=4096, attn_implementation="eager")
    bert = BertModel(config).eval()

    class Positional(torch.nn.Module):  # transformers 5's forward takes these by keyword only
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids, return_dict=False)
            return out[0], out[1]

    model = Positional().eval()
    ids = torch.ones(1, 128, dtype=torch.long)
    mask = torch.ones(1, 128, dtype=torch.long)
    types = torch.zeros(1, 128, dtype=torch.long)
    axes = {0: "batch", 1: "seq"}
    tmp = path.with_suffix(".tmp.onnx")
    with torch.no_grad():
        try:
            torch.onnx.export(model, (ids, mask, types), str(tmp), dynamo=False, opset_version=17,
                              input_names=["input_ids", "attention_mask", "token_type_ids"],
                              output_names=["last_hidden_state", "pooler_output"],
                              dynamic_axes={"input_ids": axes, "attention_mask": axes,
                                            "token_type_ids": axes, "last_hidden_state": axes,
                                            "pooler_output": {0: "batch"}})
        except Exception as e:  # the TorchScript exporter may be gone: fall back to the dynamo one
            print(f"dynamo=False export failed ({type(e).__name__}: {e}); using the dynamo exporter",
                  file=sys.stderr)
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", min=2, max=512)
            shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq},
                      "token_type_ids": {0: batch, 1: seq}}
            program = torch.onnx.export(model, (ids, mask, types), dynamo=True, dynamic_shapes=shapes)
            program.save(str(tmp))
    os.replace(tmp, path)
    external = tmp.with_name(tmp.name + ".data")  # external data, when the exporter writes it
    if external.exists():
        print(f"note: the exporter wrote external data {external.name}", file=sys.stderr)


def build_resnet(path: Path) -> None:
    """Keras 3 ResNet-50 (no weights) exported as a SavedModel."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import shutil

    import keras

    model = keras.applications.ResNet50(weights=None)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.export(str(tmp))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def build_synthetic(path: Path, nodes: int) -> None:
    """``nodes`` nodes: Conv-BN-Relu-Conv-BN-Add-Relu blocks (7 nodes), then Relus to make up the count."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    c = CHANNELS
    weight = numpy_helper.from_array(rng.standard_normal((c, c, 3, 3)).astype(np.float32), "w")
    ones = np.ones(c, np.float32)
    zeros = np.zeros(c, np.float32)
    inits, body = [], []
    x = "x"
    blocks, extra = divmod(nodes, 7)
    for b in range(blocks):
        p = f"b{b}"
        for k in (1, 2):
            w = onnx.TensorProto()
            w.CopyFrom(weight)
            w.name = f"{p}.conv{k}.w"
            inits.append(w)
            for stat, v in (("scale", ones), ("bias", zeros), ("mean", zeros), ("var", ones)):
                inits.append(numpy_helper.from_array(v, f"{p}.bn{k}.{stat}"))

        def conv_bn(k, src, p=p):
            body.append(helper.make_node("Conv", [src, f"{p}.conv{k}.w"], [f"{p}.conv{k}"],
                                         name=f"{p}/conv{k}", pads=[1, 1, 1, 1], kernel_shape=[3, 3]))
            body.append(helper.make_node("BatchNormalization",
                                         [f"{p}.conv{k}", *(f"{p}.bn{k}.{s}" for s in
                                                            ("scale", "bias", "mean", "var"))],
                                         [f"{p}.bn{k}"], name=f"{p}/bn{k}"))
            return f"{p}.bn{k}"

        h = conv_bn(1, x)
        body.append(helper.make_node("Relu", [h], [f"{p}.relu1"], name=f"{p}/relu1"))
        h = conv_bn(2, f"{p}.relu1")
        body.append(helper.make_node("Add", [h, x], [f"{p}.add"], name=f"{p}/add"))
        body.append(helper.make_node("Relu", [f"{p}.add"], [f"{p}.out"], name=f"{p}/relu2"))
        x = f"{p}.out"
    for e in range(extra):
        body.append(helper.make_node("Relu", [x], [f"tail{e}"], name=f"tail/relu{e}"))
        x = f"tail{e}"
    graph = helper.make_graph(
        body, f"residual_{nodes}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", c, SPATIAL, SPATIAL])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["N", c, SPATIAL, SPATIAL])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    tmp = path.with_suffix(".tmp.onnx")
    onnx.save(model, str(tmp))
    os.replace(tmp, path)


def ensure_inputs(quick: bool) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    todo = [(f"synthetic:{n}", p) for n, p in SYNTH.items() if not p.exists()]
    if not quick:
        todo += [(name, p) for name, p in (("bert", BERT), ("resnet", RESNET))
                 if not (p / "saved_model.pb" if name == "resnet" else p).exists()]
    for what, path in todo:
        print(f"building {path.relative_to(ROOT)} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        subprocess.run([sys.executable, __file__, "--build", what, str(path)], check=True)
        print(f"  done in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)


def built_once(path: Path, code: str, *args: str, quiet: bool = False) -> Path:
    """``path``, made first where it is missing by ``python -c CODE ARGS`` run from the repository root
    (``quiet``: its output kept off the terminal)."""
    if not path.exists():
        WORK.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-c", code, *args], check=True, cwd=ROOT, capture_output=quiet)
    return path


# -- measuring --------------------------------------------------------------------------------------------
@dataclass
class Run:
    seconds: float
    maxrss_kib: int
    ok: bool
    error: str = ""
    cpu_seconds: float = 0.0  # the child's user + system time


def run_once(cmd: list[str]) -> Run:
    """One whole process: wall seconds and its own peak RSS (ru_maxrss, KiB on Linux)."""
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = err.read().decode(errors="replace").strip().splitlines()[-1:] or [""]
    return Run(seconds, usage.ru_maxrss, proc.returncode == 0,
               "" if proc.returncode == 0 else f"exit {proc.returncode}: {tail[0][:200]}",
               usage.ru_utime + usage.ru_stime)


@dataclass
class Sample:
    runs: list[Run]

    @property
    def ok(self) -> bool:
        return bool(self.runs) and all(r.ok for r in self.runs)

    @property
    def seconds(self) -> float:
        return statistics.median(r.seconds for r in self.runs)

    @property
    def cpu_seconds(self) -> float:
        return statistics.median(r.cpu_seconds for r in self.runs)

    @property
    def rss_mib(self) -> float:
        return statistics.median(r.maxrss_kib for r in self.runs) / 1024

    @property
    def error(self) -> str:
        return next((r.error for r in self.runs if not r.ok), "")


def interleaved(a: list[str], b: list[str], runs: int, label: str) -> tuple[Sample, Sample]:
    """A, B, A, B, ...: ``runs`` of each; stops early when A fails (B still measured once)."""
    sa, sb = Sample([]), Sample([])
    for i in range(runs):
        ra = run_once(a)
        sa.runs.append(ra)
        rb = run_once(b)
        sb.runs.append(rb)
        print(f"  {label} run {i + 1}/{runs}: A {_show(ra)} | B {_show(rb)}", file=sys.stderr, flush=True)
        if not ra.ok or not rb.ok:
            break
    return sa, sb


def _show(r: Run) -> str:
    return f"{r.seconds:.2f} s {r.maxrss_kib / 1024:.0f} MiB" + ("" if r.ok else f" FAILED {r.error}")


def fusecli(model: Path, *dims: str) -> list[str]:
    """The analyze command, sized as a user sizes it (every input dim given: no default is taken)."""
    return [sys.executable, "-m", "fusecli", "analyze", str(model), "--json", "--batch", "2", *dims]


# -- report -----------------------------------------------------------------------------------------------
def machine_info() -> list[tuple[str, str]]:
    cpu = platform.processor() or "?"
    mem = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
        with open("/proc/meminfo") as f:
            kib = int(next(line.split()[1] for line in f if line.startswith("MemTotal")))
            mem = f"{kib / 1024 ** 2:.1f} GiB"
    except OSError:
        pass

    def version(pkg: str) -> str:
        try:
            return metadata.version(pkg)
        except metadata.PackageNotFoundError:
            return "not installed"

    return [("date", datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")),
            ("CPU", cpu), ("cores", str(os.cpu_count())), ("RAM", mem),
            ("OS", platform.platform()), ("Python", platform.python_version()),
            ("fusecli", version("fusecli")), ("onnx", version("onnx")),
            ("onnxruntime", version("onnxruntime")), ("protobuf", version("protobuf")),
            ("tensorflow", version("tensorflow-cpu") if version("tensorflow") == "not installed"
             else version("tensorflow")),
            ("keras", version("keras")), ("torch", version("torch")),
            ("transformers", version("transformers"))]


def write_results(path: Path, rows: list[list[str]], notes: list[str], runs: int) -> str:
    head = ["measure", "fusecli analyze", "baseline", "ratio", "target", "met"]
    lines = ["# fusecli analyze benchmark", "",
             "Written by `python benchmarks/bench_analyze.py`. Whole processes (interpreter start included), "
             f"median of {runs} runs each, A/B interleaved; peak RSS is each process's own `ru_maxrss`.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", "## Machine", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in machine_info()]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    text = "\n".join(lines) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text


def _met(value: float, limit: float) -> str:
    return "yes" if value <= limit else "**no**"


def _size(path: Path) -> str:
    if path.is_dir():
        total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    else:
        total = sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.is_file())
    return f"{total / 1024 ** 2:,.0f} MiB"


def _count_nodes(path: Path) -> str:
    code = ("import sys; from fusecli.load.onnx_wire import read_structure; "
            "print(len(read_structure(sys.argv[1])[0].graph.node))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=ROOT)
    return out.stdout.strip() or "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="skip BERT-large and the SavedModel")
    ap.add_argument("--runs", type=int, default=5, help="runs of each command (median taken)")
    ap.add_argument("--out", type=Path, default=None, help="where to write the table")
    ap.add_argument("--build", nargs=2, metavar=("WHAT", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build:
        what, path = args.build
        if what == "bert":
            build_bert(Path(path))
        elif what == "resnet":
            build_resnet(Path(path))
        else:
            build_synthetic(Path(path), int(what.split(":")[1]))
        return
    out = args.out or (WORK / "RESULTS-quick.md" if args.quick else ROOT / "benchmarks" / "RESULTS.md")
    ensure_inputs(args.quick)
    rows: list[list[str]] = []
    notes = ["`fusecli analyze MODEL --json` with stdout to /dev/null (the JSON document is still made and "
             "written); each baseline is `python -c` of the framework's own load.",
             "BERT-large: `transformers.BertModel` (hidden 1024, 24 layers, 16 heads, intermediate 4096), "
             "random weights, `torch.onnx.export(dynamo=False, opset_version=17)` (the dynamo exporter "
             "only if that fails).",
             f"Synthetic graphs: Conv-BN-Relu-Conv-BN-Add-Relu blocks, {CHANNELS} channels, "
             f"{SPATIAL}x{SPATIAL}, opset 17, checked by `onnx.checker`."]
    runs = args.runs

    if not args.quick:
        print(f"BERT-large ({_size(BERT)}): analyze vs onnx.load", file=sys.stderr)
        a, b = interleaved(fusecli(BERT, "--dim", "seq=128"),
                           [sys.executable, "-c", f"import onnx; onnx.load({str(BERT)!r})"], runs, "bert")
        nodes = _count_nodes(BERT)
        if a.ok and b.ok:
            r = a.seconds / b.seconds
            rows.append([f"BERT-large ONNX ({nodes} nodes, {_size(BERT)}): time", f"{a.seconds:.2f} s",
                         f"{b.seconds:.2f} s (`onnx.load`)", f"{r:.3f}x", "<= 0.3x", _met(r, 0.3)])
            rr = a.rss_mib / b.rss_mib
            rows.append(["BERT-large ONNX: peak RSS", f"{a.rss_mib:,.0f} MiB",
                         f"{b.rss_mib:,.0f} MiB (`onnx.load`)", f"{rr:.3f}x", "<= 0.2x", _met(rr, 0.2)])
        else:
            rows.append(["BERT-large ONNX: time", "failed", "", "", "<= 0.3x", "**no**"])
            notes.append(f"BERT-large failed: {a.error or b.error}")

        print("ResNet-50 SavedModel: analyze vs tf.saved_model.load", file=sys.stderr)
        tf_load = [sys.executable, "-c", f"import tensorflow as tf; tf.saved_model.load({str(RESNET)!r})"]
        probe = run_once(fusecli(RESNET))
        if probe.ok:
            a, b = interleaved(fusecli(RESNET), tf_load, runs, "resnet")
        if probe.ok and a.ok and b.ok:
            r = a.seconds / b.seconds
            rows.append([f"Keras ResNet-50 SavedModel ({_size(RESNET)}): time", f"{a.seconds:.2f} s",
                         f"{b.seconds:.2f} s (`tf.saved_model.load`)", f"{r:.3f}x", "<= 0.1x",
                         _met(r, 0.1)])
            rows.append(["Keras ResNet-50 SavedModel: peak RSS", f"{a.rss_mib:,.0f} MiB",
                         f"{b.rss_mib:,.0f} MiB", f"{a.rss_mib / b.rss_mib:.3f}x", "", ""])
        else:
            error = probe.error if not probe.ok else (a.error or b.error)
            rows.append(["Keras ResNet-50 SavedModel: time", "not available", "", "", "<= 0.1x", "n/a"])
            notes.append(f"`fusecli analyze` on the SavedModel did not run: {error}")

    print("synthetic residual graphs: 50k vs 100k nodes", file=sys.stderr)
    a, b = interleaved(fusecli(SYNTH[50_000]), fusecli(SYNTH[100_000]), runs, "synthetic")
    if a.ok and b.ok:
        r = b.seconds / a.seconds
        rows.append(["synthetic 100k vs 50k nodes: time", f"{b.seconds:.2f} s (100k)",
                     f"{a.seconds:.2f} s (50k)", f"{r:.2f}x", "<= 2.3x", _met(r, 2.3)])
        rows.append(["synthetic 100k nodes: absolute time", f"{b.seconds:.2f} s", "", "", "< 20 s",
                     "yes" if b.seconds < 20 else "**no**"])
        rows.append(["synthetic 100k vs 50k nodes: peak RSS", f"{b.rss_mib:,.0f} MiB (100k)",
                     f"{a.rss_mib:,.0f} MiB (50k)", f"{b.rss_mib / a.rss_mib:.2f}x", "", ""])
    else:
        rows.append(["synthetic 100k vs 50k nodes", "failed", "", "", "<= 2.3x", "**no**"])
        notes.append(f"synthetic graphs failed: {a.error or b.error}")
    if args.quick:
        notes.append("--quick: BERT-large and the SavedModel were skipped")
    print(write_results(out, rows, notes, runs))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
