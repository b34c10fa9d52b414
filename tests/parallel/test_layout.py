"""``plan``'s data-parallel flags: what a layout may be, and the ranks it reports (their bytes are judged
against real ranks in test_ranks.py); on the shipped decoder sample, no framework needed."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from fusecli.cli import main
from fusecli.parallel.layout import Layout
from fusecli.parallel.ranks import rank_memory, zero1_owners
from fusecli.pipeline import Options, analyze
from tests.conftest import SAMPLES

DECODER = str(SAMPLES / "decoder" / "llama_tiny.onnx")
SIZED = ["--batch", "2", "--dim", "seq=64", "--budget", "1GiB"]


def _plan(*args: str):
    return CliRunner().invoke(main, ["plan", DECODER, *SIZED, *args])


@pytest.mark.parametrize(("flags", "said"), [
    (["--dp-replicate", "2", "--dp-shard", "3", "--world", "5"], "the degrees multiply to 6"),
    (["--zero", "1"], "--zero 1 needs replicas"),
    (["--zero", "1", "--dp-replicate", "2", "--dp-shard", "2"], "sharded already"),
    (["--zero", "3", "--dp-replicate", "2"], "give --dp-shard N"),
    (["--no-reshard-after-forward"], "an FSDP setting"),
    (["--tp", "4"], "2 K/V heads, which do not divide over 4 ranks"),
    (["--tp", "3"], "output columns"),
    (["--tp", "2", "--dp-replicate", "2", "--zero", "1"], "not modelled yet"),
    (["--sp"], "give --tp N"),
    (["--pp", "3"], "has 2 blocks, fewer than the stages"),
    (["--pp", "2", "--microbatches", "3"], "the batch, 2, is not a multiple of it"),
    (["--pp", "2", "--tp", "2", "--sp"], "not modelled yet"),
    (["--pp", "2", "--tp", "2", "--dp-replicate", "2"], "not modelled yet"),
    (["--pp", "2", "--dp-shard", "2", "--dp-replicate", "2"], "not modelled yet"),
    (["--pp", "2", "--microbatches", "1"], "Schedule1F1B needs at least one microbatch per stage"),
    (["--microbatches", "2"], "give --pp N"),
    (["--pp-schedule", "gpipe"], "give --pp N"),
])
def test_a_layout_that_cannot_run_is_one_line_and_exit_2(flags, said):
    done = _plan(*flags)
    assert done.exit_code == 2, done.output
    assert said in done.output and "Traceback" not in done.output
    assert len([line for line in done.output.splitlines() if line.startswith("error")]) == 1


def test_the_json_has_every_rank_once_and_the_text_fits_80_columns():
    done = _plan("--dp-shard", "8", "--json")
    assert done.exit_code == 0, done.output
    doc = json.loads(done.output)
    assert doc["layout"]["world"] == 8 and doc["layout"]["global_batch"] == 16
    ids = sorted(r for e in doc["ranks"] for r in e["ranks"])
    assert ids == list(range(8))
    keys = {"ranks", "parameter_bytes", "gradient_bytes", "optimizer_bytes", "saved_activation_bytes",
            "buffer_bytes", "peak_bytes", "fits"}
    assert all(keys <= set(e) for e in doc["ranks"])
    assert doc["ranks_fit"] and doc["ranks_largest"] >= 2
    text = _plan("--dp-shard", "8")
    assert text.exit_code == 0 and "per rank: FSDP 8 on 8 ranks" in text.output
    table = text.output[text.output.index("per rank:"):].splitlines()
    assert max(len(line) for line in table) <= 80


def test_an_uneven_shard_tells_its_rank_apart():
    """FSDP2 pads dim 0 to ceil(d0 / N) rows: the embedding's 100 rows over 8 ranks are 13 on ranks 0-6
    and 9 on rank 7, whose optimizer state (AdamW: two fp32 moments per element) is smaller by 4 rows."""
    a = analyze(DECODER, Options(batch=2, dims={"seq": 64}))
    entries = rank_memory(a, Layout(dp_shard=8))
    assert [e.ranks for e in entries] == [[0, 1, 2, 3, 4, 5, 6], [7]]
    assert entries[0].optimizer_bytes - entries[1].optimizer_bytes == 2 * 4 * 4 * 64
    assert entries[0].parameter_bytes == entries[1].parameter_bytes  # the padded shard, every rank alike


def test_a_budget_below_every_ranks_state_exits_1_and_one_below_a_devices_does_not():
    """The budget is each rank's: below one device's floor (parameters, gradients and state) is no error
    with 8 shards; below a rank's own resident state nothing fits, exit 1 with the ranks said."""
    a = analyze(DECODER, Options(batch=1, dims={"seq": 2}))
    rank, *_ = rank_memory(a, Layout(dp_shard=8))
    single, = rank_memory(a, Layout())
    floor = single.parameter_bytes + single.gradient_bytes + single.optimizer_bytes
    assert rank.peak_bytes < floor
    done = CliRunner().invoke(main, ["plan", DECODER, "--batch", "1", "--dim", "seq=2", "--budget",
                                     str(rank.peak_bytes), "--dp-shard", "8", "--json"])
    assert done.exit_code == 0 and json.loads(done.output)["ranks_fit"], done.output
    done = CliRunner().invoke(main, ["plan", DECODER, "--batch", "1", "--dim", "seq=2", "--budget",
                                     str(rank.parameter_bytes + rank.optimizer_bytes), "--dp-shard", "8",
                                     "--json"])
    assert done.exit_code == 1 and json.loads(done.output)["ranks_fit"] is False


