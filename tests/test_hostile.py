"""Hostile files through the CLI: each ends within 10 s and 1 GB with one ``error:`` line or a correct result.

Every case runs fusecli's CLI in a child process with an address-space cap and a wall-clock limit (so a
regression cannot hang or exhaust the test run), and the child's own peak RSS is measured (VmHWM at exit).
The files are built by tests/hostile.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import pytest

from tests import hostile as H

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECONDS = 10
PEAK_BYTES = 1 << 30
ADDRESS_CAP = 6 << 30  # virtual: onnxruntime and numpy reserve far more than they touch


_WRAPPER = """
import atexit, os, resource, runpy, sys
resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
def peak():  # this process image's own high-water mark (ru_maxrss would count the forking parent's too)
    with open("/proc/self/status") as f:
        hwm = next((line.split()[1] for line in f if line.startswith("VmHWM:")), "0")
    with open({peak_file!r}, "w") as out:
        out.write(hwm)
atexit.register(peak)
sys.argv = ["fusecli", *sys.argv[1:]]
runpy.run_module("fusecli", run_name="__main__", alter_sys=True)
"""


def run_cli(*args: str, env: dict | None = None, limit: float = SECONDS + 20) -> tuple:
    """(exit code, stdout, stderr, seconds, peak RSS bytes) of ``python -m fusecli ARGS`` under the caps."""
    full_env = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1", **(env or {})}
    full_env.pop("FUSECLI_DEBUG", None)
    with tempfile.TemporaryDirectory() as work:
        peak_file = os.path.join(work, "peak")
        code = _WRAPPER.format(cap=ADDRESS_CAP, peak_file=peak_file)
        with open(os.path.join(work, "out"), "w+") as out, open(os.path.join(work, "err"), "w+") as err:
            t0 = time.perf_counter()
            p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=out, stderr=err, env=full_env,
                                 cwd=ROOT)
            try:
                p.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            seconds = time.perf_counter() - t0
            out.seek(0)
            err.seek(0)
            peak = int(open(peak_file).read() or 0) * 1024 if os.path.exists(peak_file) else 0
            return p.returncode, out.read(), err.read(), seconds, peak


def assert_one_error(result, pattern: str) -> None:
    code, _, err, seconds, peak = result
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("warning:")]
    assert code == 1, f"exit {code}: {err[-500:]}"
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-800:]
    assert "internal error" not in lines[0]
    assert re.search(pattern, lines[0]), lines[0]
    assert_within_budget(result)


def assert_within_budget(result) -> None:
    _, _, err, seconds, peak = result
    print(f"[{seconds:.2f} s, peak {peak / 2**20:.0f} MiB]", end=" ")
    assert seconds < SECONDS, f"took {seconds:.1f} s"
    assert peak < PEAK_BYTES, f"peak RSS {peak / 2**20:.0f} MiB"


# (builder, command, pattern of the one error line)
REFUSED = [
    (H.constant_attr_outside, "analyze", r"node 'const' attribute 'value' points outside the model's folder"),
    (H.constant_attr_symlink, "analyze", r"node 'const' attribute 'value' points outside the model's folder"),
    (H.if_branch_outside, "analyze", r"then_branch.*initializer 'w' points outside"),
    (H.function_constant_outside, "analyze", r"function 'AddC'.*node 'fconst'.*points outside"),
    (H.sparse_initializer_outside, "analyze", r"sparse initializer 's' points outside"),
    (H.nul_in_location, "analyze", r"initializer 'w' holds a NUL byte"),
    (H.undefined_elem_type, "rewrite", r"graph input 'x' has no element type"),
    (H.short_initializer, "rewrite", r"initializer 'w' \(dims \[4, 4, 3, 3\], FLOAT\): its data does not"),
    (H.short_initializer, "rewrite --no-verify", r"initializer 'w' .*: its data does not fit its dims"),
    (H.huge_dims, "rewrite", r"verification input 'x'.*FUSECLI_MAX_FEED_ELEMENTS"),
    (H.ort_refuses, "rewrite", r"onnxruntime cannot load the original model"),
    (H.complex_conv_bias, "rewrite --no-verify", r"not a valid model: onnxruntime refuses it .*complex64"),
    (H.complex_conv_bias, "rewrite", r"not a valid model: onnxruntime refuses it .*complex64"),
    (H.unpack_claims, "analyze", r"node 'u' \(Unpack\) claims 3,000,000 outputs.*FUSECLI_MAX_OUTPUTS"),
    (lambda f: H.unpack_claims(f, 10**12), "analyze", r"claims 1,000,000,000,000 outputs"),
    (lambda f: H.shapen_claims(f, 10**9, used=True), "analyze", r"node 's' \(ShapeN\) claims 1,000,000,000"),
    (H.dangling_reference, "analyze", r"node 'r' of function 'f' reads 'missing:0', which does not exist"),
    (lambda f: H.dangling_reference(f, "x:output:999"), "analyze", r"node 'r' .* reads 'x:output:999'"),
    (lambda f: H.dangling_reference(f, "r2:y:999"), "analyze", r"reads 'r2:y:999'.*'r2' has 1 outputs"),
    (H.negative_count, "analyze", r"node 'u' \(Unpack\) claims -5 outputs"),
    (H.deep_nesting, "analyze", r"FUSECLI_MAX_CALL_DEPTH"),
    (H.huge_saved_model_pb, "analyze",
     r"saved_model.pb of 6,442,450,944 bytes.*FUSECLI_MAX_SAVED_MODEL_BYTES"),
]


@pytest.mark.parametrize("build, command, pattern", REFUSED,
                         ids=[f"{c}-{getattr(b, '__name__', 'case')}-{i}"
                              for i, (b, c, _) in enumerate(REFUSED)])
def test_hostile_file_is_one_error_line(build, command, pattern, tmp_path):
    path = build(str(tmp_path / "case"))
    args = [*command.split(), path] + (["-o", str(tmp_path / "out.onnx")] if "rewrite" in command else [])
    assert_one_error(run_cli(*args), pattern)
    assert not os.path.exists(tmp_path / "out.onnx")


def test_onnxruntime_log_lines_stay_off_the_terminal(tmp_path):
    """onnxruntime's own coloured ``[E:onnxruntime:...]`` lines once came before fusecli's line."""
    path = H.reshape_fails_at_run(str(tmp_path / "case"))
    result = run_cli("rewrite", path, "-o", str(tmp_path / "out.onnx"), "--verify", "model")
    assert "[E:onnxruntime" not in result[2] and "\x1b[" not in result[2], result[2]
    assert_one_error(result, r"onnxruntime failed to run the original model")
    # --verify auto (the default) stands on the regions' checks then, and says so in one warning line
    result = run_cli("rewrite", path, "-o", str(tmp_path / "auto.onnx"))
    assert "[E:onnxruntime" not in result[2] and "\x1b[" not in result[2], result[2]
    assert result[0] == 0 and "cannot run the original model on random inputs" in result[2], result[2]


def test_budgets_are_raised_by_their_variable(tmp_path):
    """The loader's budgets, timed without TensorFlow's shape inference (its import alone takes seconds)."""
    path = H.deep_nesting(str(tmp_path / "deep"), depth=400)
    no_tf = {"FUSECLI_TENSORFLOW_SHAPES": "0"}
    result = run_cli("analyze", "--json", path, env={"FUSECLI_MAX_CALL_DEPTH": "1000", **no_tf})
    assert result[0] == 0, result[2]
    assert_within_budget(result)
    path = H.unpack_claims(str(tmp_path / "unpack"), num=70_000)
    result = run_cli("analyze", "--json", path, env={"FUSECLI_MAX_OUTPUTS": "100000", **no_tf})
    assert result[0] == 0, result[2]
    assert_within_budget(result)


# --- correct results ------------------------------------------------------------------------------------
def test_unused_shapen_claim_is_pruned(tmp_path):
    """A ShapeN nothing reads is not followed, whatever it claims (TensorFlow prunes it too)."""
    result = run_cli("analyze", "--json", H.shapen_claims(str(tmp_path / "c"), 10**9))
    assert result[0] == 0, result[2]
    assert_within_budget(result)


def test_sparse_initializer_is_a_weight(tmp_path):
    import json

    result = run_cli("analyze", "--json", H.sparse_initializer(str(tmp_path / "c")))
    assert result[0] == 0, result[2]
    doc = json.loads(result[1])
    assert doc["forward"]["nodes"] == 1
    assert_within_budget(result)


def test_vector_clip_bounds_are_a_plain_clip(tmp_path):
    from fusecli.pipeline import Options, analyze

    a = analyze(H.clip_vector_bounds(str(tmp_path / "c")), Options())
    (clip,) = a.graph.nodes
    assert clip.kind == "clip" and clip.meta["clip_bounds"] == (None, None)


@pytest.mark.parametrize("build", [H.dropout_odd_inputs, H.dropout_no_input])
def test_dropout_with_unusual_inputs(build, tmp_path):
    result = run_cli("analyze", "--json", build(str(tmp_path / "c")))
    assert result[0] in (0, 1) and "internal error" not in result[2], result[2]
    assert_within_budget(result)


def test_constant_attribute_external_data_in_folder_is_rewritten(tmp_path):
    """The Constant's data beside the model is read into the rewritten one, which runs anywhere."""
    import onnxruntime as ort

    path = H.constant_attr_in_folder(str(tmp_path / "c"))
    out = str(tmp_path / "elsewhere" / "out.onnx")
    os.makedirs(os.path.dirname(out))
    result = run_cli("rewrite", path, "-o", out)
    assert result[0] == 0, result[2]
    assert_within_budget(result)
    rewritten = onnx.load(out)
    assert not any(a.t.data_location == onnx.TensorProto.EXTERNAL for n in rewritten.graph.node
                   for a in n.attribute)
    x = np.random.default_rng(0).standard_normal((1, 4, 6, 6)).astype(np.float32)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_symbolic_shape_rounds_are_bounded(tmp_path):
    """onnxruntime's symbolic inference loop never ended on an UNDEFINED-typed input feeding a MatMul."""
    from fusecli.core.ir import Graph
    from fusecli.rewrite.graph.shapes import refine_shapes

    m = onnx.load(H.undefined_elem_type(str(tmp_path / "c")))
    g = Graph("g")
    g.tensor("m", shape=None, kind="activation")
    t0 = time.perf_counter()
    refine_shapes(m, g)
    assert time.perf_counter() - t0 < SECONDS


