"""Tensors eager PyTorch computes from parameters alone, at every step (issue 43), against PyTorch itself.

Only a parameter and its views share the parameter's storage; an op that is no view (``g * v / ||v||``, an
MLP on a constant coordinate table, ``sigmoid``, ``exp``) allocates a new tensor each forward, and when a
backward formula saves it ``saved_tensors_hooks`` sees an activation (its gradient still reaches the
parameters). One small module per mechanism, exported by both torch exporters (TorchScript with
dynamic_axes, dynamo with dynamic_shapes), fusecli's saved activation bytes compared exactly with the
bytes of the distinct storages autograd saves (``hf_models.saved_storages``: neither parameters, buffers
nor inputs).

What an export cannot show: TorchScript constant-folds ``g * v / ||v||`` into one initializer
(``onnx::Conv_N``), so the norms ``_weight_norm_interface`` saves are nowhere in it; fusecli counts the
folded weight the conv saves and misses the norms alone.
"""

from __future__ import annotations

import ast
import json
import math
import re
import warnings

import numpy as np
import onnx
import pytest

from fusecli.pipeline import Options, analyze
from tests import hf_models

torch = pytest.importorskip("torch")
nn = torch.nn

BATCH, SEQ, H = 2, 6, 8
# a conv weight of 32 x 16 x 17 = 8704 values: above onnxscript's constant-folding input limit (8192), so the
# dynamo export keeps the weight norm's ops as HuBERT's (64 x 32 x 16) are kept; TorchScript folds any size
CHANNELS, KERNEL = 32, 17


class WeightNormConv(nn.Module):
    """wav2vec2's and HuBERT's positional conv: weight_norm over the kernel axis (dim=2, the last), so CPU
    runs ``_weight_norm_interface`` (saves v, g and the norms) and the conv saves the computed weight."""

    dim = 2

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, CHANNELS), nn.Linear(CHANNELS, H)
        conv = nn.Conv1d(CHANNELS, CHANNELS, KERNEL, padding=KERNEL // 2, groups=2)
        self.conv = nn.utils.parametrizations.weight_norm(conv, name="weight", dim=self.dim)

    def forward(self, x, ids):
        h = self.conv(self.a(x).transpose(1, 2))
        return self.b(torch.tanh(h).transpose(1, 2))


class WeightNormFirstAxis(WeightNormConv):
    dim = 0  # nn.utils.weight_norm's default: one norm per output channel


class PositionBiasMLP(nn.Module):
    """SwinV2's continuous position bias: an MLP (Linear, ReLU, Linear) on a constant relative-coordinate
    table, then ``16 * sigmoid``, added to the scores: the ReLU's output, the sigmoid's and nothing of the
    table are saved."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(H, SEQ)
        self.mlp = nn.Sequential(nn.Linear(2, 512), nn.ReLU(), nn.Linear(512, 2, bias=False))
        self.b = nn.Linear(SEQ, H)
        grid = torch.stack(torch.meshgrid(torch.arange(SEQ), torch.arange(SEQ), indexing="ij"), -1).float()
        self.register_buffer("table", (grid - SEQ / 2) / SEQ, persistent=False)

    def forward(self, x, ids):
        bias = 16 * torch.sigmoid(self.mlp(self.table))  # (S, S, 2)
        return self.b(torch.softmax(self.q(x) + bias[..., 0], -1))


class LogitScale(nn.Module):
    """SwinV2's and CLIP's learned temperature: ``logit_scale.clamp(max=log(100)).exp()`` per head; exp saves
    its result, which the scaled product saves too (one storage)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(H, H), nn.Linear(H, H)
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones(2, 1)))

    def forward(self, x, ids):
        h = self.a(x).view(x.shape[0], x.shape[1], 2, H // 2)
        scale = torch.clamp(self.logit_scale, max=math.log(100.0)).exp()
        return self.b((torch.tanh(h) * scale).reshape(x.shape[0], x.shape[1], H))


# name -> (module, an op the export must write, TorchScript's constant folding)
MODULES = {"weight_norm": (WeightNormConv, "Conv", True),
           "weight_norm_first_axis": (WeightNormFirstAxis, "Conv", True),
           "weight_norm_unfolded": (WeightNormConv, "ReduceL2", False),
           "position_bias_mlp": (PositionBiasMLP, "Sigmoid", True), "logit_scale": (LogitScale, "Exp", True)}
EXPORTERS = ("torchscript", "dynamo")
NORMS_FOLDED = ("TorchScript folds g * v / ||v|| into the conv's weight (onnx::Conv_N): the norms "
                "_weight_norm_interface saves for backward are in no tensor of the export")


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(BATCH, SEQ, H, generator=g), torch.randint(0, 100, (BATCH, SEQ, 3), generator=g)


def _module(name):
    torch.manual_seed(0)
    return MODULES[name][0]().eval()


def export(name: str, exporter: str, path: str) -> str:
    model, args = _module(name), _inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model, args, path, dynamo=False, opset_version=17, input_names=["x", "ids"],
                              do_constant_folding=MODULES[name][2],
                              dynamic_axes={"x": {0: "batch"}, "ids": {0: "batch"}})
        else:
            pytest.importorskip("onnxscript")
            batch = torch.export.Dim("batch", min=1, max=64)
            torch.onnx.export(model, args, dynamo=True, input_names=["x", "ids"],
                              dynamic_shapes=({0: batch}, {0: batch}), verbose=False).save(path)
    return path


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("parameter_math")
    made: dict[tuple[str, str], str] = {}

    def get(name: str, exporter: str) -> str:
        if (name, exporter) not in made:
            made[name, exporter] = export(name, exporter, str(folder / f"{name}_{exporter}.onnx"))
        return made[name, exporter]

    return get


