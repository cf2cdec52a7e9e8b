"""``benchmarks/ranking_headroom.py``'s cut: chains cut at a path score, stepped through a request, and priced on the
simulated engine's clock."""

from __future__ import annotations

import numpy as np
import pytest

from research.experiments.cut_simulation import EngineClock, parse_curve
from research.experiments.ranking_headroom import CutRun, Position, Request, cut_run


def _position(pos: int) -> Position:
    empty = np.zeros(0)
    return Position(0, pos, empty, empty, empty, empty, empty, empty, empty)


def test_a_cut_keeps_the_chain_prefix_that_clears_it_and_steps_through_the_request():
    request = Request("r", [7], [0, 1, 2, 3, 4, 5], "g", fit=False)  # five tokens after the prefill's
    positions = [_position(1), _position(3)]
    scores = np.array([[0.9, 0.6, 0.2], [0.5, 0.1, 0.0]])
    ok = np.array([[True, True, False], [True, False, False]])
    # at 0.5 position 1 drafts two, both accepted (to position 4); 4 and 5 have no union: one token a step
    assert cut_run(positions, (scores, ok), 0.5, [request], fit=False) == CutRun(5, 3, 2, 1)
    # at 0.15 it drafts the rejected third too: the same steps, one more draft token
    assert cut_run(positions, (scores, ok), 0.15, [request], fit=False) == CutRun(5, 3, 3, 1)
    # at 0.95 nothing is drafted: five steps of one token
    assert cut_run(positions, (scores, ok), 0.95, [request], fit=False) == CutRun(5, 5, 0, 0)
    assert cut_run(positions, (scores, ok), 0.5, [request], fit=True) == CutRun(0, 0, 0, 0)  # not in that half


def test_a_cut_run_is_priced_as_its_mean_step():
    tokens, ms = parse_curve(["8:20", "16:28"])
    clock = EngineClock(tokens, ms, step_ms=5.0, draft_ms=2.0)
    run = CutRun(tokens=5, steps=3, drafted=2, drafting=1)
    # two rows a step: 2 * (1 + 2/3) tokens, under the curve's first point (20 ms); a draft step with chance 5/9
    seconds = 3 / 2 * 1e-3 * (20.0 + 5.0 + 5 / 9 * 2.0)
    assert run.rate(clock, rows=2) == pytest.approx(5 / seconds)
