"""The engine's step-cost curve (:mod:`drafting.cost`) and the goodput choice of a step's draft tokens on it (the native
:func:`crest_native.goodput_keep` against its oracle, ``tests/oracle/goodput.py``): the curve of known line, knee and
step costs, and the tokens kept on each, where the best count is known by hand."""

from __future__ import annotations

import numpy as np
import pytest

from crest_native import goodput_keep
from drafting.cost import StepCostModel, fit_curve
from drafting.draft import CostCurve, Drafts, ScoreKind
from oracle import goodput as oracle

CHAIN = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
"""One row's chain scores (path probabilities: never rising)."""


def _model(cost, counts=range(1, 41), repeat: int = 3) -> StepCostModel:
    model = StepCostModel(min_steps=4, refit_every=1)
    for _ in range(repeat):
        for n in counts:
            model.observe(n, cost(n), drafted=True)
    return model


def _at(curve: CostCurve, n) -> float:
    return oracle.curve_at(curve.tokens.tolist(), curve.seconds.tolist(), curve.tail, n)


def test_a_line_is_recovered_from_noisy_steps():
    rng = np.random.default_rng(0)
    model = StepCostModel(min_steps=4)
    for n in rng.integers(1, 129, 400):
        model.observe(int(n), 0.021 + 0.0025 * n + rng.normal(0, 1e-4), drafted=True)
    curve = model.curve
    assert curve is not None and np.all(np.diff(curve.seconds) >= 0) and np.all(np.diff(curve.tokens) > 0)
    for n in (16, 64, 128, 200):  # 200: past the steps seen, by the tail
        assert _at(curve, n) == pytest.approx(0.021 + 0.0025 * n, rel=0.02)


@pytest.mark.parametrize(("name", "cost", "rows", "best"), [
    # weights streamed until 12 tokens, then 10 ms a token: fill up to the knee and no further
    ("knee", lambda n: 0.025 if n <= 12 else 0.025 + 0.010 * (n - 12), 4, 8),
    # a GPU at small batch: a token costs 1/2000 of the step; every drafted token pays
    ("flat line", lambda n: 0.020 + 1e-5 * n, 4, 32),
    # a CPU at large batch: a token costs 10 ms on a 2 ms fixed cost; not even a 0.9 token pays
    ("steep line", lambda n: 0.002 + 0.010 * n, 4, 0),
])
def test_the_goodput_choice_on_known_curves(name, cost, rows, best):
    curve = _model(cost).curve
    assert curve is not None
    scores = np.array(CHAIN * rows)
    keep = goodput_keep(scores, rows, curve).view(bool)
    assert keep.sum() == best and keep.tolist() == oracle.goodput_keep(scores.tolist(), rows, curve)
    order = np.sort(scores)[::-1]  # the brute force over every count, on the true cost, agrees
    assert int(np.argmax([(rows + order[:n].sum()) / cost(rows + n) for n in range(len(scores) + 1)])) == best