def test_sharding_leaves_the_activations_and_shrinks_the_state():
    a = analyze(DECODER, Options(batch=2, dims={"seq": 64}))
    one, = rank_memory(a, Layout(dp_replicate=2))
    shard, = rank_memory(a, Layout(dp_shard=2))
    assert shard.saved_activation_bytes == one.saved_activation_bytes == a.liveness.saved_activation_bytes
    assert shard.optimizer_bytes < one.optimizer_bytes and shard.parameter_bytes < one.parameter_bytes


def test_zero1_gives_the_largest_parameter_first_to_the_emptiest_rank():
    """torch's ZeroRedundancyOptimizer._partition_parameters: sorted by size, largest first, each to the
    rank with the fewest elements so far (ties: the lowest rank)."""
    assert zero1_owners([10, 40, 30, 20], 2) == [0, 0, 1, 1]
    assert zero1_owners([5, 5, 5], 2) == [0, 1, 0]


def test_a_rank_that_misses_gets_the_plans_checkpoints_and_then_fits():
    """Between the checkpointed and the unplanned peak: every rank misses with nothing recomputed, and
    the per-rank plan takes the one-device plan's first steps until each rank fits."""
    a = analyze(DECODER, Options(batch=2, dims={"seq": 64}))
    unplanned = max(e.peak_bytes for e in rank_memory(a, Layout(dp_shard=2)))
    done = CliRunner().invoke(main, ["plan", DECODER, "--batch", "2", "--dim", "seq=64", "--budget",
                                     str(unplanned - 1), "--dp-shard", "2", "--recompute", "blocks",
                                     "--json"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.output)
    assert not any(e["fits"] for e in doc["ranks"]) and doc["ranks_fit"]
    planned = doc["ranks_plan"]
    assert planned["recompute"] and all(e["fits"] for e in planned["ranks"])
    assert all(p["saved_activation_bytes"] < u["saved_activation_bytes"]
               for p, u in zip(planned["ranks"], doc["ranks"], strict=True))


def test_emit_pytorch_with_a_layout_is_refused(tmp_path):
    done = _plan("--dp-shard", "2", "--emit-pytorch", str(tmp_path / "helper.py"))
    assert done.exit_code == 2 and "one device's plan" in done.output
    assert not (tmp_path / "helper.py").exists()


def test_analyze_json_gives_the_ranks_in_its_memory():
    done = CliRunner().invoke(main, ["analyze", DECODER, *SIZED[:4], "--dp-replicate", "2", "--zero", "1",
                                     "--json"])
    assert done.exit_code == 0, done.output
    memory = json.loads(done.output)["memory"]
    assert memory["layout"]["name"] == "DDP 2 + ZeRO-1" and memory["layout"]["optimizer"] == "adamw"
    owners = [e["optimizer_bytes"] for e in memory["ranks"]]
    assert len(owners) == 2 and owners[0] != owners[1]  # each rank the state of the parameters it owns
    assert all(e["saved_activation_bytes"] == memory["saved_activation_bytes"] for e in memory["ranks"])


@pytest.mark.parametrize("layout", [Layout(dp_replicate=3, dp_shard=8), Layout(dp_replicate=24, zero=1),
                                    Layout(dp_shard=100)])
def test_every_rank_is_told_once_and_replicas_of_a_shard_alike(layout):
    """The ranks are evaluated once per class that can differ (shard index ranges, ZeRO-1 owners): the
    classes cover the world once, and HSDP's replicas of one shard index share their entry."""
    a = analyze(DECODER, Options(batch=1, dims={"seq": 8}))
    entries = rank_memory(a, layout)
    ids = sorted(r for e in entries for r in e.ranks)
    assert ids == list(range(layout.size))
    where = {r: k for k, e in enumerate(entries) for r in e.ranks}
    n = layout.dp_shard
    if layout.sharded:
        assert all(where[r] == where[r % n] for r in range(layout.size))
    else:  # ZeRO-1 over 24 replicas: 24 ranks, fewer parameters than that own state on some
        assert len(entries) > 1
    if layout.dp_shard == 100:  # 100 embedding rows over 100 shards: one each; 64-row weights: ranks >= 64
        assert len(entries) > 1  # hold none of them


def test_tensor_parallel_splits_the_pairs_and_keeps_the_norms_whole():
    """--tp 2 on the decoder sample (4 query heads, 2 K/V heads): q, k, v, o, gate, up and down are split
    (their weights halved), the embedding and the norms are whole on each rank; the ranks read one batch."""
    a = analyze(DECODER, Options(batch=2, dims={"seq": 64}))
    whole, = rank_memory(a, Layout())
    split, = rank_memory(a, Layout(tp=2))
    assert split.ranks == [0, 1]
    matmul = 2 * 4 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128)  # 2 layers: q, o 64x64; k, v 64x32; MLP
    assert whole.parameter_bytes - split.parameter_bytes == matmul // 2
    assert whole.saved_activation_bytes / 2 < split.saved_activation_bytes < whole.saved_activation_bytes
    done = CliRunner().invoke(main, ["plan", DECODER, *SIZED, "--tp", "2", "--json"])
    assert json.loads(done.output)["layout"]["global_batch"] == 2


