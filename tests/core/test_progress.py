"""Progress: stage names reach a callback; the spinner shows only on a terminal's stderr, never in CI."""

from __future__ import annotations

import io

import pytest

from fusecli.core import progress
from fusecli.pipeline import Options, analyze


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.fixture
def no_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)


def test_shown_only_on_a_terminal(no_ci):
    assert progress.should_show(_Stream(tty=True))
    assert not progress.should_show(_Stream(tty=False))


@pytest.mark.parametrize("var", ["CI", "NO_COLOR"])
def test_never_under_ci_or_no_color(no_ci, monkeypatch, var):
    monkeypatch.setenv(var, "1")
    assert not progress.should_show(_Stream(tty=True))


def test_stream_without_isatty_is_not_a_terminal(no_ci):
    assert not progress.should_show(object())


def test_analyze_reports_its_stages_in_order(sample):
    seen: list[str] = []
    analyze(sample("conv_bn_relu"), Options(batch=2), on_stage=seen.append)
    assert seen == ["reading", "shape inference", "building the graph", "sizes", "backward", "liveness",
                    "fusion"]


def test_stage_outside_an_analysis_goes_nowhere(sample, capsys):
    seen: list[str] = []
    analyze(sample("conv_bn_relu"), Options(batch=2), on_stage=seen.append)
    count = len(seen)
    progress.stage("reading")  # the analysis' reporter is gone: nothing reaches it, nothing is printed
    assert len(seen) == count > 0
    assert capsys.readouterr() == ("", "")


def test_spinner_shows_a_stage_name_as_text(monkeypatch, no_ci):
    """A stage names a file (diff's 'reading NAME'): its control characters are escapes, its brackets are
    not rich markup."""
    fake = _Stream(tty=True)
    monkeypatch.setattr("sys.stderr", fake)
    with progress.stages() as report:
        report("reading [bold]x\x1b]0;PWNED\x07.onnx")
    drawn = fake.getvalue()
    assert "[bold]x\\x1b]0;PWNED\\x07.onnx" in drawn and "\x1b]0;PWNED" not in drawn


def test_silent_when_stderr_is_not_a_terminal(sample, capsys, no_ci):
    analyze(sample("conv_bias_relu"), Options(batch=2))
    out, err = capsys.readouterr()
    assert out == "" and err == ""


def test_silent_under_ci_even_on_a_terminal(sample, capsys, monkeypatch, no_ci):
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr("sys.stderr", _Stream(tty=True))
    analyze(sample("conv_bias_relu"), Options(batch=2))
    assert progress.sys.stderr.getvalue() == ""
    assert capsys.readouterr().out == ""


def test_spinner_draws_on_a_terminal_and_is_cleared(sample, monkeypatch, no_ci):
    fake = _Stream(tty=True)
    monkeypatch.setattr("sys.stderr", fake)
    with progress.stages() as report:
        report("backward")
    assert "fusecli" in fake.getvalue()  # drawn (rich writes to the stream it was given)


def test_cli_json_stdout_is_only_json(sample, tmp_path):
    import json

    from click.testing import CliRunner

    from fusecli.cli import main

    result = CliRunner().invoke(main, ["analyze", sample("conv_bias_relu"), "--json", "--batch", "2"])
    assert result.exit_code == 0
    json.loads(result.stdout)


def _stages_of(*args) -> list[str]:
    from click.testing import CliRunner

    from fusecli.cli import main

    seen: list[str] = []
    with progress.stages(seen.append):
        r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return seen


@pytest.mark.skipif(__import__("shutil").which("dot") is None, reason="Graphviz's dot is not installed")
def test_render_reports_drawing_and_layout(sample, tmp_path):
    seen = _stages_of("render", sample("bn_add_relu"), "-o", tmp_path / "g.svg", "--batch", "2")
    assert seen[:2] == ["reading", "shape inference"]
    assert seen[-3:] == ["drawing 3 nodes", "laying out 3 nodes (Graphviz dot)", "writing"]


def test_rewrite_reports_passes_verification_and_bench(sample, tmp_path):
    seen = _stages_of("rewrite", sample("conv_bn_relu"), "-o", tmp_path / "o.onnx", "--batch", "2",
                      "--bench", "--threads", "1")
    assert "rewriting (pass 1)" in seen
    tail = [s for s in seen if s.startswith(("verifying", "benchmarking", "writing"))]
    assert tail[:2] == ["verifying fused regions with onnxruntime",
                        "verifying the whole model with onnxruntime"]
    assert tail[2].startswith("benchmarking") and tail[-1] == "writing"
