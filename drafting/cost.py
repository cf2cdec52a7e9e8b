"""How many draft tokens a step should verify: the engine's measured step-cost curve and the batch's goodput.

A verification step over ``N`` tokens (each row's sampled and draft tokens) takes ``T(N)`` seconds.
:class:`StepCostModel` fits ``T`` on the engine's recent steps with drafts as the convex non-decreasing piecewise-linear
curve (a roofline) closest to the median step time by verified tokens (:func:`fit_curve`), and the fixed extra cost of
verifying drafts (``draft_s``) on the steps without, which :meth:`StepCostModel.probe` asks for now and then.

With ``B`` rows, the step keeps the batch's ``n`` best-scored draft tokens (``S(n)``: the sum of their chain scores, the
expected tokens they add) for the ``n`` that maximises SmartSpec's goodput (Liu et al.,
https://arxiv.org/abs/2406.14066, §4), ``T`` plus ``draft_s`` for ``n >= 1``:

    (B + S(n)) / T(B + n)        (expected tokens per second)

The native core makes the choice (:func:`crest_native.goodput_keep`; oracle ``tests/oracle/goodput.py``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from drafting.draft import CostCurve

__all__ = ["EngineTimer", "StepCostModel", "convex_fit", "fit_curve", "with_draft_cost"]

BINS = 64
"""Most points of a fitted curve: steps are pooled into this many groups of nearby token counts."""


def fit_curve(tokens: np.ndarray, seconds: np.ndarray) -> CostCurve | None:
    """The step-cost curve of steps ``(tokens[i], seconds[i])``: the median seconds of each group of nearby token
    counts (at most :data:`BINS` groups, so one slow step moves nothing), then the convex non-decreasing
    piecewise-linear curve closest to those medians (weighted by their steps; :func:`convex_fit`), its tail the slope
    of its last segment; ``None`` when every step verified the same count (the slope cannot be told).

    Convex: a roofline, flat while the weights stream and then steeper, never cheaper per token at a larger batch.
    Any noise that makes a group's median fall below its neighbours' does not become a flat stretch there (a monotone
    table makes one, and prices the tokens along it at nothing: at 32 rows on a 2-core CPU the cut then drafted
    tokens the engine paid 2 ms each for).

    Args:
        tokens: ``[steps]`` token counts (> 0). seconds: ``[steps]`` step seconds (> 0).

    Raises:
        ValueError: when ``tokens`` and ``seconds`` differ in length.
    """
    if len(tokens) != len(seconds):
        raise ValueError(f"tokens ({len(tokens)}) and seconds ({len(seconds)}) must hold one entry per step")
    order = np.argsort(tokens, kind="stable")
    n, t = np.asarray(tokens, np.float64)[order], np.asarray(seconds, np.float64)[order]
    distinct = np.unique(n)
    if len(distinct) < 2:
        return None
    if len(distinct) <= BINS:
        groups = np.searchsorted(distinct, n)
    else:  # equal-count groups over the steps, each distinct count in one group
        edges = np.unique(np.quantile(n, np.linspace(0, 1, BINS + 1)[1:-1], method="higher"))
        groups = np.searchsorted(edges, n, side="right")
    starts = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])
    sizes = np.diff(np.r_[starts, len(n)])
    x = _group_medians(n, starts, sizes)  # n is sorted, so within each group too
    y = _group_medians(t[np.lexsort((t, groups))], starts, sizes)  # seconds sorted within each group
    knots, values, tail = convex_fit(x, y, sizes.astype(np.float64))
    return CostCurve(knots, values, tail)


def _group_medians(values: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The median of each group of ``values`` (``[steps]``, sorted within each group; group ``g`` is ``sizes[g]``
    entries from ``starts[g]``): the mean of its two middle entries, one when its size is odd. Vectorised: a step's
    refit costs one pass, not a median call per group."""
    return 0.5 * (values[starts + (sizes - 1) // 2] + values[starts + sizes // 2])


def convex_fit(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """The convex non-decreasing piecewise-linear ``f`` minimising ``sum(w * (y - f(x))**2)``, its knots at points of
    ``x``: ``f(x) = a + sum_j c_j * max(0, x - x_j)`` with ``a, c_j >= 0`` (each ``c_j`` the slope's rise at ``x_j``),
    by non-negative least squares (:func:`scipy.optimize.nnls`).

    Args:
        x: ``[m]`` float64, increasing, ``m >= 2``. y: ``[m]`` float64. w: ``[m]`` float64 weights, > 0.

    Returns:
        ``(knots, values, tail)``: ``f`` at its first point, at each point where its slope rises and at its last point
        (float64, increasing knots; interpolated between, as :class:`drafting.draft.CostCurve` is read), and its slope
        past the last point.
    """
    from scipy.optimize import nnls

    hinges = np.maximum(x[:, None] - x[None, :-1], 0.0)  # [m, m - 1]: column j is max(0, x - x_j)
    basis = np.column_stack([np.ones_like(x), hinges])
    root = np.sqrt(w)
    scale = max(float(np.abs(y).max()), 1e-300)  # seconds are small: solve in units of the largest
    c, _ = nnls(basis * root[:, None], y * root / scale)
    c *= scale
    fitted = basis @ c
    keep = np.r_[True, c[2:] > 0, True]  # the first point, each point where the slope rises, the last
    return x[keep], fitted[keep], float(c[1:].sum())


def with_draft_cost(curve: CostCurve, tokens: np.ndarray, seconds: np.ndarray) -> CostCurve:
    """``curve``, fitted on steps with drafts, split into a step without drafts and the jump a step with drafts pays
    once (:attr:`drafting.draft.CostCurve.draft_s`), from steps without drafts ``(tokens[i], seconds[i])``: the median
    of ``curve(tokens[i]) - seconds[i]``, at least 0 and at most half the curve's first point (a noisy median never
    makes a step cost nothing). Steps without drafts verify fewer tokens than any with (one a row), so the curve is
    read below its first point along its first segment's slope (its tail when it has one point): read flat there, the
    jump would also hold one token's cost, several ms a step on a CPU past its knee.

    Args:
        curve: from :func:`fit_curve` on steps that verified draft tokens (its ``draft_s`` is ignored).
        tokens / seconds: ``[steps]`` float64, steps that verified no draft token (at least one).
    """
    x, y = curve.tokens, curve.seconds
    first = (y[1] - y[0]) / (x[1] - x[0]) if len(x) > 1 else curve.tail
    predicted = (np.interp(tokens, x, y) + curve.tail * np.maximum(tokens - x[-1], 0)
                 - first * np.maximum(x[0] - tokens, 0))
    jump = float(np.clip(np.median(predicted - seconds), 0.0, 0.5 * y[0]))
    return CostCurve(curve.tokens, curve.seconds - jump, curve.tail, jump)


class StepCostModel:
    """The engine's step-cost curve (:class:`drafting.draft.CostCurve`) over its last ``window`` steps with drafts and
    its last ``window // 8`` steps without (their difference is the curve's ``draft_s``: :func:`with_draft_cost`),
    refitted once as many new steps were timed as half the steps held, and at least ``refit_every``: so fits thin out
    geometrically while the window fills, then come once in ``window // 2`` steps. A fit is a few dozen vector
    operations, about 0.3 ms and 0.9 ms on caches a forward pass has just flushed (2-core EPYC): taken once in 32
    steps, it was the hook's slowest 3% of steps, its p99.

    Args:
        window: steps with drafts kept (>= 8).
        min_steps: steps with drafts needed before :attr:`curve` answers (>= 2).
        refit_every: the fewest new steps between two fits (>= 1).
        min_plain: steps without drafts needed before the curve has a ``draft_s`` (>= 1; before: 0).
        probe_every: steps between two steps without drafts that :meth:`probe` asks for (>= 16).

    Raises:
        ValueError: when ``window < 8``, ``min_steps < 2``, ``refit_every < 1``, ``min_plain < 1`` or
            ``probe_every < 16``.
    """

    def __init__(self, window: int = 512, min_steps: int = 16, refit_every: int = 16, min_plain: int = 4,
                 probe_every: int = 512) -> None:
        if window < 8 or min_steps < 2 or refit_every < 1 or min_plain < 1 or probe_every < 16:
            raise ValueError(f"window={window} must be >= 8, min_steps={min_steps} >= 2, refit_every={refit_every} "
                             f">= 1, min_plain={min_plain} >= 1 and probe_every={probe_every} >= 16")
        self.min_steps, self.refit_every = min_steps, refit_every
        self.min_plain, self.probe_every = min_plain, probe_every
        self._steps: deque[tuple[int, float]] = deque(maxlen=window)
        self._plain: deque[tuple[int, float]] = deque(maxlen=max(window // 8, min_plain))
        self._curve: CostCurve | None = None
        self._since_fit = 0
        self._jumped = False  # whether the last fit had its jump (min_plain steps without drafts)
        self._since_plain = 0  # steps since the last step without drafts, timed or asked for

    @property
    def observed(self) -> int:
        """Steps held, with drafts and without."""
        return len(self._steps) + len(self._plain)

    def observe(self, tokens: int, seconds: float, *, drafted: bool) -> None:
        """Record one engine step that verified ``tokens`` tokens in ``seconds``, ``drafted``: whether any of them was
        a draft token (steps with other than positive figures are ignored)."""
        if tokens > 0 and seconds > 0:
            if drafted:
                self._steps.append((tokens, seconds))
                self._since_plain += 1
            else:
                self._plain.append((tokens, seconds))
                self._since_plain = 0
            self._since_fit += 1

    def probe(self) -> bool:
        """Whether the coming step should draft nothing, so that a step without drafts is timed: once a curve is
        fitted, when the last such step (timed, or asked for by this call) is ``probe_every // 16`` steps ago while
        fewer than ``min_plain`` are held, or ``probe_every`` steps ago after that. A step asked for that the engine's
        step does not let be timed (a prefill in it) is asked for again only after the next gap: never in a burst."""
        gap = self.probe_every if len(self._plain) >= self.min_plain else self.probe_every // 16
        if self._curve is None or self._since_plain < gap:
            return False
        self._since_plain = 0
        return True

    @property
    def curve(self) -> CostCurve | None:
        """The fitted curve (:func:`fit_curve` over the steps with drafts; with their jump, :func:`with_draft_cost`,
        once ``min_plain`` steps without drafts were timed), or ``None`` before ``min_steps`` steps with drafts or while
        every one verified the same count."""
        held, jump = len(self._steps), len(self._plain) >= self.min_plain
        # due: enough new steps, or the jump is measured and the last fit had none
        due = self._since_fit >= max(self.refit_every, held // 2) or (jump and not self._jumped)
        if held >= self.min_steps and (self._curve is None or due):
            self._since_fit = 0
            n, t = np.asarray(self._steps, dtype=np.float64).T
            curve = fit_curve(n, t)
            if curve is not None and jump:
                pn, pt = np.asarray(self._plain, dtype=np.float64).T
                curve = with_draft_cost(curve, pn, pt)
            self._curve, self._jumped = curve, jump
        return self._curve


class EngineTimer:
    """Times an engine's steps for a :class:`StepCostModel`: a step is the time between the end of one proposer call
    and the start of the next (the engine's forward pass, sampler and scheduler), and it verified what the earlier call
    drafted plus one token a row.

    Args:
        cost: the model the steps are recorded in.
        clock: the seconds the steps are timed by (default ``time.perf_counter``; a simulated engine's clock).
    """

    def __init__(self, cost: StepCostModel, clock: Callable[[], float] = time.perf_counter) -> None:
        self.cost, self.now = cost, clock
        self._last_end: float | None = None  # when the previous call returned ...
        self._tokens = 0                     # ... how many tokens the engine then verified ...
        self._rows = 0                       # ... in how many rows

    def step(self, start: float, timed: bool, tokens: int, rows: int) -> tuple[int, float, bool] | None:
        """A proposer call that began at ``start`` returns; the engine's next step verifies ``tokens`` tokens in
        ``rows`` rows. When ``timed`` (a decode-only step), the engine step before the call is recorded; returns what
        was recorded, ``(tokens, seconds, drafted)``, or ``None``."""
        seen = None
        if timed and self._last_end is not None:
            seen = (self._tokens, start - self._last_end, self._tokens > self._rows)
            self.cost.observe(seen[0], seen[1], drafted=seen[2])
        self._tokens, self._rows = tokens, rows
        self._last_end = self.now()
        return seen
