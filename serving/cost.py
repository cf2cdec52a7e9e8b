"""How many draft tokens a step should verify: the engine's measured step-cost curve and the batch's goodput.

A verification step over ``N`` tokens (every row's sampled token plus its draft tokens) takes ``T(N)`` seconds. ``T``
is not a line. On a CPU (and on a GPU at high batch) it is flat while the weights' streaming from memory dominates,
then steep once the arithmetic for the extra tokens exceeds it (a roofline's knee: at one stream on a 2-core EPYC,
24.5 ms for 1 token, 25.6-27 ms for 2-3.3, then 29.5-43 ms for 3.8-4.3); and a GPU's kernels add steps at tile
sizes. So :class:`StepCostModel` keeps the curve as measured: a monotone table of the median step time by verified
tokens, fitted over the engine's recent steps (timed between two ``propose`` calls, so it follows the engine and the
hardware), and extended past its last point by the slope of its last quarter.

A draft token whose chain score is ``p`` (its path probability: the chance every token up to it is accepted) adds
``p`` expected tokens. With ``B`` rows, keeping the ``n`` best-scored draft tokens of the batch emits
``B + S(n)`` expected tokens (``S``: the sum of their scores) in ``T(B + n)`` seconds, so :meth:`StepCostModel.keep`
chooses the ``n`` that maximises

    (B + S(n)) / T(B + n)        (expected tokens per second: the batch's goodput)

over every ``n``, each marginal token priced by the curve where the batch will be: SmartSpec's goodput ("Optimizing
Speculative Decoding for Serving Large Language Models Using Goodput", Liu et al., https://arxiv.org/abs/2406.14066,
§4). A chain's scores never rise along it, so the batch's best ``n`` tokens are a prefix of every row's chain.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

__all__ = ["StepCostModel", "StepCurve"]

BINS = 64
"""Most points of a fitted curve: steps are pooled into this many groups of nearby token counts."""


@dataclass(frozen=True)
class StepCurve:
    """``T(N)``: seconds of an engine step verifying ``N`` tokens, non-decreasing in ``N``.

    Attributes:
        tokens: ``[points]`` float64, increasing token counts. seconds: ``[points]`` float64, non-decreasing.
        tail: seconds per token past the last point (>= 0).
    """

    tokens: np.ndarray
    seconds: np.ndarray
    tail: float

    def __call__(self, n: np.ndarray) -> np.ndarray:
        """``T`` at ``n`` (``[m]`` token counts): interpolated between points, flat below the first, the tail past
        the last; ``[m]`` float64 seconds."""
        n = np.asarray(n, dtype=np.float64)
        out = np.interp(n, self.tokens, self.seconds)
        past = n > self.tokens[-1]
        if past.any():
            out[past] = self.seconds[-1] + self.tail * (n[past] - self.tokens[-1])
        return out

    @classmethod
    def fit(cls, tokens: np.ndarray, seconds: np.ndarray) -> StepCurve | None:
        """The curve of steps ``(tokens[i], seconds[i])``: the median seconds of each group of nearby token counts (at
        most :data:`BINS` groups, so one slow step moves nothing), made non-decreasing (weighted pool-adjacent-
        violators), its tail the least-squares slope of its last quarter of points; ``None`` when every step verified
        the same count (the slope cannot be told).

        Args:
            tokens: ``[steps]`` token counts (> 0). seconds: ``[steps]`` step seconds (> 0).
        """
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
        ends = np.r_[starts[1:], len(n)]
        x = np.array([np.median(n[s:e]) for s, e in zip(starts, ends)])
        y = _nondecreasing(np.array([np.median(t[s:e]) for s, e in zip(starts, ends)]), (ends - starts).astype(float))
        last = max(2, len(x) // 4)  # the tail: the least-squares slope of the last quarter of the points
        dx = x[-last:] - x[-last:].mean()
        return cls(x, y, float(max(dx @ (y[-last:] - y[-last:].mean()) / (dx @ dx), 0.0)))


def _nondecreasing(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The weighted least-squares non-decreasing fit of ``y`` (pool adjacent violators)."""
    values, weights, sizes = [], [], []
    for v, wt in zip(y.tolist(), w.tolist()):
        values.append(v)
        weights.append(wt)
        sizes.append(1)
        while len(values) > 1 and values[-2] > values[-1]:
            wt2, v2, s2 = weights.pop(), values.pop(), sizes.pop()
            values[-1] = (values[-1] * weights[-1] + v2 * wt2) / (weights[-1] + wt2)
            weights[-1] += wt2
            sizes[-1] += s2
    return np.repeat(values, sizes)


