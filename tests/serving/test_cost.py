"""The engine's step-cost curve and the batch's goodput choice of draft tokens (:mod:`serving.cost`): the curve of
known line, knee and step costs, and the tokens chosen on each, where the best count is known by hand."""

from __future__ import annotations

import numpy as np
import pytest

from drafting.draft import Drafts, ScoreKind
from serving.cost import StepCostModel, StepCurve, best_mask

CHAIN = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
"""One row's chain scores (path probabilities: never rising)."""


def _model(cost, counts=range(1, 41), repeat: int = 3) -> StepCostModel:
    model = StepCostModel(min_steps=4, refit_every=1)
    for _ in range(repeat):
        for n in counts:
            model.observe(n, cost(n))
    return model


def _batch(rows: int) -> np.ndarray:
    return np.array(CHAIN * rows)


def test_a_line_is_recovered_from_noisy_steps():
    rng = np.random.default_rng(0)
    model = StepCostModel(min_steps=4)
    for n in rng.integers(1, 129, 400):
        model.observe(int(n), 0.021 + 0.0025 * n + rng.normal(0, 1e-4))
    curve = model.curve
    assert curve is not None
    n = np.array([16, 64, 128, 200])
    assert np.allclose(curve(n), 0.021 + 0.0025 * n, rtol=0.02)  # 200: past the steps seen, by the tail
    assert np.all(np.diff(curve.seconds) >= 0)


@pytest.mark.parametrize(("name", "cost", "rows", "best"), [
    # weights streamed until 12 tokens, then 10 ms a token: fill up to the knee and no further
    ("knee", lambda n: 0.025 if n <= 12 else 0.025 + 0.010 * (n - 12), 4, 8),
    # a GPU at small batch: a token costs 1/2000 of the step; every drafted token pays
    ("flat line", lambda n: 0.020 + 1e-5 * n, 4, 32),
    # a CPU at large batch: a token costs 10 ms on a 2 ms fixed cost; not even a 0.9 token pays
    ("steep line", lambda n: 0.002 + 0.010 * n, 4, 0),
    # tile steps of 16 tokens: the batch ends at a step's end (28 tokens: 32 verified; 12: 20.8 / 0.03 > 13.6 / 0.02)
    ("steps", lambda n: 0.020 + 0.010 * ((n - 1) // 16), 4, 28),
])
def test_the_goodput_choice_on_known_curves(name, cost, rows, best):
    model = _model(cost)
    scores = _batch(rows)
    assert model.keep(scores, rows) == best
    # the brute force over every count agrees
    order = np.sort(scores)[::-1]
    value = [(rows + order[:n].sum()) / cost(rows + n) for n in range(len(scores) + 1)]
    assert int(np.argmax(value)) == best


def test_one_slow_step_does_not_move_the_curve():
    """The first step of an engine (lazy initialisation) can take 5x a normal one: the medians drop it."""
    model = _model(lambda n: 0.035 + 0.0024 * n, counts=range(1, 30), repeat=2)
    model.observe(3, 0.27)
    curve = model.curve
    assert curve is not None
    assert curve(np.array([3]))[0] == pytest.approx(0.035 + 0.0024 * 3, rel=0.01)


def test_nothing_is_cut_before_the_curve_is_known_and_bad_arguments():
    model = StepCostModel(min_steps=4)
    assert model.keep(_batch(2), 2) == 16  # nothing observed yet: draft freely
    for _ in range(10):
        model.observe(4, 0.03)  # every step the same size: the slope cannot be told
    model.observe(0, 0.03)  # ignored
    model.observe(5, -1.0)  # ignored
    assert model.curve is None and model.keep(_batch(2), 2) == 16
    assert StepCurve.fit(np.array([4.0, 4.0]), np.array([0.1, 0.2])) is None
    for bad in ({"window": 2}, {"min_steps": 1}, {"refit_every": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            StepCostModel(**bad)


def test_the_best_tokens_are_a_prefix_of_every_chain():
    scores = np.array([0.9, 0.5, 0.5, 0.2, 0.8, 0.5, 0.1, 0.5, 0.5])  # three chains, with ties across them
    offsets = np.array([0, 4, 7, 9])
    drafts = Drafts(np.arange(9, dtype=np.int64), np.array([-1, 0, 1, 2, -1, 0, 1, -1, 0], np.int32), scores,
                    offsets, ScoreKind.PROBABILITY)
    for n in range(10):
        keep = best_mask(scores, n)
        assert keep.sum() == n
        lists = drafts.token_lists(keep)
        assert sum(map(len, lists)) == n
        for s, got in zip(offsets, lists):
            assert got == list(range(s, s + len(got)))  # a prefix of its chain
            assert keep[s:s + len(got)].all()
    assert drafts.token_lists() == [[0, 1, 2, 3], [4, 5, 6], [7, 8]]
