"""Every model the onnx package ships as test data analyzes, or fails with one clean FuseError."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from fusecli.core.errors import FuseError
from fusecli.pipeline import Options, analyze

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
MODELS = sorted(DATA.glob("*/*/model.onnx")) + sorted(DATA.glob("light/*.onnx"))


def test_the_sweep_has_models():
    assert len(MODELS) > 100


@pytest.mark.parametrize("path", MODELS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.stem}")
def test_model_analyzes_or_fails_cleanly(path):
    try:
        a = analyze(str(path), Options(batch=2))
    except FuseError as e:
        assert "\n" not in str(e).strip()
        return
    a.joint.lint()
    assert a.liveness.peak_bytes >= a.liveness.saved_bytes


def _expected_shapes(path: Path) -> dict[str, tuple[int, ...]] | None:
    """The output shapes onnx ships with a node test (test_data_set_0/output_*.pb, in graph output order),
    for a model whose inputs are all static; None otherwise."""
    model = onnx.load(str(path), load_external_data=False)
    if any(d.dim_param or not d.HasField("dim_value") for i in model.graph.input
           for d in i.type.tensor_type.shape.dim):
        return None
    files = sorted((path.parent / "test_data_set_0").glob("output_*.pb"), key=lambda f: int(f.stem[7:]))
    if not files or len(files) != len(model.graph.output):
        return None
    shapes = {}
    for out, f in zip(model.graph.output, files, strict=True):
        t = onnx.TensorProto()
        t.ParseFromString(f.read_bytes())
        if not t.dims and not t.raw_data and not t.float_data and not t.int64_data and not t.int32_data:
            return None  # a sequence, map or optional output: no tensor
        shapes[out.name] = tuple(t.dims)
    return shapes


CHECKED = [p for p in MODELS if p.parent.name != "light" and _expected_shapes(p) is not None]


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_output_shapes_are_the_ones_onnx_ships(path):
    """Where fusecli sizes an output, the size is the one in onnx's own expected outputs."""
    try:
        a = analyze(str(path), Options())
    except FuseError:
        return  # said in one line: test_model_analyzes_or_fails_cleanly
    for name, want in _expected_shapes(path).items():
        t = a.graph.tensors.get(name)
        got = None if t is None or t.shape is None else tuple(a.sizes.get(d, d) if isinstance(d, str) else d
                                                               for d in t.shape)
        if got is not None and all(isinstance(d, int) for d in got):
            assert got == want, f"{name}: fusecli {got}, onnx's expected output {want}"


def test_most_shipped_output_shapes_are_sized():
    """The comparison above is not vacuous: fusecli sizes nearly every output it is compared on."""
    sized = total = 0
    for path in CHECKED:
        try:
            a = analyze(str(path), Options())
        except FuseError:
            continue
        for name in _expected_shapes(path):
            t = a.graph.tensors.get(name)
            total += 1
            sized += t is not None and t.shape is not None and all(
                isinstance(a.sizes.get(d, d) if isinstance(d, str) else d, int) for d in t.shape)
    assert total > 100 and sized >= 0.9 * total, (sized, total)  # 144 of 146 here