class StepCostModel:
    """The engine's step-cost curve (:class:`StepCurve`) over its last ``window`` steps, refitted every
    ``refit_every`` steps (a few vector operations over the window, so a step pays for a fit once in
    ``refit_every``), and the batch's goodput choice of draft tokens (see the module docstring).

    Args:
        window: steps kept (>= 8).
        min_steps: steps needed before :meth:`keep` cuts anything (>= 2).
        refit_every: steps between two fits (>= 1).

    Raises:
        ValueError: when ``window < 8``, ``min_steps < 2`` or ``refit_every < 1``.
    """

    def __init__(self, window: int = 512, min_steps: int = 16, refit_every: int = 32) -> None:
        if window < 8 or min_steps < 2 or refit_every < 1:
            raise ValueError(f"window={window} must be >= 8, min_steps={min_steps} >= 2 and "
                             f"refit_every={refit_every} >= 1")
        self.min_steps, self.refit_every = min_steps, refit_every
        self._steps: deque[tuple[int, float]] = deque(maxlen=window)
        self._curve: StepCurve | None = None
        self._since_fit = 0

    @property
    def observed(self) -> int:
        """Steps held (at most ``window``)."""
        return len(self._steps)

    def observe(self, tokens: int, seconds: float) -> None:
        """Record one engine step that verified ``tokens`` tokens in ``seconds`` (others than positive are ignored)."""
        if tokens > 0 and seconds > 0:
            self._steps.append((tokens, seconds))
            self._since_fit += 1

    @property
    def curve(self) -> StepCurve | None:
        """The fitted curve, or ``None`` before ``min_steps`` steps or while every step verified the same count."""
        if len(self._steps) >= self.min_steps and (self._curve is None or self._since_fit >= self.refit_every):
            self._since_fit = 0
            n, t = np.asarray(self._steps, dtype=np.float64).T
            self._curve = StepCurve.fit(n, t)
        return self._curve

    def keep(self, scores: np.ndarray, rows: int) -> int:
        """How many of the batch's draft tokens to verify: the ``n`` maximising ``(rows + S(n)) / T(rows + n)``,
        ``S(n)`` the sum of the ``n`` best scores (the fewest on a tie); all of them before the curve is fitted.

        Args:
            scores: ``[tokens]`` float64, every drafted token's chain score (a path probability). rows: rows decoding
                (each verifies its sampled token too), >= 1.

        Returns:
            ``n`` in ``0..len(scores)``: verify the ``n`` best-scored tokens (:func:`best_mask`).
        """
        curve = self.curve
        if curve is None or not len(scores):
            return len(scores)
        gained = np.empty(len(scores) + 1)
        gained[0] = rows
        np.cumsum(np.sort(scores)[::-1], out=gained[1:])
        gained[1:] += rows
        return int(np.argmax(gained / curve(rows + np.arange(len(scores) + 1))))


def best_mask(scores: np.ndarray, n: int) -> np.ndarray:
    """``[len(scores)]`` bool: the ``n`` highest scores (ties to the earlier; so along a chain, whose scores never
    rise, the kept tokens are a prefix)."""
    keep = np.zeros(len(scores), dtype=bool)
    keep[np.argsort(-scores, kind="stable")[:n]] = True
    return keep
