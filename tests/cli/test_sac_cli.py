"""``--sac`` / ``--sac-save`` on the command line: analyze's figures under the policy, plan's blocks
checkpointed under it and the policy function --emit-pytorch writes, and the pairs refused in one line.

The model is test_plan_cli's residual MLP stack (TorchScript's node names, each fc a MatMul + Add: the
addmm PyTorch dispatches for a linear with bias).
"""

from __future__ import annotations

import json

import onnx
import pytest
from click.testing import CliRunner

from fusecli.cli import main
from tests.cli.test_plan_cli import stack

SIZES = ["--batch", "8", "--dim", "seq=32"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("sac") / "stack.onnx"
    onnx.save(stack(), str(path))
    return str(path)


def run(*args):
    return CliRunner().invoke(main, list(args))


def analyze_json(model, *extra) -> dict:
    r = run("analyze", model, *SIZES, "--json", *extra)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_analyze_reports_the_step_under_the_policy(model):
    plain = analyze_json(model)["memory"]
    full, addmm = (analyze_json(model, *flags)["memory"] for flags in (["--sac", "full"],
                                                                           ["--sac-save", "aten.addmm"]))
    assert "sac" not in plain
    for doc, policy in ((full, "full"), (addmm, "custom")):
        sac = doc["sac"]
        assert sac["policy"] == policy
        assert doc["saved_activation_bytes"] == sac["saved_activation_bytes"]
        assert doc["peak_bytes"] == sac["peak_bytes"]
        assert sac["without_policy"]["saved_activation_bytes"] == plain["saved_activation_bytes"]
        assert len(sac["blocks"]) == 4
    # full checkpointing keeps each block's input only; caching the addmm outputs re-runs fewer FLOPs but
    # holds more than no checkpoint at all: fc1's output, which autograd does not save (ReLU keeps its own
    # output), is cached beside the block's input and fc2's output
    assert full["saved_activation_bytes"] < plain["saved_activation_bytes"] < \
        addmm["sac"]["saved_activation_bytes"]
    assert 0 < addmm["sac"]["recompute_flops"] < full["sac"]["recompute_flops"]
    ops = addmm["sac"]["blocks"][0]["ops"]
    assert [(o["op"], o["saved"]) for o in ops] == [("aten.addmm", True), ("aten.relu", False),
                                                    ("aten.addmm", True), ("aten.add", False)]
    text = run("analyze", model, *SIZES, "--sac", "torchtitan").output
    assert "selective checkpointing (torchtitan, every block)" in text


def test_plan_checkpoints_blocks_under_the_policy_and_writes_it(model, tmp_path):
    unplanned = json.loads(run("plan", model, "--budget", "1TiB", *SIZES, "--json").stdout)
    saved, peak = unplanned["memory"]["saved_activations"]["bytes"], unplanned["step_peak"]["bytes"]
    budget = str(peak - saved // 3)
    helper = tmp_path / "sac.py"
    r = run("plan", model, "--budget", budget, *SIZES, "--json", "--sac", "attention",
            "--emit-pytorch", str(helper))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["sac"] == {"policy": "attention", "save_ops": None, "calls": None}
    assert doc["recompute"] == "blocks" and doc["fits"] and doc["plan"]
    assert doc["planned"]["step_peak"]["bytes"] <= int(budget)
    text = helper.read_text()
    compile(text, str(helper), "exec")
    assert "context_fn=lambda: context_fn(_path)" in text
    assert "'aten._scaled_dot_product_flash_attention_for_cpu'," in text
    assert "EVERY_SECOND_MM_RECOMPUTED = False" in text
    # torchtitan's saves every addmm here (no mm to skip): its checkpoints free nothing, the plan cannot fit
    r = run("plan", model, "--budget", budget, *SIZES, "--json", "--sac", "torchtitan")
    assert r.exit_code == 1 and json.loads(r.stdout)["plan"] == []
    # the same plan as plain block checkpoints frees more per block: it needs no more blocks
    plain = json.loads(run("plan", model, "--budget", budget, *SIZES, "--json", "--recompute",
                           "blocks").stdout)
    assert len(plain["plan"]) <= len(doc["plan"])
    # saving the residual add's output: each block's output, the next block's input, which it keeps anyway
    out = run("plan", model, "--budget", budget, *SIZES, "--sac-save", "add").output
    assert "selective checkpointing: saving aten.add" in out and "context_fn=lambda: context_fn(p)" in out


def test_recompute_ops_chooses_the_calls_for_the_budget(model, tmp_path):
    unplanned = json.loads(run("plan", model, "--budget", "1TiB", *SIZES, "--json").stdout)
    saved, peak = unplanned["memory"]["saved_activations"]["bytes"], unplanned["step_peak"]["bytes"]
    budget = str(peak - saved // 3)
    blocks = json.loads(run("plan", model, "--budget", budget, *SIZES, "--json", "--recompute",
                            "blocks").stdout)
    helper = tmp_path / "ops.py"
    r = run("plan", model, "--budget", budget, *SIZES, "--json", "--recompute", "ops", "--emit-pytorch",
            str(helper))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["fits"] and doc["sac"]["policy"] == "chosen"
    calls = doc["sac"]["calls"]
    assert calls and {c["op"] for c in calls} == {"aten.addmm"}
    assert all(c["peak_bytes"] <= int(budget) for c in calls if c["saved"])
    assert all("over the budget" in c["why"] for c in calls if not c["saved"])
    # never more re-run FLOPs than the whole blocks the block plan checkpoints at the same budget
    assert sum(s["flops"] for s in doc["plan"]) <= sum(s["flops"] for s in blocks["plan"])
    text = helper.read_text()
    compile(text, str(helper), "exec")
    assert "SAVE_CALLS = {" in text and "context_fn=lambda: context_fn(_path)" in text


@pytest.mark.parametrize(("args", "says"), [
    (["--recompute", "ops", "--sac", "torchtitan"], "chooses the policy itself"),
    (["--sac", "torchtitan", "--recompute", "all"], "--recompute blocks"),
    (["--sac", "megatron", "--emit-pytorch", "{tmp}/h.py"], "Megatron"),
    (["--sac", "full", "--sac-save", "aten.mm"], "exclude each other"),
    (["--sac-save", "@{tmp}/missing.txt"], "cannot read"),
    (["--sac-save", "mm;rm -rf"], "not an aten op name"),
    (["--sac-save", "@{model}"], "not a text file"),
    (["--sac", "everything"], "everything"),
])
def test_bad_policy_flags_are_one_line_usage_errors(model, tmp_path, args, says):
    args = [a.format(tmp=tmp_path, model=model) for a in args]
    r = run("plan", model, "--budget", "1MiB", *SIZES, *args)
    assert r.exit_code == 2, r.output
    assert says in r.output and len(r.output.strip().splitlines()) <= 3
    assert not (tmp_path / "h.py").exists()


def test_a_model_not_from_pytorch_is_refused_and_one_without_blocks_says_so(tmp_path):
    from tests.cli.test_plan_cli import stack as blocks

    model = blocks(layers=1)
    model.producer_name = "tf2onnx"
    path = tmp_path / "tf.onnx"
    onnx.save(model, str(path))
    r = run("analyze", str(path), *SIZES, "--sac", "torchtitan")
    assert r.exit_code == 2 and "--autodiff pytorch" in r.output and len(r.output.strip().splitlines()) == 1
    r = run("plan", str(path), "--budget", "1MiB", *SIZES, "--sac", "torchtitan")
    assert r.exit_code == 2 and "--autodiff pytorch" in r.output
    # one MLP whose nodes carry no list index: no block to checkpoint, and the report says so
    flat = blocks(layers=1)
    for n in flat.graph.node:
        n.name = n.name.replace("/layers.0", "")
    onnx.save(flat, str(path))
    doc = analyze_json(str(path), "--sac", "torchtitan")["memory"]
    assert doc["sac"]["blocks"] == [] and "no repeated blocks" in doc["sac"]["note"]
    assert doc["sac"]["saved_activation_bytes"] == doc["sac"]["without_policy"]["saved_activation_bytes"]


def test_a_reordered_file_says_its_call_numbers_may_not_be_pytorchs(model, tmp_path):
    """A block's calls are numbered in the order the exporter traced them (the file's); a file whose
    nodes were reordered (ONNX Runtime loads one) has no such order, and the report says so."""
    shuffled = onnx.load(model)
    nodes = list(shuffled.graph.node)[::-1]
    del shuffled.graph.node[:]
    shuffled.graph.node.extend(nodes)
    path = tmp_path / "reversed.onnx"
    onnx.save(shuffled, str(path))
    for m, warned in ((model, False), (str(path), True)):
        r = CliRunner().invoke(main, ["analyze", m, *SIZES, "--json", "--sac", "torchtitan"])
        assert r.exit_code == 0, r.output
        assert ("not in the order its exporter traced" in r.stderr) == warned


def test_analyze_lists_every_preset_and_plots_their_front(model, tmp_path):
    """memory.sac.presets: each preset's peak and re-run FLOPs, as analyze --sac of that preset reports
    them, the Pareto front marked; --plot draws them (a PNG) and says how many are on the front."""
    pytest.importorskip("matplotlib")
    sac = analyze_json(model, "--sac", "matmul")["memory"]["sac"]
    points = {p["policy"]: p for p in sac["presets"]}
    assert set(points) == {"none", "full", "attention", "matmul", "torchtitan", "megatron"}
    for name in ("none", "full", "torchtitan"):
        alone = analyze_json(model, "--sac", name)["memory"]["sac"]
        assert (points[name]["peak_bytes"], points[name]["recompute_flops"]) == \
            (alone["peak_bytes"], alone["recompute_flops"])
    front = {n for n, p in points.items() if p["pareto"]}
    assert "none" in front  # nothing re-run: nothing re-runs fewer FLOPs
    for n in front:  # no point beats a front point on both axes
        assert not any(q["peak_bytes"] <= points[n]["peak_bytes"] and
                       q["recompute_flops"] <= points[n]["recompute_flops"] and m != n and
                       (q["peak_bytes"], q["recompute_flops"]) != (points[n]["peak_bytes"],
                                                                   points[n]["recompute_flops"])
                       for m, q in points.items())
    custom = analyze_json(model, "--sac-save", "aten.relu")["memory"]["sac"]["presets"]
    assert [p["policy"] for p in custom][-1] == "custom"
    out = tmp_path / "sac.png"
    r = run("analyze", model, *SIZES, "--sac", "matmul", "--plot", str(out))
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{len(front)} on the Pareto front" in r.output
    assert "least peak for the re-run FLOPs (Pareto): none" in run("analyze", model, *SIZES, "--sac",
                                                                   "matmul").output
