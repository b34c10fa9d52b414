"""The bound fit's guessed cut (load/bound_fit.py): on a decoder whose batch dim comes out of a Reshape,
every activation is open, and the fit sizes the float activations from three points before it cuts there.

The judge is onnxruntime: every tensor's bytes, through the formulas, as it allocates them when it runs
the export at two sizes (tests/load/test_onnx_sizes.py's oracle). An 80-layer decoder takes the guessed
cut by itself (GUESS_MIN_NODES); the 2-layer test models take it with the threshold set to 0.
"""

from __future__ import annotations

import pytest

from fusecli.load import bound_fit
from fusecli.load.bound_fit import _one_monomial, guess_points
from fusecli.pipeline import Options, analyze
from tests.load.test_onnx_sizes import ort_tensor_bytes

VARIABLES = ("batch", "seq")
USER = {"batch": 2, "seq": 16}


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_guessed_cut_sizes_as_onnxruntime_makes_it(hf_onnx, monkeypatch, name):
    """TorchScript exports with the default attention: GPT-2's batch comes out of ``view(-1, seq)`` and
    its position ids out of a Range; Llama's rotary halves are Slices whose ends are a Div of a shape (one
    K/V head per query head: the TorchScript exporter has no grouped-query sdpa)."""
    path = hf_onnx(name, "torchscript", attn="default", kv_heads=2 if name == "llama" else None)
    guessed: list[dict] = []
    real_guess = bound_fit.guess_shapes

    def spy(*args):
        guessed.append(real_guess(*args))
        return guessed[-1]

    monkeypatch.setattr(bound_fit, "GUESS_MIN_NODES", 0)
    monkeypatch.setattr(bound_fit, "guess_shapes", spy)
    a = analyze(path, Options(batch=2, dims={"seq": 16}))
    assert guessed and guessed[0], "the guessed cut was not taken"
    assert a.unknown_sizes == {} and a.sizes.opaque == {}
    activations = [t for t in a.graph.tensors.values() if t.producer is not None]
    for batch, seq in ((2, 16), (3, 24)):
        real = ort_tensor_bytes(path, name, batch, seq)
        at = {**a.sizes, "batch": batch, "seq": seq}
        wrong = [(t.name, t.shape, real[t.name]) for t in activations
                 if t.name in real and a.sizes.formula(t).evaluate(at) != real[t.name]]
        assert not wrong, f"{len(wrong)} of {len(activations)} tensors sized wrongly, e.g. {wrong[:3]}"


def test_a_guess_is_one_monomial_or_a_constant_and_only_one():
    points = [{"batch": 2, "seq": 16}, {"batch": 17, "seq": 19}, {"batch": 29, "seq": 31}]
    mons = [("batch",), ("seq",), ("batch", "batch"), ("batch", "seq"), ("seq", "seq")]

    def at(f):
        return [f(p["batch"], p["seq"]) for p in points]

    assert _one_monomial(at(lambda b, s: 64), points, mons) == 64
    assert _one_monomial(at(lambda b, s: s), points, mons) == "seq"
    assert _one_monomial(at(lambda b, s: 12 * b * s), points, mons) == "12*batch*seq"
    assert _one_monomial(at(lambda b, s: s + 1), points, mons) is None  # two terms: the fit's to size
    assert _one_monomial(at(lambda b, s: s // 2), points, mons) is None  # not a polynomial
    # the same numbers from two monomials: no guess
    twins = [{"batch": 4, "seq": 4}, {"batch": 5, "seq": 5}, {"batch": 6, "seq": 6}]
    assert _one_monomial([4, 5, 6], twins, mons) is None


def test_guess_points_move_every_dim():
    for user in (USER, {"batch": 17, "seq": 29}, {"batch": 19, "seq": 18}):
        points = guess_points(user, VARIABLES)
        assert len(points) == 2
        for v in VARIABLES:
            values = [user[v], *(p[v] for p in points)]
            assert len(set(values)) == 3 and all(x > 1 for x in values[1:])
