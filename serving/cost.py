"""When a draft token pays for itself: an online model of the engine's step time.

A verification step over ``N`` tokens (every row's sampled token plus its draft tokens) takes about
``T(N) = a + b * N`` seconds: ``a`` is the fixed cost of a step (weights streamed once, scheduling,
sampling), ``b`` the cost of one more token. Without drafts a batch of ``B`` rows emits ``B`` tokens
per step, ``B / T(B)`` tokens per second. One more draft token, accepted with probability ``p``
(its chain score: a path probability), adds ``p`` expected tokens for ``b`` more seconds, so it raises
throughput only when

    p > b * B / (a + b * B)        (the break-even score)

On a GPU ``b`` is tiny next to ``a`` and almost every draft pays; on a 2-core CPU at batch 32, ``b * B``
dominates and only near-certain tokens do (the goodput argument of SmartSpec, "Optimizing Speculative
Decoding for Serving Large Language Models Using Goodput", https://arxiv.org/abs/2406.14066).

:class:`StepCostModel` fits ``a`` and ``b`` over the engine's recent steps, timed between two ``propose``
calls, so it follows the engine and the hardware it runs on. The fit is robust: least squares, then again
without the steps whose residual is more than three (normal-consistent) median absolute deviations from the
median residual, so one slow step (the first step's lazy initialisation takes 5x a normal one, a garbage
collection, a preemption) does not move it.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class StepCostModel:
    """A robust fit of ``step seconds = a + b * tokens`` over the last ``window`` steps (least squares without
    the outlying steps, see the module docstring), refitted every ``refit_every`` steps: a few vector operations over
    the window, so the proposer's step pays for a fit once in ``refit_every`` steps.

    Args:
        window: steps kept (>= 8).
        min_steps: steps needed before :meth:`break_even` answers anything but 0.
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
        self._fit: tuple[float, float] | None = None
        self._since_fit = 0

    @property
    def observed(self) -> int:
        """Steps held (at most ``window``)."""
        return len(self._steps)

    def observe(self, tokens: int, seconds: float) -> None:
        """Record one engine step that verified ``tokens`` tokens in ``seconds``."""
        if tokens > 0 and seconds > 0:
            self._steps.append((tokens, seconds))
            self._since_fit += 1

    @property
    def coefficients(self) -> tuple[float, float] | None:
        """``(a, b)`` in seconds and seconds per token, or ``None`` before ``min_steps`` steps or while
        every step had the same number of tokens (``b`` cannot be told from ``a`` then)."""
        if len(self._steps) >= self.min_steps and (self._fit is None or self._since_fit >= self.refit_every):
            self._since_fit = 0
            n, t = np.asarray(self._steps, dtype=np.float64).T
            fit = _line(n, t)
            if fit is not None:
                b, a = fit
                residual = t - (a + b * n)
                deviation = np.abs(residual - np.median(residual))
                spread = 1.4826 * np.median(deviation)
                if spread > 0:
                    keep = deviation <= 3 * spread
                    fit = _line(n[keep], t[keep]) or fit
                    n, t = n[keep], t[keep]
                b, a = fit
                b = max(b, 0.0)
                self._fit = (max(float(np.mean(t - b * n)), 0.0), b) if a < 0 else (a, b)
        return self._fit

    def break_even(self, rows: int) -> float:
        """The score a draft token needs to raise throughput with ``rows`` rows decoding, in [0, 1)
        (0 until the model is fitted)."""
        fit = self.coefficients
        if fit is None or rows < 1:
            return 0.0
        a, b = fit
        return b * rows / (a + b * rows) if a + b * rows > 0 else 0.0


def _line(n: np.ndarray, t: np.ndarray) -> tuple[float, float] | None:
    """The least-squares line ``t = a + b * n`` as ``(b, a)``; ``None`` when every ``n`` is the same."""
    dn = n - n.mean()
    spread = float(dn @ dn)
    if spread <= 0:
        return None
    b = float(dn @ (t - t.mean())) / spread
    return b, float(t.mean() - b * n.mean())
