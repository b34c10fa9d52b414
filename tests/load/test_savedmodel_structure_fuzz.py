"""Seeded structural mutations of hand-made SavedModels (tensor references, claimed output counts, ops,
function calls) through analyze: one error line or a result, never an internal error, hang or blow-up.

Each case runs in a forked child with the fuzzer's time limit and memory cap (tests/fuzz_structure.py).
"""

from __future__ import annotations

import contextlib
import os
import random

from tests import hostile as H
from tests.fuzz_structure import run_case

CASES = int(os.environ.get("FUSECLI_SM_FUZZ_CASES", "150"))
_OPS = [H._RELU, H._UNPACK, H._SHAPEN, {"name": "IdentityN", "outputs": [{"name": "output",
                                                                            "type_list_attr": "T"}]}]
_REFS = ["x", "x:0", "x:output:0", "r:y:0", "r:y:1", "u:output:0", "u:output:2", "u:output:-1", "u:nope:0",
         "s:output:0", "c:output:0", "c:output:5", "missing:0", "", "^r", "r:y:", ":0", "r::0"]


def _body(r: random.Random) -> tuple[list[dict], str, list]:
    nodes = [{"name": "r", "op": "Relu", "input": ["x"], "attr": {"T": 1}},
             {"name": "u", "op": "Unpack", "input": ["r:y:0"], "attr": {"num": 3, "T": 1}},
             {"name": "s", "op": "ShapeN", "input": ["u:output:1"], "attr": {"N": 1, "T": 1, "out_type": 3}},
             {"name": "c", "op": "PartitionedCall", "input": ["u:output:2"], "attr": {"f": "g"}},
             {"name": "y", "op": "Relu", "input": ["c:output:0"], "attr": {"T": 1}}]
    functions = [("g", [{"name": "gr", "op": "Relu", "input": ["x"], "attr": {"T": 1}}], "gr:y:0", ["x"])]
    for _ in range(r.randint(1, 3)):
        nd = r.choice(nodes)
        k = r.randrange(6)
        if k == 0:
            nd["input"] = [r.choice(_REFS) for _ in range(r.randint(0, 3))]
        elif k == 1 and nd["op"] in ("Unpack", "ShapeN"):
            count = r.choice([0, -1, 2, 7, 10**6, 10**12, -2**63])
            nd["attr"]["num" if nd["op"] == "Unpack" else "N"] = count
        elif k == 2:
            nd["op"] = r.choice(["Relu", "Unpack", "ShapeN", "IdentityN", "g", "f", "NoSuchOp",
                                 "PartitionedCall"])
        elif k == 3:
            nd["attr"]["f"] = r.choice(["g", "f", "missing", ""])
        elif k == 4:
            functions[0] = ("g", [{"name": "gr", "op": "PartitionedCall", "input": ["x"],
                                   "attr": {"f": r.choice(["g", "f"])}}], "gr:output:0", ["x"])
        else:
            nd["name"] = r.choice(["r", "u", "", "y", "x"])
    ret = r.choice(["y:y:0", "y:y:0", "c:output:0", "u:output:9", "missing:0", "x"])
    return nodes, ret, functions


def _analyze(path, _out):
    from fusecli.core.errors import FuseError
    from fusecli.pipeline import Options, analyze

    try:
        analyze(path, Options(batch=2))
        return {"result": "ok"}
    except FuseError as e:
        return {"result": "error", "lines": str(e).strip().count("\n") + 1, "message": str(e)[:200]}
    except Exception as e:  # noqa: BLE001 - anything else is the finding
        return {"result": "internal", "message": f"{type(e).__name__}: {str(e)[:200]}"}


def test_structural_mutations_of_saved_models(tmp_path):
    import fusecli.pipeline  # noqa: F401  (imported once, before the forks)

    with contextlib.suppress(ImportError):  # TensorFlow sizes the dims (load.tf_sizes): its import, seconds,
        import tensorflow  # noqa: F401  happens once here, not in every fork's time limit

    findings, counts = [], {}
    for seed in range(CASES):
        r = random.Random(seed)
        body, ret, functions = _body(r)
        folder = str(tmp_path / f"sm{seed}")
        H.saved_model(folder, body, ret, [H._RELU, H._UNPACK, H._SHAPEN, _OPS[3]], functions)
        result = run_case(folder, "", time_limit=10, work=_analyze)
        counts[result["result"]] = counts.get(result["result"], 0) + 1
        if result["result"] not in ("ok", "error") or result.get("lines", 1) != 1:
            findings.append((seed, body, ret, functions, result))
    print(counts)
    assert not findings, findings[:3]
    assert counts.get("error", 0) and counts.get("ok", 0), counts  # both kinds of outcome reached
