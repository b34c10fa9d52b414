"""The human report at 80 columns: golden output on a Keras 3 export and a transformers export, and the
rules behind it (fits, no two rows alike, shapes as text, -q / -v, names shortened, linear time).

Regenerate the golden files after a deliberate change:
FUSECLI_UPDATE_GOLDEN=1 pytest tests/report/test_text.py
"""

from __future__ import annotations

import os
import re
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from onnx import helper

from fusecli.cli import main
from fusecli.core.names import common_scope, cut, fit_unique, last_segments, name_pattern
from fusecli.core.units import format_bytes, sum_bytes
from fusecli.fusion.recompute import Recompute
from fusecli.fusion.verdict import Verdict
from fusecli.pipeline import Options, analyze
from fusecli.report.text import TextOptions, report_lines, summary_lines, verdict_class
from tests.builders import Net

GOLDEN = Path(__file__).parent / "golden"
WIDTH = 80


def report(path: str, *args: str, columns: int = WIDTH) -> str:
    r = CliRunner().invoke(main, ["analyze", path, *args], env={"COLUMNS": str(columns)})
    assert r.exit_code == 0, r.output
    return r.stdout


def check_golden(name: str, text: str, path: str) -> None:
    text = text.replace(path, "<model>")
    golden = GOLDEN / f"{name}.txt"
    if os.environ.get("FUSECLI_UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def tables(text: str) -> list[list[str]]:
    """Rows of each block of lines indented by two spaces (tables and match groups)."""
    blocks, block = [], []
    for line in text.splitlines():
        if line.startswith("  ") and not line.startswith("      "):
            block.append(line)
        elif block and not line.startswith("      "):
            blocks.append(block)
            block = []
    return blocks + ([block] if block else [])


def assert_readable(text: str, most_lines: int | None = None) -> None:
    lines = text.splitlines()
    assert all(len(line) <= WIDTH for line in lines), max(lines, key=len)
    if most_lines is not None:
        assert len(lines) <= most_lines
    for rows in tables(text):
        assert len(rows) == len(set(rows)), rows  # no two rows of a table read the same


# ---- models -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keras_resnet(tmp_path_factory) -> str:
    """A Keras 3 ResNet-like model (stem, two stages of two residual blocks), exported with model.export()."""
    pytest.importorskip("tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras

    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    layers = keras.layers

    def conv_bn(x, filters, name, relu=True, stride=1):
        x = layers.Conv2D(filters, 3, strides=stride, padding="same", name=f"{name}_conv")(x)
        x = layers.BatchNormalization(name=f"{name}_bn")(x)
        return layers.ReLU(name=f"{name}_relu")(x) if relu else x

    x = inp = keras.Input((16, 16, 3), name="image")
    x = conv_bn(x, 8, "stem")
    for stage, filters in ((1, 8), (2, 16)):
        for block in (1, 2):
            name = f"stage{stage}_block{block}"
            stride = 2 if stage == 2 and block == 1 else 1
            y = conv_bn(x, filters, f"{name}_1", stride=stride)
            y = conv_bn(y, filters, f"{name}_2", relu=False)
            if stride != 1 or x.shape[-1] != filters:
                x = conv_bn(x, filters, f"{name}_0", relu=False, stride=stride)
            x = layers.ReLU(name=f"{name}_out")(layers.Add(name=f"{name}_add")([x, y]))
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    model = keras.Model(inp, layers.Dense(10, name="logits")(x))
    path = str(tmp_path_factory.mktemp("keras") / "resnet_small")
    model.export(path, verbose=False)
    return path


@pytest.fixture(scope="module")
def bert(tmp_path_factory) -> str:
    """A BertModel from a small transformers config (2 layers, hidden 64), exported by PyTorch."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.rewrite.test_bert import _export

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _export(tmp_path_factory.mktemp("bert") / "bert.onnx", 17)


# ---- golden output --------------------------------------------------------------------------------

def test_keras_resnet_report_at_80_columns(keras_resnet):
    text = report(keras_resnet, "--batch", "8")
    check_golden("keras_resnet", text, keras_resnet)
    assert_readable(text, most_lines=61)  # 60, and the precision line (issue 41)
    assert "input: image float32 [batch, 16, 16, 3]" in text  # shapes show, as text
    assert "names: …/ stands for StatefulPartitionedCall/" in text
    assert "stage*_block*_" in text  # repeated blocks are one line with a name pattern


def test_bert_report_at_80_columns(bert):
    text = report(bert, "--batch", "2", "--dim", "seq=16")
    check_golden("bert", text, bert)
    assert_readable(text)
    assert "input: input_ids int64 [batch, seq]" in text
    assert "layer.*" in text  # the two encoder layers' matches are grouped


def test_verbose_lists_every_match_and_saved_tensor(keras_resnet):
    a = analyze(keras_resnet, Options(batch=8))
    text = report(keras_resnet, "--batch", "8", "-v")
    assert sum(line.startswith("    - ") for line in text.splitlines()) == len(a.matches)
    assert "saved for backward\n" in text and len(a.liveness.saved) > 10
    assert all(len(line) <= WIDTH for line in text.splitlines())


def test_quiet_prints_the_summary_only(keras_resnet):
    text = report(keras_resnet, "--batch", "8", "-q")
    assert "fusion:" in text and "  saved: " in text
    assert "matches (" not in text and "largest" not in text


def test_wider_terminals_get_more(bert):
    narrow = report(bert, "--batch", "2", "--dim", "seq=16")
    wide = report(bert, "--batch", "2", "--dim", "seq=16", columns=160)
    assert max(map(len, wide.splitlines())) > WIDTH
    assert len(wide.splitlines()) <= len(narrow.splitlines())


# ---- rules ---------------------------------------------------------------------------------------

def test_names_are_text_never_markup(save_model):
    net = Net(x=("N", 3, 8, 8))
    y = net.act("Relu", net.bias(net.conv("x", name="[bold]conv[x]"), name="[batch...]"), name="[red]y")
    text = report(save_model(net.model(y)), "--batch", "2")
    assert "[bold]conv[x]" in text and "[red]y" in text and "[N, 3, 8, 8]" in text


def test_common_scope_cut_and_unique_rows():
    names = [f"Model/layer_{i}/conv/ReadVariableOp:0" for i in range(12)] + ["input"]
    assert common_scope(names) == "Model/"
    assert common_scope(["a/b/c", "a/b/d", "x"]) == ""  # under 80% share it
    shown = fit_unique([n.removeprefix("Model/") for n in names], 16)
    assert len(set(shown)) == len(shown) and all(len(s) <= 16 for s in shown)
    long = ["s" * 5000 + "/layer0/conv_out", "s" * 5000 + "/layer0/relu_out"]
    shown = fit_unique(long, 30)
    assert len(set(shown)) == 2 and all(len(s) <= 30 for s in shown)
    assert cut("abcdefghij", 5) == "a…hij" and cut("abc", 5) == "abc"
    assert name_pattern(["conv2_block1_1_conv", "conv2_block2_1_conv"]) == "conv2_block*_1_conv"
    assert last_segments("M/conv3_block1_0_bn/batchnorm/add_1", "M/") == "conv3_block1_0_bn/batchnorm/add_1"
    shown = last_segments("encoder/layer.0/attention/self/query/MatMul")
    assert shown == "…/layer.0/attention/self/query/MatMul"


def test_unknown_sizes_print_a_question_mark():
    assert format_bytes(None) == "?" and format_bytes(1536) == "1.5 KiB"
    assert sum_bytes([1, None, 2]) is None and sum_bytes([1, 2]) == 3


def _match(pattern: str, training: bool, inference: bool, recompute=None, phase="forward"):
    verdict = Verdict(inference, training, "r", recompute=recompute)
    node = SimpleNamespace(name="n", op_type="Op")
    return SimpleNamespace(pattern=SimpleNamespace(name=pattern, phase=phase), verdict=verdict, nodes=[node])


def test_training_safe_if_recomputed_is_counted():
    """A verdict with a ``recompute`` plan (issue 14's ladder) lights up its own column."""
    plan = Recompute(["t"], flops=10, bytes_freed=100, bytes_kept=4)
    matches = [_match("attention", False, True, plan), _match("attention", False, True),
               _match("attention", True, True)]
    assert [verdict_class(m) for m in matches] == ["training-safe if recomputed", "inference only",
                                                   "training-safe"]
    a = SimpleNamespace(matches=matches)
    lines = summary_lines(a, WIDTH, lambda s, **kw: s)
    row = next(line for line in lines if line.strip().startswith("attention"))
    assert row.split()[1:5] == ["3", "3", "1", "1"]  # matches, inference, training, recompute


def test_backward_patterns_print_no_inference_count():
    a = SimpleNamespace(matches=[_match("bn_grad_relu_grad", True, False, phase="backward")])
    row = [line for line in summary_lines(a, WIDTH, lambda s, **kw: s) if "bn_grad_relu_grad" in line][0]
    assert row.split()[1:] == ["1", "-", "1", "-", "-"]


def test_not_fusable_matches_are_listed_with_their_reason(save_model):
    net = Net(x=("N", 3, 8, 8))
    c = net.conv("x", name="conv")
    b = net.bias(c, name="bias")
    y = net.act("Relu", b, name="relu")
    z = net.op("Sigmoid", "side", b)  # the bias output is read outside the match
    text = report(save_model(net.model(y, z)), "--batch", "2")
    assert "not fused, and why" in text
    section = " ".join(text.split("not fused, and why")[1].split())
    assert "conv_bias_act: not fusable: bias_out (made by bias) is also read by side outside the match" \
        in section
    lines = text.splitlines()
    k = lines.index("  conv_bias_act  not fusable  conv")
    assert "TF, ORT: not fused" in lines[k + 1] and "yes" not in lines[k + 1]  # agrees with the verdict


def _long_model(save_model, length: int) -> str:
    net = Net()
    x = "x"
    for i in range(4):
        p = f"scope{i}/" + "n" * length + f"/layer{i}"
        x = net.act("Relu", net.bn(net.conv(x, name=p + "/conv", cin=3 if i == 0 else 4), name=p + "/bn"),
                    name=p + "/relu")
    return save_model(net.model(x))


def test_text_report_is_linear_in_name_length(save_model):
    """50k-character names: the report takes about what --json takes, and every line fits."""
    path = _long_model(save_model, 50_000)
    a = analyze(path, Options(batch=2))
    start = time.perf_counter()
    lines = report_lines(a, TextOptions(width=WIDTH, verbose=True))
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0 and all(len(line) <= WIDTH for line in lines)
    shown = [line for line in lines if "/layer" in line]
    assert shown and all(re.search(r"scope\d/n", line) or "layer" in line for line in shown)


# ---- recompute lines (issue 27) -------------------------------------------------------------------

def test_recompute_lines_say_what_they_free(bert):
    """At seq=16 the gelu Mul of BERT's FFN keeps as much as it frees and says so (its attention, whose q and
    k^T eager matmul saves as copies anyway, frees P net); the total never exceeds today's saved bytes."""
    import json

    r = CliRunner().invoke(main, ["analyze", bert, "--batch", "2", "--dim", "seq=16", "--json"])
    doc = json.loads(r.stdout)
    recomputes = [p for p in doc["patterns"] if p["recompute"]]
    assert recomputes
    for p in recomputes:
        rc = p["recompute"]
        assert rc["net_bytes_freed"] == rc["bytes_freed"] - rc["bytes_kept"]
        assert ("recomputing frees nothing" in p["reason"]) == (rc["net_bytes_freed"] <= 0)
    assert any(p["recompute"]["net_bytes_freed"] <= 0 for p in recomputes)
    memory = doc["memory"]
    assert memory["saved_bytes_if_recomputed"] <= memory["saved_bytes"]
    text = report(bert, "--batch", "2", "--dim", "seq=16")
    assert "recomputed: frees nothing at these dims" in text and "2 of them free nothing" in text
    long = report(bert, "--batch", "2", "--dim", "seq=512")
    line = " ".join(long.split("if every recomputable fusion that frees memory is taken")[1].split()[:11])
    saved = json.loads(CliRunner().invoke(main, ["analyze", bert, "--batch", "2", "--dim", "seq=512",
                                                 "--json"]).stdout)["memory"]
    less = format_bytes(saved["saved_bytes"] - saved["saved_bytes_if_recomputed"])
    assert line.startswith("(2 of 4):") and line.endswith(f"{less} less"), line


# ---- cosmetics (issue 27) -------------------------------------------------------------------------

def test_the_report_shows_the_10_largest_saved_tensors_as_help_and_reference_say(keras_resnet):
    text = report(keras_resnet, "--batch", "8")
    assert "saved for backward, largest 10 of " in text
    help_text = CliRunner().invoke(main, ["analyze", "--help"]).output
    assert "largest 10" in " ".join(help_text.split())
    reference = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    assert "the 10 largest tensors saved for backward" in " ".join(reference.split())


def _auto_named_dims_model() -> object:
    """What torch.onnx writes without dim names: input_ids_dynamic_axes_1 and friends."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    from tests.conftest import make_model, vi

    d = ["input_ids_dynamic_axes_1", "input_ids_dynamic_axes_2"]
    e = ["attention_mask_dynamic_axes_1", "attention_mask_dynamic_axes_2"]
    nodes = [helper.make_node("MatMul", ["input_ids", "w"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "b"], ["ab"], name="add"),
             helper.make_node("Relu", ["ab"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "attention_mask"], ["y"], name="mul")]
    inits = [numpy_helper.from_array(np.ones((64, 64), np.float32), "w"),
             numpy_helper.from_array(np.ones((64,), np.float32), "b")]
    return make_model(nodes, [vi("input_ids", *d, 64), vi("attention_mask", *e, 64)],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def test_the_memory_header_fits_80_columns_with_auto_named_dims(save_model):
    text = report(save_model(_auto_named_dims_model()))
    assert_readable(text)
    assert "memory (gradients w.r.t. parameters; input_ids_dynamic_axes_1=1," in text


def _many_frames_model() -> object:
    """x[:, ::2] then 12 swish blocks: the shape tools size each tensor's frames only as a number, one
    unkN per tensor (Wav2Vec2's ~40 terms of 31 frames)."""
    net = Net(x=("batch", "n"))
    for k, v in {"st": [0], "en": [1 << 40], "ax": [1], "sp": [2]}.items():
        net.ints(k, *v)
    prev = net.op("Slice", "slice", "x", "st", "en", "ax", "sp")
    for i in range(12):
        m = net.op("Mul", f"mul{i}", prev, net.param(f"w{i}", 1))
        prev = net.op("Mul", f"swish{i}", m, net.op("Sigmoid", f"sig{i}", m))
    return net.model(prev)


def test_many_inner_dims_of_one_value_are_one_formula_term(save_model):
    text = report(save_model(_many_frames_model()), "--batch", "2", "--dim", "n=62", "--wrt", "inputs")
    assert_readable(text)
    memory = text.split("\nmemory (")[1].split("\n\n")[0]
    formulas = [line.strip() for line in memory.splitlines() if line.startswith("    ")]
    assert "saved = 48 + 96*batch*unk_31 B" in formulas
    assert not any(re.search(r"unk\d", line) for line in formulas if " = " in line)
    assert any(line.startswith("unk_31: ") and "inner dims of 31 here" in line for line in formulas)


def test_backward_names_are_shortened_under_a_slash_led_scope():
    from fusecli.report.text import Namer

    namer = Namer("/bert/")
    assert namer("/bert/encoder/Relu") == "…/encoder/Relu"
    assert namer("gradients/bert/encoder/Relu/ReluGrad") == "gradients/…/encoder/Relu/ReluGrad"