def _writes(path: str, op: str) -> bool:
    """The export writes ``op``, or an initializer onnxscript's optimizer folded from it (dynamo folds
    ``clamp(logit_scale).exp()``, 2 values, into one: still made each step in eager)."""
    graph = onnx.load(path).graph
    folded = [i.name for i in graph.initializer] + [n for v in graph.value_info for p in v.metadata_props
                                                    if p.key == "pkg.onnxscript.optimizer.folded_from"
                                                    for n in ast.literal_eval(p.value)]
    made = {re.sub(r"_\d+$", "", n) for n in folded}  # torch.export's node names: the aten op, numbered
    return op in {n.op_type for n in graph.node} or op.lower() in made


def _saved(path: str):
    result = analyze(path, Options(batch=BATCH))
    assert result.profile.name == "pytorch", result.profile_reason
    assert not result.unsupported(), result.unsupported()
    saved = [s for s in result.liveness.saved if s.tensor.kind == "activation"]
    assert None not in [s.bytes for s in saved]
    return saved


def _cases():
    for name in MODULES:
        for exporter in EXPORTERS:
            if name == "weight_norm_unfolded" and exporter == "dynamo":
                continue  # the dynamo export of weight_norm is weight_norm's own case
            folded = exporter == "torchscript" and name.startswith("weight_norm") and MODULES[name][2]
            marks = [pytest.mark.xfail(reason=NORMS_FOLDED, strict=True)] if folded else []
            yield pytest.param(name, exporter, marks=marks, id=f"{name}-{exporter}")


@pytest.mark.parametrize(("name", "exporter"), list(_cases()))
def test_saved_bytes_match_pytorch(exported, name, exporter):
    path = exported(name, exporter)
    op = MODULES[name][1]
    assert _writes(path, op), f"the export writes no {op}"
    saved = _saved(path)
    theirs = sum(b for *_, b in hf_models.saved_storages(_module(name), _inputs()))
    assert theirs > 0
    assert sum(s.bytes for s in saved) == theirs, ([(s.tensor.name, s.bytes) for s in saved], theirs)


