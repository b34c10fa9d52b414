"""The structure-aware fuzzer (tests/fuzz_structure.py) in CI: a bounded run, and every past finding.

FUSECLI_FUZZ_SECONDS sets the run's length (default 70 s); FUSECLI_FUZZ_SEED its first seed (default 0,
so CI is repeatable; set another to explore, and a failure names its seed to replay). The node-order
properties (``--order``) run FUSECLI_FUZZ_ORDER_SECONDS (default 30 s) from the same first seed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests import fuzz_structure as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Seeds whose cases once ended in an internal error, each fixed (kept as regression cases):
# initializer data that does not fit its dims, read by rewrite's emitters (rewrite/graph/values.py)
SHORT_DATA = [66, 107, 160, 162, 172, 259, 353]
# Dropout left without inputs (load/onnx.py _fill_missing_shapes)
DROPOUT = [478, 614]
# drawn from all 7 bases: a Constant whose value attribute is no tensor (load/onnx.py _constant_values);
# an initializer claiming a dim past int64, copied into rewrite's value infos (rewrite/run.py); weights an
# emitter cannot fold (shapes that do not broadcast, object arrays, short inputs: rewrite/plan.py skips the
# match and says so)
SEVEN_BASES = [959, 20276634, 20282674, 40007101, 40012830, 40012895, 40014094, 40014791, 40016886,
               40023291,
               182, 281, 284, 326, 1049]  # region verification's feeds: huge and negative dims
# drawn from the 11 bases with the transformer blocks: a Slice bound through Gather of a scalar index
# (rewrite/graph/shape_values.py, the rotary emitter's bound reader); hangs: ONNX's data propagation on a
# sparse initializer (20265754) and on a value_info claiming a 2^62-element shape vector (31123532),
# onnxruntime's symbolic inference of a Reshape to a 2^40-element shape in rewrite's shape refinement
# (20264134); the attention reader meeting a Softmax with its input removed (41123987, 41124788) and a Gemm
# input whose declared dim became 2^64 - 1, which bound_fit cut into a subgraph input (3188)
TRANSFORMER_BASES = [700099, 20264134, 20265754, 31123532, 41123987, 41124788, 3188]


def _run(args: list[str], timeout: float) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT}
    p = subprocess.run([sys.executable, "-m", "tests.fuzz_structure", *args], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=timeout)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_past_findings_end_cleanly():
    seeds = SHORT_DATA + DROPOUT
    summary = _run(["--seeds", ",".join(map(str, seeds)), "--bases", "5", "--seconds", "300"], timeout=400)
    assert summary["cases"] == len(seeds)
    assert not summary["findings"], summary["findings"]
    summary = _run(["--seeds", ",".join(map(str, SEVEN_BASES)), "--bases", "7", "--seconds", "300"],
                   timeout=400)
    assert summary["cases"] == len(SEVEN_BASES) and not summary["findings"], summary["findings"]
    summary = _run(["--seeds", ",".join(map(str, TRANSFORMER_BASES)), "--bases", "11", "--seconds", "300"],
                   timeout=400)
    assert summary["cases"] == len(TRANSFORMER_BASES) and not summary["findings"], summary["findings"]


def test_fuzzer_finds_no_internal_error_hang_or_memory_hit():
    seconds = float(os.environ.get("FUSECLI_FUZZ_SECONDS", "70"))
    seed = int(os.environ.get("FUSECLI_FUZZ_SEED", "0"))
    summary = _run(["--seconds", str(seconds), "--seed", str(seed)], timeout=seconds + 120)
    print(json.dumps({k: v for k, v in summary.items() if k != "findings"}))
    assert summary["cases"] > 0
    assert not summary["findings"], json.dumps(summary["findings"][:5], indent=1)


def test_node_order_properties_hold():
    seconds = float(os.environ.get("FUSECLI_FUZZ_ORDER_SECONDS", "30"))
    seed = int(os.environ.get("FUSECLI_FUZZ_SEED", "0"))
    summary = _run(["--order", "--seconds", str(seconds), "--seed", str(seed)], timeout=seconds + 180)
    print(json.dumps({k: v for k, v in summary.items() if k != "findings"}))
    assert summary["cases"] > 0
    assert not summary["findings"], json.dumps(summary["findings"][:5], indent=1)


def test_the_order_property_catches_a_pass_reading_the_files_order(tmp_path, monkeypatch):
    """The harness itself: with the loader reading the file's order (no canonical order), Add + Tanh
    listed Tanh first loses its sizes (shape inference walks the file's order), and a Llama block
    shuffled schedules its backward differently."""
    import onnx

    from fusecli.load import onnx as load_onnx
    from tests.shuffle import shuffled

    bases = F.base_models()
    path, copy, out = (str(tmp_path / name) for name in ("m.onnx", "s.onnx", "o.onnx"))
    for model, what in ((bases[4], "unknown"), (bases[9], "peak_bytes")):
        onnx.save(model, path)
        onnx.save(shuffled(model, 1), copy)
        with monkeypatch.context() as patch:
            patch.setattr(load_onnx, "canonicalize", lambda graph: False)
            result = F.order_child(path, out, copy)
        assert result["result"] == "property" and what in result["message"], result
        assert F.order_child(path, out, copy)["result"] == "ok"


def _sleeps(path, out):
    import time

    time.sleep(60)


def _allocates(path, out):
    return {"result": "ok", "size": len(bytearray(2 << 30))}


def test_a_case_over_its_limits_is_reported(tmp_path):
    """The harness itself: a child past its time limit is a hang, one past its memory cap a finding."""
    path, out = str(tmp_path / "m.onnx"), str(tmp_path / "o.onnx")
    assert F.run_case(path, out, time_limit=1, work=_sleeps)["result"] == "hang"
    assert F.run_case(path, out, work=_allocates)["result"] == "memory"
