"""Python oracle of the goodput choice (``csrc/goodput.cpp``, :func:`crest_native.goodput_keep`): written for reading,
not speed. SmartSpec, https://arxiv.org/abs/2406.14066 §4."""

from __future__ import annotations

from collections.abc import Sequence


def curve_at(tokens: Sequence[float], seconds: Sequence[float], tail: float, n: float) -> float:
    """``T(n)``: interpolated between points, flat below the first, ``tail`` per token past the last."""
    if n > tokens[-1]:
        return seconds[-1] + tail * (n - tokens[-1])
    if n <= tokens[0]:
        return seconds[0]
    j = max(i for i in range(len(tokens)) if tokens[i] <= n)
    if j == len(tokens) - 1:
        return seconds[j]
    return (seconds[j + 1] - seconds[j]) / (tokens[j + 1] - tokens[j]) * (n - tokens[j]) + seconds[j]


def goodput_keep(scores: Sequence[float], rows: int, curve) -> list[bool]:
    """The ``n`` best scores (score desc, then position) maximising ``(rows + their sum) / T(rows + n)``, ``T`` plus
    the curve's ``draft_s`` once when ``n >= 1``, the fewest on a tie: ``[len(scores)]`` whether each is kept.
    ``curve``: a :class:`drafting.CostCurve`."""
    tokens, seconds = [float(t) for t in curve.tokens], [float(s) for s in curve.seconds]
    tail, jump = float(curve.tail), float(curve.draft_s)
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    best, best_value, gained = 0, rows / curve_at(tokens, seconds, tail, rows), float(rows)
    for n in range(1, len(scores) + 1):
        gained += scores[order[n - 1]]
        value = gained / (curve_at(tokens, seconds, tail, rows + n) + jump)
        if value > best_value:
            best, best_value = n, value
    kept = set(order[:best])
    return [i in kept for i in range(len(scores))]