@pytest.mark.parametrize("name", ["weight_norm", "weight_norm_first_axis"])
def test_torchscript_folded_weight_is_made_each_step(exported, name):
    """TorchScript's folded weight-normalised conv weight is what the conv saves, an activation: fusecli
    misses only the norms the export folded away (PyTorch's own norm_except_dim, measured here)."""
    path = exported(name, "torchscript")
    weights = [i.name for i in onnx.load(path).graph.initializer if i.name.startswith("onnx::Conv_")]
    assert weights, "TorchScript did not fold the weight norm"
    saved = _saved(path)
    assert {s.tensor.name for s in saved} >= set(weights)
    model = _module(name)
    conv = model.conv.parametrizations.weight
    norms = torch.norm_except_dim(conv.original1, 2, model.dim)
    theirs = sum(b for *_, b in hf_models.saved_storages(model, _inputs()))
    assert sum(s.bytes for s in saved) == theirs - norms.untyped_storage().nbytes()


def test_folded_batch_norm_conv_weight_stays_a_parameter(tmp_path):
    """An eval TorchScript export folds BatchNorm into the conv before it, renaming weight and bias
    (``onnx::Conv_N``); eager PyTorch runs that conv on its own parameter, so its weight is no activation."""

    class ConvBN(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.conv, self.bn = nn.Linear(H, H), nn.Conv1d(H, H, 3, padding=1), nn.BatchNorm1d(H)

        def forward(self, x, ids):
            return torch.tanh(self.bn(self.conv(self.a(x).transpose(1, 2))))

    path = str(tmp_path / "conv_bn.onnx")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(ConvBN().eval(), _inputs(), path, dynamo=False, opset_version=17,
                          input_names=["x", "ids"], dynamic_axes={"x": {0: "batch"}})
    conv = next(n for n in onnx.load(path).graph.node if n.op_type == "Conv")
    assert conv.input[1].startswith("onnx::") and conv.input[2].startswith("onnx::")
    assert conv.input[1] not in {s.tensor.name for s in _saved(path)}


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_resident_parameters_are_eagers(exported, exporter):
    """Eager holds v and g all step long and makes g * v / ||v|| at each step: TorchScript's folded weight
    stands for the v it lost (same bytes) and is an activation too; the export keeps no trace of g."""
    model = _module("weight_norm")
    a = analyze(exported("weight_norm", exporter), Options(batch=BATCH))
    lost = model.conv.parametrizations.weight.original0.nbytes if exporter == "torchscript" else 0
    constants = sum(t.nbytes({}) or 0 for t in a.joint.tensors.values() if t.kind == "constant")  # axes
    assert a.liveness.resident_bytes - constants == sum(p.nbytes for p in model.parameters()) - lost


class ConvBNNet(nn.Module):
    """Two Conv-BatchNorm-ReLU blocks and a plain conv (no BatchNorm): an eval export folds the two
    BatchNorms into their convs, never the third conv. ``bias=False``: ResNet's bias-free convs, whose
    folded biases dynamo's optimizer makes under two rule names and TorchScript shares (equal at
    initialisation) through an Identity."""

    def __init__(self, bias: bool = True):
        super().__init__()
        self.c1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1, bias=bias), nn.BatchNorm2d(8)
        self.c2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=bias), nn.BatchNorm2d(8)
        self.c3 = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        x = torch.relu(self.bn1(self.c1(x)))
        return self.c3(torch.relu(self.bn2(self.c2(x))))


