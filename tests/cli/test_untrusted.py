"""A model file is untrusted input (docs/cli.md): its strings never run as code in a helper fusecli
writes, and never reach the terminal as control characters (issue 61's two files, and a corpus of
hostile names in dims, module paths and node names). Each command runs as a process, so what is
checked is the bytes it writes to stdout and stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import onnx
import pytest

from fusecli.plan.emit import write_pytorch_helper
from tests.cli.untrusted_models import HOSTILE, INJECTED_DIM, INJECTED_NODE, stack

FUSECLI = [sys.executable, "-m", "fusecli"]
CONTROL = set(range(0x20)) - {0x0a}  # no byte below 0x20 but newline, on stdout or stderr


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """Issue 61's two files, and one whose every dim, scope and node name is hostile."""
    folder = tmp_path_factory.mktemp("untrusted")
    models = {"injected_dim": stack(["layers.0", "layers.1"], dim=INJECTED_DIM),
              "escape_node": stack(["layers.0", "layers.1"], node=INJECTED_NODE),
              "corpus": stack([f"layers.{i}.{h}" for i, h in enumerate(HOSTILE)], dim=HOSTILE[1],
                              node=HOSTILE[7])}
    out = {}
    for name, m in models.items():
        out[name] = str(folder / f"{name}.onnx")
        onnx.save(m, out[name])
    return out


def run(*args, cwd=None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("FUSECLI_DEBUG", "FORCE_COLOR")}
    return subprocess.run([*FUSECLI, *args], capture_output=True, cwd=cwd, env=env, timeout=300)


def assert_no_controls(r: subprocess.CompletedProcess) -> None:
    for stream in (r.stdout, r.stderr):
        bad = sorted(CONTROL & set(stream))
        assert not bad, f"control bytes {bad} in {stream[:400]!r}"
    assert b"Traceback" not in r.stderr


def import_helper(path) -> subprocess.CompletedProcess:
    """``import helper`` in a fresh interpreter in an empty folder: what a user does with it."""
    folder = os.path.dirname(path)
    name = os.path.splitext(os.path.basename(path))[0]
    return subprocess.run([sys.executable, "-c", f"import {name}; print(len({name}.MODULES), end='')"],
                          capture_output=True, cwd=folder, timeout=120, text=True)


@pytest.mark.parametrize("which", ["injected_dim", "escape_node", "corpus"])
def test_text_output_has_no_control_characters(files, which, tmp_path):
    model = files[which]
    dims = ["--dim", "seq=8", "--batch", "2"]
    for args in (["analyze", model, *dims, "-v"], ["analyze", model, *dims, "-q"],
                 ["render", model, "--dot", *dims], ["render", model, "--view", "backward", "--dot", *dims],
                 ["render", model, "-o", str(tmp_path / "g.svg"), *dims],
                 ["rewrite", model, "-o", str(tmp_path / "fused.onnx"), *dims],
                 ["diff", model, files["corpus" if which != "corpus" else "injected_dim"], *dims],
                 ["plan", model, "--budget", "1MiB", *dims],
                 ["plan", model, "--budget", "1MiB", "--emit-pytorch", str(tmp_path / "h.py"), *dims]):
        r = run(*args)
        assert r.returncode in (0, 1), (args, r.stderr[-400:])
        assert_no_controls(r)
        assert r.stdout or r.stderr
    json_run = run("analyze", model, *dims, "--json")
    doc = json.loads(json_run.stdout)  # JSON keeps the exact strings: json escapes them itself
    text = json.dumps(doc)
    assert "\x1b" not in json_run.stdout.decode() and ("\\u001b" in text or which == "injected_dim")


def test_issue_61_helper_runs_no_injected_code(files, tmp_path):
    helper = tmp_path / "helper.py"
    r = run("plan", files["injected_dim"], "--budget", "80KiB", "--batch", "64",
            "--emit-pytorch", str(helper))
    assert helper.exists(), r.stderr
    i = import_helper(helper)
    assert i.returncode == 0 and i.stdout == "0" and i.stderr == "", i.stderr
    assert "INJECTED" not in i.stdout


def test_helpers_from_hostile_strings_import_with_no_side_effect(tmp_path):
    """Every model string a helper holds (module paths, dim names, the model's name) is hostile: each
    helper compiles, is printable ASCII, holds the exact strings as literals, and importing them all (one
    fresh interpreter, each from an empty folder of its own) prints nothing and writes nothing."""
    size = SimpleNamespace(bytes=1234)
    folders = []
    for i, text in enumerate(HOSTILE):
        plan = SimpleNamespace(checkpoints=[text, f"layers.0.{text}"], dims={text: 3, "seq": 8}, saved=size,
                               peak=size, planned_saved=None, planned_peak=None,
                               options=SimpleNamespace(budget=1 << 20),
                               sac=None if i % 2 else ("torchtitan", None),  # plan --sac: its policy too
                               sac_forced_mm_shapes=[(64, 4)])
        folder = tmp_path / f"case{i}"
        folder.mkdir()
        helper = folder / f"helper{i}.py"
        write_pytorch_helper(str(helper), plan, f"{text}.onnx")
        source = helper.read_text(encoding="ascii")  # printable ASCII only, escapes for the rest
        namespace: dict = {}
        without_torch = source.replace("from torch.utils.checkpoint import checkpoint", "")
        exec(compile(without_torch, str(helper), "exec"), namespace)
        assert namespace["MODULES"] == [text, f"layers.0.{text}"]  # the exact strings, as literals
        assert namespace["PREDICTED_AT"] == {text: 3, "seq": 8}
        folders.append(folder)
    script = "; ".join(["import importlib, os, sys"] + [
        f"os.chdir({str(f)!r}); sys.path.insert(0, {str(f)!r}); importlib.import_module('helper{i}')"
        for i, f in enumerate(folders)])
    i = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert i.returncode == 0 and i.stdout == "" and i.stderr == "", i.stderr[-400:]
    for k, folder in enumerate(folders):
        assert sorted(os.listdir(folder)) in ([f"helper{k}.py"], ["__pycache__", f"helper{k}.py"])  # no PWNED