def test_a_model_that_trains_as_tensorflow_does_gets_no_torch_layout():
    done = CliRunner().invoke(main, ["analyze", DECODER, *SIZED[:4], "--autodiff", "tensorflow",
                                     "--dp-shard", "2", "-q"])
    assert done.exit_code == 2 and "models PyTorch's DDP, FSDP2" in done.output


def test_sequence_parallel_splits_the_norms_and_residuals_too():
    """--tp 2 --sp: what tensor parallelism left whole in the blocks (the norms, the residual stream) is
    halved along the sequence, but for each column-parallel matmul's gathered input, which it saves."""
    a = analyze(DECODER, Options(batch=2, dims={"seq": 64}))
    tp, = rank_memory(a, Layout(tp=2))
    sp, = rank_memory(a, Layout(tp=2, sp=True))
    assert sp.parameter_bytes == tp.parameter_bytes and sp.gradient_bytes == tp.gradient_bytes
    assert sp.saved_activation_bytes < tp.saved_activation_bytes and sp.peak_bytes < tp.peak_bytes
    # per block, the gathered inputs of q/k/v and gate/up stay whole: (batch, seq, hidden) fp32 twice
    gathered = 2 * 2 * (2 * 64 * 64 * 4)
    assert sp.saved_activation_bytes > tp.saved_activation_bytes / 2 + gathered / 2
    done = CliRunner().invoke(main, ["plan", DECODER, *SIZED, "--tp", "2", "--sp", "--json"])
    assert done.exit_code == 0 and json.loads(done.output)["layout"]["name"] == "TP 2 + SP"


