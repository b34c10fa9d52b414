"""Output rules for every command: a refused target is one ``error:`` line before any work, exit 1
(2 for a usage error), with the input and any old output intact and no temporary file left."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from fusecli.cli import main
from fusecli.core.output import PART_PREFIX, SCRATCH_PREFIX

ROOT = Path(__file__).resolve().parents[2]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (a symlink by where it points), to compare before and after."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        if p.is_symlink():
            out[rel] = b"->" + os.readlink(p).encode()
        elif p.is_file():
            out[rel] = p.read_bytes()
        elif not p.is_dir():
            out[rel] = b"special"
    return out


def one_error(r, code: int = 1) -> str:
    assert r.exit_code == code, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.output and "internal error" not in r.stderr and r.stdout == ""
    return lines[0]


@pytest.fixture
def model(tmp_path, sample) -> Path:
    path = tmp_path / "in" / "m.onnx"
    path.parent.mkdir()
    shutil.copy(sample("conv_bn_relu"), path)
    return path


@pytest.fixture
def fake_savedmodel(tmp_path) -> Path:
    """A folder shaped like a SavedModel: the outputs are refused before it is ever read."""
    sm = tmp_path / "sm"
    (sm / "variables").mkdir(parents=True)
    (sm / "saved_model.pb").write_bytes(b"pb")
    (sm / "variables" / "variables.index").write_bytes(b"index")
    (sm / "variables" / "variables.data-00000-of-00001").write_bytes(b"data")
    return sm


COMMANDS = {
    "render": lambda m, out: ("render", m, "-o", out, "--batch", "2"),
    "rewrite": lambda m, out: ("rewrite", m, "-o", out, "--batch", "2"),
    "plot": lambda m, out: ("analyze", m, "--plot", out, "--batch", "2"),
}
EXT = {"render": ".svg", "rewrite": ".onnx", "plot": ".png"}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("target", ["saved_model.pb", "variables/variables.index",
                                    "variables/variables.data-00000-of-00001", "new{ext}",
                                    "variables/new{ext}"])
def test_nothing_is_written_into_an_input_savedmodel(tmp_path, fake_savedmodel, command, target):
    before = snapshot(tmp_path)
    out = fake_savedmodel / target.format(ext=EXT[command])
    line = one_error(run(*COMMANDS[command](fake_savedmodel, out)))
    assert "input" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("how", ["same path", "symlink", "hard link"])
def test_the_input_file_is_never_replaced(tmp_path, model, command, how):
    out = model
    if how == "symlink":
        out = tmp_path / f"link{EXT[command]}"
        out.symlink_to(model)
    elif how == "hard link":
        out = tmp_path / f"hard{EXT[command]}"
        os.link(model, out)
    before = snapshot(tmp_path)
    line = one_error(run(*COMMANDS[command](model, out)))
    assert "refusing to overwrite the input model" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("how", ["same path", "symlink", "hard link"])
def test_external_data_of_the_input_is_never_replaced(tmp_path, sample, how):
    folder = tmp_path / "ext"
    folder.mkdir()
    m = onnx.load(sample("conv_bn_relu"))
    onnx.save_model(m, folder / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.svg", size_threshold=0)
    data = folder / "weights.svg"
    assert data.is_file()
    out = data
    if how == "symlink":
        out = tmp_path / "link.svg"
        out.symlink_to(data)
    elif how == "hard link":
        out = tmp_path / "hard.svg"
        os.link(data, out)
    before = snapshot(tmp_path)
    line = one_error(run("render", folder / "m.onnx", "-o", out, "--batch", "2"))
    assert "refusing to overwrite the input model" in line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("kind", ["folder", "folder/", "missing/", "fifo", "missing folder"])
def test_targets_that_are_no_regular_file_are_refused(tmp_path, model, command, kind):
    (tmp_path / "d").mkdir()
    os.mkfifo(tmp_path / "pipe")
    out = {"folder": tmp_path / "d", "folder/": f"{tmp_path / 'd'}/", "missing/": f"{tmp_path / 'new'}/",
           "fifo": tmp_path / "pipe", "missing folder": tmp_path / "no" / f"x{EXT[command]}"}[kind]
    before = snapshot(tmp_path)
    line = one_error(run(*COMMANDS[command](model, out)))
    assert any(w in line for w in ("folder", "not a regular file")), line
    assert snapshot(tmp_path) == before


def test_a_device_node_is_refused_and_left_alone(model):
    if not os.path.exists("/dev/null"):
        pytest.skip("no /dev/null")
    for command in COMMANDS:
        line = one_error(run(*COMMANDS[command](model, "/dev/null")))
        assert "not a regular file" in line
    assert not os.path.isfile("/dev/null")  # still the device


@pytest.mark.parametrize("args", [
    ("rewrite", "{m}", "-o", "{tmp}/out.txt"),
    ("render", "{m}", "-o", "{tmp}/out.jpg"),
    ("analyze", "{m}", "--plot", "{tmp}/p.txt"),
    ("analyze", "{m}", "--patterns", "nope"),
    ("analyze", "{m}", "--patterns", ""),
    ("analyze", "{m}", "--patterns", "conv_bn_act,"),
    ("rewrite", "{m}", "-o", "{tmp}/o.onnx", "--patterns", "nope"),
    ("analyze", "{m}", "-v", "-q"),
])
def test_bad_option_values_are_usage_errors(tmp_path, model, args):
    r = run(*[a.format(m=model, tmp=tmp_path) for a in args])
    line = one_error(r, code=2)
    assert "-h for help" in line
    assert not [p for p in tmp_path.iterdir() if p.name not in ("in",)]


def test_plot_checks_come_before_the_analysis(tmp_path, monkeypatch):
    """A missing matplotlib or a bad extension is reported even when the model is not readable yet."""
    import importlib.util

    missing = tmp_path / "missing.onnx"
    one_error(run("analyze", missing, "--plot", tmp_path / "p.txt"), code=2)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib"
                        else real(name, *a))
    line = one_error(run("analyze", missing, "--plot", tmp_path / "p.png"))
    assert "pip install 'fusecli[plot]'" in line


def test_plot_says_what_it_wrote(tmp_path, model):
    pytest.importorskip("matplotlib")
    out = tmp_path / "live.png"
    r = run("analyze", model, "--plot", out, "--batch", "2", "--json")
    assert r.exit_code == 0, r.output
    assert f"wrote {out} (live memory over" in r.stderr and "peak" in r.stderr
    assert out.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EACCES, errno.EROFS])
def test_write_errors_are_one_line_and_keep_the_old_file(tmp_path, model, monkeypatch, error):
    out = tmp_path / "g.dot"
    out.write_bytes(b"old")
    real_fdopen = os.fdopen

    class Failing:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            raise OSError(error, os.strerror(error))

    monkeypatch.setattr(os, "fdopen", lambda fd, mode="r", *a, **k: Failing(real_fdopen(fd, mode, *a, **k)))
    line = one_error(run("render", model, "-o", out, "--batch", "2"))
    assert "cannot write" in line and "nothing written" in line
    assert out.read_bytes() == b"old"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(PART_PREFIX)]


def test_unwritable_folder_is_refused_before_any_work(tmp_path, model, monkeypatch):
    real = os.access
    monkeypatch.setattr(os, "access",  # root may write anywhere: say no to writes only
                        lambda path, mode, **kw: False if mode & os.W_OK else real(path, mode, **kw))
    line = one_error(run("render", model, "-o", tmp_path / "g.svg", "--batch", "2"))
    assert "permission denied" in line


def test_stale_temp_files_of_a_killed_run_are_removed(tmp_path, model):
    dead = 2**22 + 1  # above Linux's largest pid: no such process
    stale = tmp_path / f"{PART_PREFIX}{dead}-abc.part"
    stale.write_bytes(b"x" * 100)
    mine = tmp_path / f"{PART_PREFIX}{os.getpid()}-live.part"  # a running process's: left alone
    mine.write_bytes(b"y")
    assert run("render", model, "-o", tmp_path / "g.dot", "--batch", "2").exit_code == 0
    assert not stale.exists() and mine.exists()


def _child(code: str, *args) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), FUSECLI_TEST_READY="1")
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for(path: Path, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < end, "the child never got there"
        time.sleep(0.05)


def test_sigterm_during_a_write_leaves_the_old_file_and_no_part(tmp_path, model):
    out = tmp_path / "g.dot"
    out.write_bytes(b"old")
    ready = tmp_path / "ready"
    child = _child("""
        import sys, time
        import fusecli.core.output as o
        real = o.atomic_write
        from contextlib import contextmanager
        @contextmanager
        def slow(path, mode="wb"):
            with real(path, mode) as f:
                f.write(b"half of the new")
                f.flush()
                open(sys.argv[3], "w").close()
                time.sleep(60)
                yield f
        o.atomic_write = slow
        from fusecli.cli import main
        main(["render", sys.argv[1], "-o", sys.argv[2], "--batch", "2"])
    """, model, out, ready)
    _wait_for(ready)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(PART_PREFIX)]  # mid-write
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert child.returncode == 143 and err.decode().strip() == "error: terminated"
    assert out.read_bytes() == b"old"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(PART_PREFIX)]


def test_sigterm_during_rewrite_removes_its_scratch_folder(tmp_path, model):
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    ready = tmp_path / "ready"
    child = _child("""
        import sys, time, tempfile
        tempfile.tempdir = sys.argv[3]
        import fusecli.rewrite.verify.outputs as verify  # rewrite imports it when it verifies
        def slow(*a, **k):
            open(sys.argv[4], "w").close()
            time.sleep(60)
        verify.verify = slow
        from fusecli.cli import main
        main(["rewrite", sys.argv[1], "-o", sys.argv[2], "--batch", "2"])
    """, model, tmp_path / "o.onnx", scratch, ready)
    _wait_for(ready)
    assert [p.name for p in scratch.iterdir() if p.name.startswith(SCRATCH_PREFIX)]
    child.send_signal(signal.SIGTERM)
    child.communicate(timeout=60)
    assert child.returncode == 143
    assert list(scratch.iterdir()) == [] and not (tmp_path / "o.onnx").exists()
    assert tempfile.gettempdir() != str(scratch)


def test_broken_pipe_exits_quietly(model):
    child = subprocess.Popen([sys.executable, "-m", "fusecli", "analyze", str(model), "--batch", "2", "-v"],
                             cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    child.stdout.close()  # the reader is gone before anything is written
    err = child.stderr.read()
    child.wait(timeout=60)
    assert child.returncode == 141 and err == b""
