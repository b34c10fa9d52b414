"""--bench verdicts: spread from real timings, words, and refusing a measured slowdown."""

from fusecli.rewrite.verify.benchverdict import Spread, compare, comparisons, slowdown
from fusecli.rewrite.verify.outputs import Timing


def _t(label, times):
    return Timing(label, sorted(times)[len(times) // 2], len(times), list(times))


def test_spread_is_the_quartiles():
    s = Spread.of([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (s.low, s.q1, s.median, s.q3, s.high) == (1.0, 2.0, 3.0, 4.0, 5.0)


def test_overlapping_ranges_are_no_measurable_difference():
    a, b = Spread.of([10, 11, 12, 13, 14]), Spread.of([11, 12, 12.5, 13, 15])
    assert compare(a, b) == "no measurable difference"
    assert compare(a, Spread.of([20, 21, 22, 23, 24])) == "slower"
    assert compare(a, Spread.of([5, 6, 7, 8, 9])) == "faster"
    # apart but within 2%: noise
    assert compare(Spread.of([100, 100, 100]), Spread.of([101, 101, 101])) == "no measurable difference"


def test_slowdown_pairs_each_rewritten_with_its_original():
    ts = [_t("original", [10, 10, 11, 11, 12]), _t("rewritten", [8, 8, 9, 9, 9]),
          _t("original, ORT default opts", [5, 5, 5, 6, 6]),
          _t("rewritten, ORT default opts", [7, 7, 8, 8, 9])]
    cs = comparisons(ts)
    assert [(c.rewritten, c.verdict) for c in cs] == [("rewritten", "faster"),
                                                       ("rewritten, ORT default opts", "slower")]
    assert slowdown(ts).rewritten == "rewritten, ORT default opts"
    assert "inside the spread" in comparisons(ts[:1] + [_t("rewritten", [10, 11, 11, 12, 12])])[0].words()