def _export_cnn(path: str, exporter: str, training: bool, bias: bool = True) -> str:
    torch.manual_seed(0)
    x = (torch.randn(2, 3, 16, 16),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
            torch.onnx.export(ConvBNNet(bias).eval(), x, path, dynamo=False, opset_version=17, training=mode,
                              input_names=["x"], dynamic_axes={"x": {0: "batch"}})
        else:
            torch.onnx.export(ConvBNNet(bias).eval(), x, dynamo=True, optimize=not training,
                              input_names=["x"]).save(path)
    return path


@pytest.mark.parametrize("bias", [True, False], ids=["conv_bias", "bias_free_conv"])
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_batch_norm_folded_by_an_eval_export_is_said(tmp_path, exporter, bias):
    """An eval export folds each BatchNorm into its conv (TorchScript's eval peephole, onnxscript's
    FuseBatchNormIntoConv in dynamo's), so the conv outputs training keeps for the BatchNorms' backward are
    not in the file: fusecli's saved bytes are below PyTorch's training step's, and the report says so in
    its first lines, a warning naming how to export without folding, and the JSON. The training-mode
    export of the same module keeps its BatchNorms, and nothing is said."""
    from click.testing import CliRunner

    from fusecli.cli import main

    folded = _export_cnn(str(tmp_path / f"{exporter}_eval.onnx"), exporter, training=False, bias=bias)
    kept = _export_cnn(str(tmp_path / f"{exporter}_train.onnx"), exporter, training=True, bias=bias)
    assert "BatchNormalization" not in {n.op_type for n in onnx.load(folded).graph.node}
    assert "BatchNormalization" in {n.op_type for n in onnx.load(kept).graph.node}
    a = analyze(folded, Options(batch=2))
    said = [w for w in a.warnings if "BatchNorms were folded into the convolutions" in w]
    assert len(said) == 1 and "TrainingMode.TRAINING" in said[0] and "optimize=False" in said[0], a.warnings
    assert len(a.graph.meta["folded_batch_norms"]) == 2
    torch.manual_seed(0)
    step = ConvBNNet(bias).train()  # what a training step runs: the BatchNorms and their batch statistics
    pytorch = sum(b for _, _, b in hf_models.saved_storages(step, (torch.randn(2, 3, 16, 16),)))
    assert a.liveness.saved_activation_bytes < pytorch  # what the warning is about: measured, not assumed
    r = CliRunner().invoke(main, ["analyze", folded, "--batch", "2", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert len(doc["folded_batch_norms"]) == 2
    text = CliRunner().invoke(main, ["analyze", folded, "--batch", "2"]).stdout
    assert "export: 2 BatchNorms folded into convolutions" in "\n".join(text.splitlines()[:8]), text
    b = analyze(kept, Options(batch=2))
    assert not [w for w in b.warnings if "folded" in w] and not b.graph.meta.get("folded_batch_norms")
    # the training-mode export keeps the conv outputs: 0.998 of PyTorch's; the 128 bytes left are the two
    # BatchNorms' per-channel save_mean and save_invstd (2 x 2 x 8 float32), which no export writes
    assert pytorch - 128 <= b.liveness.saved_activation_bytes <= pytorch
    assert a.liveness.saved_activation_bytes < 0.6 * pytorch


class LearnedScale(nn.Module):
    """tanh(alpha * linear(x)) with a trained one-element alpha (a ReZero gate, a learned temperature), then
    nn.PReLU() and its one slope; ``buffer``: a one-element float buffer multiplies the output (trained by
    nobody). Mul's backward keeps linear(x) for alpha's gradient: a constant alpha would keep nothing."""

    def __init__(self, buffer: bool = False):
        super().__init__()
        self.lin, self.act = nn.Linear(H, H), nn.PReLU()
        self.alpha = nn.Parameter(torch.full((1,), 0.5))
        if buffer:
            self.register_buffer("scale", torch.full((1,), 2.0))
        self.buffer = buffer

    def forward(self, x):
        y = self.act(torch.tanh(self.alpha * self.lin(x)))
        return y * self.scale if self.buffer else y


def _export_one_input(model, x, path: str, exporter: str) -> str:
    """``model(x)`` exported by ``exporter``, its batch dynamic (both exporters)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model.eval(), (x,), path, dynamo=False, opset_version=17, input_names=["x"],
                              dynamic_axes={"x": {0: "batch"}})
        else:
            batch = torch.export.Dim("batch", min=1, max=64)
            torch.onnx.export(model.eval(), (x,), dynamo=True, input_names=["x"],
                              dynamic_shapes=({0: batch},)).save(path)
    return path


def _export_scalar_model(path: str, exporter: str, buffer: bool) -> str:
    torch.manual_seed(0)
    return _export_one_input(LearnedScale(buffer), torch.randn(BATCH, SEQ, H), path, exporter)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_trained_one_element_weight_is_a_parameter(tmp_path, exporter):
    """nn.PReLU()'s slope and a learned scalar gate were constants, as every one-element float initializer
    (an epsilon) is, without a word: the gate's gradient and the linear output it reads went uncounted.
    Dynamo's signature says they are parameters (saved bytes then PyTorch's own); TorchScript folds the slope
    (onnx::PRelu_N), taken for a parameter as PRelu's slope, and names alpha as it would a buffer: kept a
    constant, and both said."""
    torch.manual_seed(0)
    model, x = LearnedScale(), torch.randn(BATCH, SEQ, H)
    pytorch = sum(b for _, _, b in hf_models.saved_storages(model, (x,)))
    a = analyze(_export_scalar_model(str(tmp_path / "scale.onnx"), exporter, False), Options(batch=BATCH))
    scalars = [t for t in a.graph.tensors.values() if t.producer is None and t.shape is not None
               and t.dtype == "float32" and all(d == 1 for d in t.shape) and t.shape]
    said = [w for w in a.warnings if "one-element" in w]
    if exporter == "dynamo":  # the signature tells: both parameters, nothing assumed, PyTorch's bytes
        kinds = [(t.name, t.kind) for t in scalars]
        assert sorted(k for _, k in kinds) == ["parameter", "parameter"], kinds
        assert not said, a.warnings
        assert a.liveness.saved_activation_bytes == pytorch
    else:  # PRelu's slope (folded to onnx::PRelu_N) taken for a parameter; 'alpha', a bare state_dict key,
        kinds = {t.name: t.kind for t in scalars}  # kept a constant: both said
        slope = next(n for n in kinds if n.startswith("onnx::PRelu"))
        assert kinds[slope] == "parameter" and kinds["alpha"] == "constant", kinds
        assert len(said) == 1 and f"'{slope}') taken for trained parameters" in said[0], a.warnings
        assert "'alpha') taken for constants" in said[0], said


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_a_one_element_buffer_stays_a_constant(tmp_path, exporter):
    """A registered one-element float buffer: dynamo's signature says BUFFER (a constant, nothing said of
    it); TorchScript's 'scale' is a state_dict key as a parameter's would be: kept a constant, and said."""
    a = analyze(_export_scalar_model(str(tmp_path / "buffer.onnx"), exporter, True), Options(batch=BATCH))
    values = [t for t in a.graph.tensors.values() if t.producer is None and t.meta.get("value") is not None
              and np.size(t.meta["value"]) == 1 and float(np.reshape(t.meta["value"], -1)[0]) == 2.0]
    assert values and all(t.kind == "constant" for t in values), [(t.name, t.kind) for t in values]
    said = [w for w in a.warnings if "one-element" in w]
    if exporter == "dynamo":
        assert not said, a.warnings
    else:
        assert len(said) == 1 and "'scale'" in said[0] and "taken for constants" in said[0], a.warnings


class LearnedActivation(nn.Module):
    """xIELU's form (Apertus): softplus of one-element parameters scales the positive and negative branches,
    expm1 on the negative one; the parameters' gradients read the branches' products."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(H, H)
        self.alpha_p, self.alpha_n = nn.Parameter(torch.full((1,), 0.8)), nn.Parameter(torch.full((1,), 0.8))

    def forward(self, x):
        x = self.lin(x)
        ap, an = nn.functional.softplus(self.alpha_p), 0.5 + nn.functional.softplus(self.alpha_n)
        neg = (torch.expm1(torch.clamp(x, max=0.0)) - x) * an + 0.5 * x
        return torch.where(x > 0, ap * x * x + 0.5 * x, neg)


def test_a_learned_activation_of_scalar_parameters_matches_pytorch(tmp_path):
    """Dynamo (TorchScript cannot export expm1 at opset 17): the one-element alphas are parameters, so the
    branch products their gradients read are saved, as PyTorch saves them (an Apertus export read 0.923
    of PyTorch's saved bytes while they were constants)."""
    torch.manual_seed(0)
    model, x = LearnedActivation(), torch.randn(BATCH, SEQ, H)
    pytorch = sum(b for _, _, b in hf_models.saved_storages(model, (x,)))
    a = analyze(_export_one_input(model, x, str(tmp_path / "xielu.onnx"), "dynamo"), Options(batch=BATCH))
    assert a.liveness.saved_activation_bytes == pytorch, (a.liveness.saved_activation_bytes, pytorch)
