"""--plot: the axis unit follows the peak (a 69 KiB peak is not '0.1 MiB'); the labels say what they show."""

from __future__ import annotations

import pytest

from fusecli.pipeline import Options, analyze
from fusecli.plot import axis_unit, plot_timeline


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
