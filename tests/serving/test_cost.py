"""The engine step-cost model behind the proposer's break-even cut: known answers on exact and noisy steps."""

from __future__ import annotations

import numpy as np
import pytest

from serving.cost import StepCostModel


def test_fit_and_break_even_known_answers():
    model = StepCostModel(min_steps=4)
    assert model.break_even(32) == 0.0  # nothing observed yet: draft freely
    rng = np.random.default_rng(0)
    for n in rng.integers(1, 129, 400):
        model.observe(int(n), 0.021 + 0.0025 * n + rng.normal(0, 1e-4))
    coefficients = model.coefficients
    assert coefficients is not None
    a, b = coefficients
    assert a == pytest.approx(0.021, rel=0.05) and b == pytest.approx(0.0025, rel=0.02)
    assert model.break_even(1) == pytest.approx(0.0025 / 0.0235, rel=0.05)
    assert model.break_even(32) == pytest.approx(0.08 / 0.101, rel=0.02)
    assert model.break_even(1) < model.break_even(8) < model.break_even(32) < 1.0


def test_no_fit_without_spread_and_bad_arguments():
    model = StepCostModel(min_steps=4)
    for _ in range(10):
        model.observe(4, 0.03)  # every step the same size: a and b cannot be told apart
    assert model.coefficients is None and model.break_even(8) == 0.0
    model.observe(0, 0.03)  # ignored
    model.observe(5, -1.0)  # ignored
    assert model.coefficients is None
    with pytest.raises(ValueError, match="window"):
        StepCostModel(window=2)


def test_one_slow_step_does_not_move_the_fit():
    """The first step of an engine (lazy initialisation) can take 5x a normal one: the fit drops it."""
    model = StepCostModel(min_steps=8)
    model.observe(3, 0.27)
    for n in (1, 2, 4, 5, 15, 18, 20, 22, 19, 17, 25, 12):
        model.observe(n, 0.035 + 0.0024 * n)
    fit = model.coefficients
    assert fit is not None
    assert fit[0] == pytest.approx(0.035, rel=0.02) and fit[1] == pytest.approx(0.0024, rel=0.02)