def test_tile_steps_are_priced_at_their_average_slope():
    """A GPU's tile steps of 16 tokens: the convex fit prices them as a line of their average slope, so the batch does
    not end exactly at a step's end (the best there: 28 draft tokens, 32 verified), and its goodput on the true steps
    stays within 6% of the best (24 kept: 19.6 / 0.030 against 20.8 / 0.030)."""
    def cost(n):
        return 0.020 + 0.010 * ((n - 1) // 16)
    curve = _model(cost).curve
    assert curve is not None and np.all(np.diff(np.diff(curve.seconds) / np.diff(curve.tokens)) >= -1e-12)  # convex
    rows, scores = 4, np.array(CHAIN * 4)
    keep = goodput_keep(scores, rows, curve).view(bool)
    assert keep.tolist() == oracle.goodput_keep(scores.tolist(), rows, curve)
    order = np.sort(scores)[::-1]
    value = [(rows + order[:n].sum()) / cost(rows + n) for n in range(len(scores) + 1)]
    assert int(np.argmax(value)) == 28 and keep.sum() == 24 and value[24] >= 0.94 * value[28]


def test_noise_makes_no_free_tokens():
    """Steps of a line whose medians dip below their neighbours' (noise, or batches of other sizes): the fit stays
    convex and rising, so no stretch of it prices a token at nothing (a monotone table made one of every dip)."""
    rng = np.random.default_rng(4)
    model = StepCostModel(min_steps=4, refit_every=1)
    for n in rng.integers(20, 60, 400):
        dip = 0.012 if 30 <= n <= 36 else 0.0  # a band of steps that came out cheaper (by 6 tokens' cost)
        model.observe(int(n), 0.040 + 0.002 * n - dip + rng.normal(0, 2e-3), drafted=True)
    curve = model.curve
    assert curve is not None
    slopes = np.r_[np.diff(curve.seconds) / np.diff(curve.tokens), curve.tail]
    assert np.all(np.diff(slopes) >= -1e-12) and slopes.min() > 0.001  # convex, and every token costs 1 ms or more


@pytest.mark.parametrize(("jump", "best"), [
    (0.0, 32),     # a flat line, nothing paid once: every drafted token pays (as above)
    (0.004, 32),   # a step with drafts pays 20% more once: 4 rows' 32 tokens (+17.6 expected) still pay
    (0.100, 0),    # it pays 6x once (4 rows' +17.6 expected tokens do not make up for it): a step without drafts
])
def test_a_step_with_drafts_pays_its_jump_once(jump, best):
    """An engine's fixed work for a step with drafts (vLLM's rejection sampler): the choice drafts nothing when the
    batch's expected tokens do not pay for it, and is otherwise the choice without it."""
    def cost(n):
        return 0.020 + 1e-5 * n
    base = _model(cost).curve
    assert base is not None
    curve = CostCurve(base.tokens, base.seconds, base.tail, jump)
    rows, scores = 4, np.array(CHAIN * 4)
    keep = goodput_keep(scores, rows, curve).view(bool)
    assert keep.sum() == best and keep.tolist() == oracle.goodput_keep(scores.tolist(), rows, curve)
    order = np.sort(scores)[::-1]  # the brute force over every count, on the true cost, agrees
    value = [(rows + order[:n].sum()) / (cost(rows + n) + (jump if n else 0.0)) for n in range(len(scores) + 1)]
    assert int(np.argmax(value)) == best


def test_the_jump_is_told_from_steps_without_drafts():
    """Steps with drafts on a knee plus a jump, steps without at the batch's rows: the curve is the step without drafts
    and its draft_s the jump, within the steps' noise."""
    rng = np.random.default_rng(1)
    jump = 0.0035

    def cost(n):
        return 0.040 if n <= 12 else 0.040 + 0.004 * (n - 12)
    model = StepCostModel(min_steps=4, refit_every=1)
    for _ in range(300):
        n = int(rng.integers(9, 40))
        model.observe(n, cost(n) + jump + rng.normal(0, 3e-4), drafted=True)
    assert model.curve is not None and model.curve.draft_s == 0.0  # no step without drafts timed yet
    for _ in range(model.min_plain):
        model.observe(8, cost(8) + rng.normal(0, 3e-4), drafted=False)
    curve = model.curve
    assert curve is not None and curve.draft_s == pytest.approx(jump, abs=5e-4)
    for n in (9, 12, 20, 39):
        assert _at(curve, n) == pytest.approx(cost(n), abs=6e-4)
    line = StepCostModel(min_steps=4, refit_every=1)  # past the knee from the first token: read along the slope
    for n in range(9, 40):
        line.observe(n, 0.040 + 0.004 * n + jump, drafted=True)
    for _ in range(4):
        line.observe(8, 0.040 + 0.004 * 8, drafted=False)
    assert line.curve is not None and line.curve.draft_s == pytest.approx(jump, abs=1e-9)
    wild = StepCostModel(min_steps=4, refit_every=1)  # steps without drafts slower than with: no negative jump
    for n in range(9, 40):
        wild.observe(n, cost(n), drafted=True)
    for _ in range(4):
        wild.observe(8, 0.9, drafted=False)
    assert wild.curve is not None and wild.curve.draft_s == 0.0


def test_a_step_without_drafts_is_asked_for_now_and_then():
    """The probe: none before a curve; one in probe_every // 16 steps until min_plain steps without drafts were timed,
    then one in probe_every; any step without drafts (asked for or not) restarts the count, and a probe whose step
    could not be timed is not asked for again at once."""
    model = StepCostModel(min_steps=4, refit_every=1, min_plain=2, probe_every=64)
    asked = []
    for step in range(400):
        probe = model.curve is not None and model.probe()
        if probe:
            asked.append(step)
        model.observe(10 if probe else 10 + step % 7, 0.03 + 0.001 * (step % 7), drafted=not probe)
    gaps = np.diff(asked).tolist()
    assert gaps[0] == 64 // 16 + 1 and set(gaps[1:]) == {64 + 1}  # the probe's own step, then the gap
    assert model.curve is not None and model.curve.draft_s >= 0.0
    untimed = StepCostModel(min_steps=4, refit_every=1, min_plain=2, probe_every=64)
    asked = []
    for step in range(200):  # every probe's step has a prefill in it: not timed
        if untimed.curve is not None and untimed.probe():
            asked.append(step)
        else:
            untimed.observe(10 + step % 7, 0.03 + 0.001 * (step % 7), drafted=True)
    assert set(np.diff(asked).tolist()) == {64 // 16 + 1}  # one in a gap, never two in a row


def test_the_native_choice_is_the_oracles_on_random_batches():
    rng = np.random.default_rng(3)
    for _ in range(300):
        points = int(rng.integers(1, 6))
        tokens = np.cumsum(rng.uniform(0.5, 20, points))
        curve = CostCurve(tokens, np.cumsum(rng.uniform(0, 0.02, points)) + 0.01, float(rng.uniform(0, 0.01)),
                          float(rng.choice([0.0, rng.uniform(0, 0.02)])))
        scores = np.round(rng.uniform(0, 1, int(rng.integers(0, 40))), 2)  # ties included
        rows = int(rng.integers(1, 9))
        want = oracle.goodput_keep(scores.tolist(), rows, curve)
        assert goodput_keep(scores, rows, curve).view(bool).tolist() == want


def test_one_slow_step_does_not_move_the_curve():
    """The first step of an engine (lazy initialisation) can take 5x a normal one: the medians drop it."""
    model = _model(lambda n: 0.035 + 0.0024 * n, counts=range(1, 30), repeat=2)
    model.observe(3, 0.27, drafted=True)
    curve = model.curve
    assert curve is not None and _at(curve, 3) == pytest.approx(0.035 + 0.0024 * 3, rel=0.01)


def test_no_curve_without_spread_and_bad_arguments():
    model = StepCostModel(min_steps=4)
    assert model.curve is None  # nothing observed yet: not cut
    for _ in range(10):
        model.observe(4, 0.03, drafted=True)  # every step the same size: the slope cannot be told
    model.observe(0, 0.03, drafted=True)  # ignored
    model.observe(5, -1.0, drafted=False)  # ignored
    assert model.curve is None and fit_curve(np.array([4.0, 4.0]), np.array([0.1, 0.2])) is None
    assert model.observed == 10 and not model.probe()  # no curve: nothing to time a step without drafts for
    for bad in ({"window": 2}, {"min_steps": 1}, {"refit_every": 0}, {"min_plain": 0}, {"probe_every": 8}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            StepCostModel(**bad)
    ok = CostCurve(np.array([1.0, 2.0]), np.array([0.1, 0.2]), 0.0)
    for args, named in [((np.array([2.0, 1.0]), np.array([0.1, 0.2]), 0.0), "increase"),
                        ((np.array([1.0]), np.array([0.1, 0.2]), 0.0), "as many seconds"),
                        ((np.array([1.0]), np.array([-0.1]), 0.0), ">= 0"),
                        ((np.array([1.0]), np.array([0.1]), float("inf")), "tail"),
                        ((np.array([1.0]), np.array([0.1]), 0.0, -0.01), "draft_s"),
                        ((np.array([1.0]), np.array([0.1]), 0.0, float("nan")), "draft_s")]:
        with pytest.raises(ValueError, match=named):  # refused when it is made, before any step reads it
            CostCurve(*args)
    with pytest.raises(ValueError, match="rows"):
        goodput_keep(np.array([0.5]), 0, ok)
    with pytest.raises(TypeError, match="incompatible function arguments"):
        goodput_keep(np.array([0.5]), 1, (ok.tokens, ok.seconds))


def test_chains_keep_a_prefix_each():
    scores = np.array([0.9, 0.5, 0.5, 0.2, 0.8, 0.5, 0.1, 0.5, 0.5])  # three chains and an empty one, ties across them
    offsets = np.array([0, 4, 7, 7, 9])
    drafts = Drafts(np.arange(9, dtype=np.int64), np.array([-1, 0, 1, 2, -1, 0, 1, -1, 0], np.int32), scores,
                    offsets, ScoreKind.PROBABILITY)
    for fixed in np.linspace(0.0, 0.3, 13):  # from every token paying to none paying
        curve = CostCurve(np.array([1.0, 2.0]), np.array([0.1, 0.1 + fixed]), fixed)
        keep = goodput_keep(scores, 4, curve).view(bool)
        cut = drafts.goodput(curve, 4)
        assert len(cut) == 4 and cut.nodes == keep.sum()
        for whole, part in zip(drafts, cut):
            n = len(part)
            assert part.token_ids.tolist() == whole.token_ids[:n].tolist()  # a prefix of its chain
            assert part.scores.tolist() == whole.scores[:n].tolist()
            assert part.parents.tolist() == whole.parents[:n].tolist()
    assert drafts.token_lists() == [[0, 1, 2, 3], [4, 5, 6], [], [7, 8]]


def test_group_medians_are_numpys_medians():
    """The refit's vectorised medians equal ``np.median`` of each group, odd and even sizes, ties included."""
    from drafting.cost import _group_medians

    rng = np.random.default_rng(7)
    for _ in range(50):
        sizes = rng.integers(1, 9, rng.integers(1, 20))
        groups = [np.sort(rng.integers(0, 5, size).astype(np.float64)) for size in sizes]
        starts = np.r_[0, np.cumsum(sizes)[:-1]]
        got = _group_medians(np.concatenate(groups), starts, sizes)
        assert np.array_equal(got, [np.median(g) for g in groups])


def test_fits_thin_out_as_the_window_fills_and_still_follow_the_engine():
    """A fit is the hook's slowest step: one in as many new steps as half the steps held (at least refit_every), so
    at most one in window // 2 once the window is full; a change in the engine's cost is in the curve within a
    window."""
    model = StepCostModel(window=512, min_steps=16, refit_every=16)
    fits, last = [], None
    for step in range(3000):
        slope = 0.002 if step < 1500 else 0.004  # the engine slows down half-way
        model.observe(1 + step % 9, 0.02 + slope * (1 + step % 9), drafted=True)
        if model.curve is not last:
            fits.append(step)
            last = model.curve
    gaps = np.diff(fits)
    assert len(fits) <= 9 + 3000 // 256 and gaps[-3:].tolist() == [256] * 3 and gaps.min() >= 16
    assert last is not None and _at(last, 9) == pytest.approx(0.02 + 0.004 * 9, rel=0.01)
