"""``fusecli plan``: budgets parsed or refused, a model that fits, the floor, a plan, its files and JSON.

The model is a small residual MLP stack written as the TorchScript exporter names nodes
(``/layers.3/fc1/MatMul``): each block keeps its ReLU output for backward, which checkpointing frees.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from fusecli.cli import main
from fusecli.memory.formulas import evaluate_formula

LAYERS, WIDTH = 4, 16


def stack(layers: int = LAYERS, width: int = WIDTH) -> onnx.ModelProto:
    """x -> [x + relu(x W1 + b1) W2 + b2] per block, named under /layers.N/; dims batch and seq."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        p = f"/layers.{i}"
        for name, shape in ((f"layers.{i}.w1", (width, 4 * width)), (f"layers.{i}.b1", (4 * width,)),
                            (f"layers.{i}.w2", (4 * width, width)), (f"layers.{i}.b2", (width,))):
            inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
        nodes += [helper.make_node("MatMul", [x, f"layers.{i}.w1"], [f"{p}/h0"], name=f"{p}/fc1/MatMul"),
                  helper.make_node("Add", [f"{p}/h0", f"layers.{i}.b1"], [f"{p}/h1"], name=f"{p}/fc1/Add"),
                  helper.make_node("Relu", [f"{p}/h1"], [f"{p}/h2"], name=f"{p}/act/Relu"),
                  helper.make_node("MatMul", [f"{p}/h2", f"layers.{i}.w2"], [f"{p}/h3"],
                                   name=f"{p}/fc2/MatMul"),
                  helper.make_node("Add", [f"{p}/h3", f"layers.{i}.b2"], [f"{p}/h4"], name=f"{p}/fc2/Add"),
                  helper.make_node("Add", [x, f"{p}/h4"], [f"{p}/out"], name=f"{p}/Add")]
        x = f"{p}/out"
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", width]) for n in "xy"]
    graph = helper.make_graph(nodes, "stack", io[:1], io[1:], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.producer_name = "pytorch"
    return model


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("plan") / "stack.onnx"
    onnx.save(stack(), str(path))
    return str(path)


def run(*args):
    return CliRunner().invoke(main, ["plan", *args])


def plan_json(model, budget, *extra) -> tuple[int, dict]:
    r = run(model, "--budget", str(budget), "--batch", "8", "--dim", "seq=32", "--json", *extra)
    assert r.exit_code in (0, 1), r.output
    return r.exit_code, json.loads(r.stdout)


@pytest.fixture(scope="module")
def unplanned(model) -> dict:
    return plan_json(model, "1TiB")[1]


def test_a_model_that_fits_says_so_with_the_headroom(model, unplanned):
    assert unplanned["fits"] and unplanned["plan"] == [] and unplanned["planned"] is None
    peak = unplanned["step_peak"]["bytes"]
    assert unplanned["headroom"] == 2**40 - peak
    assert evaluate_formula(unplanned["step_peak"]["formula"], unplanned["dims"]) == peak
    r = run(model, "--budget", "1TiB", "--batch", "8", "--dim", "seq=32")
    assert r.exit_code == 0 and "fits: headroom" in r.stdout and "nothing to recompute" in r.stdout


def test_memory_lines_by_optimizer_and_precision(model, unplanned):
    m = unplanned["memory"]
    params = m["parameters"]["bytes"] // 4
    assert params == LAYERS * (2 * 4 * WIDTH * WIDTH + 5 * WIDTH)
    assert m["gradients"]["bytes"] == 4 * params and m["optimizer_state"]["bytes"] == 8 * params  # AdamW
    assert plan_json(model, "1TiB", "--optimizer", "sgd")[1]["memory"]["optimizer_state"]["bytes"] == 0
    bf16 = plan_json(model, "1TiB", "--precision", "bf16")[1]
    b = bf16["memory"]
    assert b["parameters"]["bytes"] == 2 * params and b["master_weights"]["bytes"] == 4 * params
    assert b["optimizer_state"]["bytes"] == 8 * params  # fp32 moments beside the fp32 master weights
    assert b["saved_activations"]["bytes"] * 2 == m["saved_activations"]["bytes"]  # float32 -> bf16
    assert bf16["precision"]["precision"] == "bf16" and bf16["precision"]["assumed"]
    amp = plan_json(model, "1TiB", "--precision", "amp-bf16")[1]["memory"]  # fp32 weights, bf16 compute
    assert amp["parameters"]["bytes"] == 4 * params and "master_weights" not in amp
    assert amp["saved_activations"]["bytes"] != m["saved_activations"]["bytes"]
    assert unplanned["precision"] == {"precision": "as exported", "parameter_dtypes": ["float32"]}


@pytest.mark.parametrize("budget", ["abc", "0", "-5GB", "24XB", "1..2GiB", ""])
def test_bad_budget_is_a_usage_error(model, budget):
    r = run(model, "--budget", budget)
    assert r.exit_code == 2 and r.output.startswith("error:") and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize(("text", "value"), [("24GiB", 24 * 2**30), ("500MB", 500 * 10**6),
                                             ("1.5 GiB", 3 * 2**29), ("1073741824", 2**30)])
def test_budget_units(model, text, value):
    assert plan_json(model, text)[1]["budget"] == value


def test_below_the_floor_is_one_line_naming_it(model, unplanned):
    floor = unplanned["floor"]
    r = run(model, "--budget", str(floor - 1), "--batch", "8", "--dim", "seq=32")
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.output.count("\n") == 1 and "below the parameters' own memory" in r.output
    assert f"{floor:,}" in r.output


def test_a_plan_frees_blocks_until_it_fits(model, unplanned, tmp_path):
    saved, peak = unplanned["memory"]["saved_activations"]["bytes"], unplanned["step_peak"]["bytes"]
    budget = peak - saved // 2
    helper_path, plot = tmp_path / "ckpt.py", tmp_path / "curve.png"
    code, doc = plan_json(model, budget, "--emit-pytorch", str(helper_path), "--plot", str(plot))
    assert code == 0 and doc["fits"] and not doc["fits_unplanned"]
    assert doc["plan"] and all(s["kind"] == "block" for s in doc["plan"])
    assert doc["recompute"] == "blocks"  # the helper applies checkpoints only: the plan is made of them
    assert doc["checkpoint_modules"] == [s["name"] for s in doc["plan"]]
    assert doc["checkpoint_modules"][0] == "layers.0"  # ties go in model order: its re-run comes last
    planned = doc["planned"]
    assert planned["step_peak"]["bytes"] <= budget < peak
    assert evaluate_formula(planned["step_peak"]["formula"], doc["dims"]) == planned["step_peak"]["bytes"]
    assert planned["largest"] >= 8 > doc["largest"]
    peaks = [s["step_peak_bytes"] for s in doc["plan"]]
    assert peaks == sorted(peaks, reverse=True)
    assert [c["step_peak_bytes"] for c in doc["curve"]][:len(peaks) + 1] == [peak, *peaks]
    assert plot.stat().st_size > 0
    text = helper_path.read_text()
    compile(text, str(helper_path), "exec")
    assert repr(doc["checkpoint_modules"]) in text and "use_reentrant=False" in text
    r = run(model, "--budget", str(budget), "--batch", "8", "--dim", "seq=32")
    assert "checkpoint(f, *a, use_reentrant=False, **k)" in r.stdout and "layers.0" in r.stdout


def test_emit_pytorch_refuses_fused_recomputes_it_cannot_apply(model, unplanned, tmp_path):
    """--emit-pytorch writes checkpoints: with --recompute all its PREDICTED_SAVED_BYTES and fits would
    count fused-kernel recomputes it never applies, so that pair is refused in one line, nothing written."""
    helper = tmp_path / "ckpt.py"
    r = run(model, "--budget", str(unplanned["step_peak"]["bytes"] // 2), "--batch", "8", "--dim", "seq=32",
            "--recompute", "all", "--emit-pytorch", str(helper))
    assert r.exit_code == 2 and "--recompute blocks" in r.output and len(r.output.strip().splitlines()) == 1
    assert not helper.exists()
    assert unplanned["recompute"] == "all"  # without --emit-pytorch the default plans fused kernels too


def test_largest_batch_is_the_last_that_fits(model, unplanned):
    f = unplanned["step_peak"]["formula"]
    budget = (evaluate_formula(f, {"batch": 5, "seq": 32}) + evaluate_formula(f, {"batch": 6, "seq": 32})) \
        // 2
    _, doc = plan_json(model, budget)
    assert doc["largest"] == 5 and doc["solve"] == "batch"
    _, doc = plan_json(model, budget, "--solve", "seq")
    assert doc["solve"] == "seq" and evaluate_formula(f, {"batch": 8, "seq": doc["largest"]}) <= budget
    assert evaluate_formula(f, {"batch": 8, "seq": doc["largest"] + 1}) > budget


def test_an_unreachable_budget_exits_1_with_the_lowest_peak(model, unplanned):
    code, doc = plan_json(model, unplanned["floor"])
    assert code == 1 and not doc["fits"]
    r = run(model, "--budget", str(unplanned["floor"]), "--batch", "8", "--dim", "seq=32")
    assert r.exit_code == 1 and "does not fit even with every recomputation" in r.stdout


def test_plan_help_imports_no_framework():
    code = ("import sys; from click.testing import CliRunner; import fusecli.cli; "
            "CliRunner().invoke(fusecli.cli.main, ['plan', '--help']); "
            "print(sorted(m for m in ('torch', 'tensorflow', 'onnxruntime', 'matplotlib') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def softmax_mlp() -> onnx.ModelProto:
    """x W1 -> Softmax -> W2: autocast keeps softmax in float32 on CUDA (its fp32 list), not on CPU."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((WIDTH, WIDTH)).astype(np.float32), n)
             for n in ("w1", "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1/MatMul"),
             helper.make_node("Softmax", ["h"], ["p"], axis=-1, name="Softmax"),
             helper.make_node("MatMul", ["p", "w2"], ["y"], name="fc2/MatMul")]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", WIDTH]) for n in "xy"]
    model = helper.make_model(helper.make_graph(nodes, "softmax_mlp", io[:1], io[1:], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.producer_name = "pytorch"
    return model


def test_device_picks_autocasts_lists_as_analyze_does(tmp_path):
    path = str(tmp_path / "softmax_mlp.onnx")
    onnx.save(softmax_mlp(), path)
    saved = {}
    for device in ("cpu", "cuda"):
        doc = plan_json(path, "1TiB", "--precision", "amp-bf16", "--device", device)[1]
        assert doc["precision"]["device"] == device
        saved[device] = doc["memory"]["saved_activations"]["bytes"]
        r = CliRunner().invoke(main, ["analyze", path, "--batch", "8", "--dim", "seq=32", "--json",
                                      "--precision", "amp-bf16", "--device", device])
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["memory"]["saved_activation_bytes"] == saved[device]
    assert saved["cuda"] > saved["cpu"]  # the float32 softmax output on CUDA, bf16 on CPU


def test_plan_takes_routing_as_analyze_does(hf_onnx):
    """--routing balanced sizes the tokens each expert gets in plan too: Mixtral's saved activations are
    analyze's under the same assumption (without it the routed tensors have no size to count)."""
    path = hf_onnx("mixtral", "torchscript", attn="default", cache=False)
    dims = ["--batch", "2", "--dim", "seq=128"]
    r = CliRunner().invoke(main, ["plan", path, *dims, "--budget", "1GiB", "--routing", "balanced", "--json"])
    assert r.exit_code == 0, r.output
    saved = json.loads(r.stdout)["memory"]["saved_activations"]
    a = CliRunner().invoke(main, ["analyze", path, *dims, "--routing", "balanced", "--json"])
    assert saved["bytes"] == json.loads(a.stdout)["memory"]["saved_activation_bytes"] > 0
    assert "routed" in saved["formula"] and "unk__" not in saved["formula"]


def test_the_largest_batch_scales_the_experts_tokens(hf_onnx):
    """Under --routing balanced each expert's token count grows with the batch: the largest batch plan
    solves for from batch 2 fits when the model is analysed at it and the next does not (before, the
    counts stayed at batch 2's and the peaks that hold them were left out: 112 where 27 fits)."""
    path = hf_onnx("mixtral", "torchscript", attn="default", cache=False)

    def plan(batch: int) -> dict:
        r = CliRunner().invoke(main, ["plan", path, "--batch", str(batch), "--dim", "seq=128", "--budget",
                                      "64MiB", "--routing", "balanced", "--json"])
        assert r.exit_code in (0, 1), r.output
        return json.loads(r.stdout)

    largest = plan(2)["largest"]
    assert largest > 2
    at, above = plan(largest), plan(largest + 1)
    assert at["step_peak"]["bytes"] <= 64 * 2**20 < above["step_peak"]["bytes"]
    assert at["largest"] == largest