def test_a_pipeline_tells_its_stages_apart_by_what_they_hold_in_flight():
    """--pp 2: each stage holds its own blocks' parameters; under 1F1B stage 0 holds two microbatches'
    activations and stage 1 one, under GPipe both hold all of them."""
    a = analyze(DECODER, Options(batch=8, dims={"seq": 64}))
    whole, = rank_memory(a, Layout())
    one = {e.ranks[0]: e for e in rank_memory(a, Layout(pp=2, microbatches=4))}
    gpipe = {e.ranks[0]: e for e in rank_memory(a, Layout(pp=2, microbatches=4, pp_schedule="gpipe"))}
    assert sorted(one) == [0, 1] and sorted(gpipe) == [0, 1]
    # every trained weight's gradient on the stage that reads it; weights both stages read are on both
    # (the sample's export shares one RMSNorm weight among its norms, all ones; the rotary table)
    both = one[0].parameter_bytes + one[1].parameter_bytes
    assert whole.parameter_bytes < both < 1.01 * whole.parameter_bytes
    assert one[0].buffer_bytes == one[1].buffer_bytes == 4 * (2 * 64 * 64 * 4)  # (2, 64, 64) per microbatch
    for s in (0, 1):
        assert gpipe[s].saved_activation_bytes == 4 * (one[s].saved_activation_bytes // (2 - s))
        assert gpipe[s].peak_bytes > one[s].peak_bytes or s == 1
    assert one[0].saved_activation_bytes < whole.saved_activation_bytes
    done = CliRunner().invoke(main, ["plan", DECODER, "--batch", "8", "--dim", "seq=64", "--budget", "1GiB",
                                     "--pp", "2", "--microbatches", "4", "--json"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.output)
    assert doc["layout"]["pp"] == 2 and doc["layout"]["microbatches"] == 4
    assert [e["ranks"] for e in doc["ranks"]] == [[0], [1]]
    assert doc["ranks_largest"] % 4 == 0


def test_a_pipeline_that_does_not_fit_gets_the_one_device_plans_recomputations():
    """--pp with a budget the first stage misses: the one-device plan's recomputations, in order, until
    every stage fits, each stage priced with them (their bytes judged in test_pipeline's ckpt cases);
    the text says how the plan was made and stays within 80 columns."""
    args = ["plan", DECODER, "--batch", "8", "--dim", "seq=512", "--budget", "9MiB", "--pp", "2",
            "--microbatches", "4"]
    done = CliRunner().invoke(main, [*args, "--json"])
    assert done.exit_code == 0, done.output
    doc = json.loads(done.output)
    before = {e["ranks"][0]: e for e in doc["ranks"]}
    assert not before[0]["fits"] and before[1]["fits"]
    planned = doc["ranks_plan"]
    assert doc["ranks_fit"] and planned["recompute"] and all(e["fits"] for e in planned["ranks"])
    after = {e["ranks"][0]: e for e in planned["ranks"]}
    assert after[0]["saved_activation_bytes"] < before[0]["saved_activation_bytes"]
    assert "one-device plan's" in doc["ranks_note"]
    text = CliRunner().invoke(main, args).output
    table = text[text.index("per rank:"):].splitlines()
    assert max(len(line) for line in table) <= 80 and "pipeline, global" not in "".join(table[3:])
