"""--plot: the axis unit follows the peak (a 69 KiB peak is not '0.1 MiB'); the labels say what they show,
including that tensors of unknown size are missing."""

from __future__ import annotations

import pytest

from fusecli.grad.backward import build_backward
from fusecli.load import load_model
from fusecli.memory.liveness import analyze_liveness
from fusecli.memory.sizes import bind
from fusecli.pipeline import Options, analyze
from fusecli.report.plot import axis_unit, plot_timeline


def test_axis_unit_follows_the_peak():
    assert axis_unit(69 * 1024) == ("KiB", 1024)
    assert axis_unit(500) == ("B", 1)
    assert axis_unit(3 * 2**20) == ("MiB", 2**20)
    assert axis_unit(5 * 2**30) == ("GiB", 2**30)


def test_plot_labels_the_peak_in_its_unit(sample, tmp_path, monkeypatch):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown: dict[str, list[str]] = {}
    real_close = plt.close

    def keep(fig):
        shown["texts"] = [t.get_text() for ax in fig.axes for t in ax.texts]
        shown["ylabel"] = [ax.get_ylabel() for ax in fig.axes]
        real_close(fig)

    monkeypatch.setattr(plt, "close", keep)
    a = analyze(sample("conv_bn_relu"), Options(batch=2))
    note = plot_timeline(a.liveness, str(tmp_path / "p.svg"), "t")
    peak_kib = a.liveness.peak_bytes / 1024
    assert 1 <= peak_kib < 1024
    assert f"peak {peak_kib:.1f} KiB" in shown["texts"] and shown["ylabel"] == ["live KiB"]
    assert note.endswith(f"peak {peak_kib:.1f} KiB")
    assert (tmp_path / "p.svg").read_bytes().startswith(b"<?xml")


def _drawn(monkeypatch) -> dict:
    """What the next figure closed shows: its title, texts and title colour."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown: dict = {}
    real_close = plt.close

    def keep(fig):
        ax = fig.axes[0]
        shown.update(title=ax.get_title(), color=ax.title.get_color(), texts=[t.get_text() for t in ax.texts])
        real_close(fig)

    monkeypatch.setattr(plt, "close", keep)
    return shown


def test_a_timeline_missing_tensors_says_so(sample, tmp_path, monkeypatch):
    """An activation of unknown size is left out of every step: the title says how many tensors are not
    drawn, the peak is labelled as a lower bound; a complete timeline carries no such mark."""
    graph = load_model(sample("conv_bn_relu"))
    sizes, _ = bind(graph, 2, {})
    live = analyze_liveness(build_backward(graph), sizes)
    shown = _drawn(monkeypatch)
    note = plot_timeline(live, str(tmp_path / "whole.svg"), "t")
    assert shown["title"] == "t" and "incomplete" not in note
    assert not any("\u2265" in t for t in shown["texts"])
    relu = next(n for n in graph.nodes if n.op_type == "Relu").outputs[0]
    relu.shape = (None, *relu.shape[1:])  # a dim no tool sized
    live = analyze_liveness(build_backward(graph), sizes)
    assert live.unknown
    note = plot_timeline(live, str(tmp_path / "part.svg"), "t")
    n = len(live.unknown)
    mark = f"incomplete: {n} tensor{'s' if n > 1 else ''} of unknown size not drawn"
    assert shown["title"] == f"t\n{mark}" and shown["color"] == "#d62728"
    assert any(t.startswith("peak \u2265 ") for t in shown["texts"]) and note.endswith(mark)