# --- the sizes issue's two files (shape inference budget) -----------------------------------------------
@pytest.mark.parametrize("build", [H.mul_of_huge_inputs, H.billion_initializer])
def test_tiny_files_claiming_huge_tensors(build, tmp_path):
    result = run_cli("analyze", "--json", build(str(tmp_path / "c")), limit=SECONDS + 2)
    assert result[0] in (0, 1) and "internal error" not in result[2]
    assert result[0] == 0 or len(result[2].strip().splitlines()) == 1
    assert "without data propagation (raise FUSECLI_MAX_SHAPE_VALUE_ELEMENTS" in result[2]  # said, not silent
    assert_within_budget(result)


# --- issue 31: internal errors of the past ---------------------------------------------------------------
@pytest.mark.parametrize("where", ["other folder", "model's folder"])
@pytest.mark.parametrize("exists", [True, False])
def test_nul_location_rewrite_is_one_error_line(where, exists, tmp_path):
    """An existing output once met the NUL byte first (os.path.samefile's ValueError, an internal error)."""
    path = H.nul_in_location(str(tmp_path / "case"))
    folder = tmp_path / "out" if where == "other folder" else tmp_path / "case"
    folder.mkdir(exist_ok=True)
    out = folder / "o.onnx"
    if exists:
        out.write_bytes(b"before")
    result = run_cli("rewrite", path, "-o", str(out), "--no-verify")
    assert_one_error(result, r"initializer 'w' holds a NUL byte; refused")
    assert (out.read_bytes() == b"before") if exists else not out.exists()
    assert sorted(os.listdir(folder)) == sorted(["o.onnx"] * exists + (["model.onnx"] if folder.name == "case"
                                                                       else []))


def test_memory_past_int64_is_exact(tmp_path):
    """A 2^62 dim makes byte totals past int64 (the peak's numpy front once overflowed): the totals are the
    symbolic model's formulas evaluated at that dim, exactly."""
    import json

    from fusecli.memory.formulas import evaluate_formula, memory_formulas
    from fusecli.pipeline import Options, analyze

    result = run_cli("analyze", "--json", H.huge_dims(str(tmp_path / "huge")))
    assert result[0] == 0, result[2]
    memory = json.loads(result[1])["memory"]
    a = analyze(H.huge_dims(str(tmp_path / "named"), "N"), Options())
    formulas = memory_formulas(a.liveness, a.joint)
    assert "N" in formulas["peak_bytes"]
    for key in ("saved_bytes", "peak_bytes"):
        assert memory[key] == evaluate_formula(formulas[key], {"N": 2**62}) > 2**64, key
        assert memory["formula"][key] == str(memory[key])
    assert_within_budget(result)
