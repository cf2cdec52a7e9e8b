"""``benchmarks/cut_simulation.py``'s engine clock: a step takes the curve's ms at its verified tokens, the rest of a
step, and the drafts' ms once when it verifies any draft token; a malformed curve is refused at the door."""

from __future__ import annotations

import numpy as np
import pytest

from research.experiments.cut_simulation import CURVE, EngineClock, parse_curve


def test_a_step_takes_the_curve_at_its_tokens_plus_the_rest():
    tokens, ms = parse_curve(["16:28", "8:20"])  # any order: sorted by tokens
    assert tokens.tolist() == [8, 16] and ms.tolist() == [20, 28]
    clock = EngineClock(tokens, ms, step_ms=5.0, draft_ms=2.0)
    clock.step(8, 8)  # eight rows, no draft token: the curve's first point and the rest
    assert clock() == pytest.approx(0.025)
    clock.step(8, 12)  # four draft tokens: halfway along the curve, and the drafts' ms
    assert clock() == pytest.approx(0.025 + 0.031)
    clock.step(8, 20)  # past the last point: its last segment's slope, 1 ms a token
    assert clock() == pytest.approx(0.025 + 0.031 + 0.039)
    clock.step(2, 2)  # below the first point: flat
    assert clock() == pytest.approx(0.025 + 0.031 + 0.039 + 0.025)


@pytest.mark.parametrize("points", [["8"], ["8:x"], ["0:20"], ["8:0"], ["8:20", "8:21"]])
def test_a_malformed_curve_is_refused_naming_the_fix(points):
    with pytest.raises(SystemExit, match="--curve"):
        parse_curve(points)


def test_the_default_curve_rises():
    tokens, ms = parse_curve(list(CURVE))
    assert np.all(np.diff(tokens) > 0) and ms[-1] > ms[0]
