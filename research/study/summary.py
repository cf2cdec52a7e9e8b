"""The study's verdicts: CREST against REST at REST's best and at equal bytes; merged against both.

At equal bytes, CREST's figure for a REST size B is the best accept length of any
measured CREST datastore (single n or combined) of at most B bytes: a step
function, never interpolated upwards. A REST or merged curve is read between its
measured points by interpolating linearly in log(bytes), never extrapolated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .runner import StudyRow


@dataclass(frozen=True)
class Verdict:
    """One target: what it asks, the measured figure, whether it was met."""

    target: str
    figure: str
    met: bool


def interpolate(points: Sequence[tuple[int, float]], x: int) -> float | None:
    """Accept length at ``x`` bytes on the curve ``points`` ((bytes, accept) pairs), or ``None`` outside it."""
    pts = sorted(p for p in points if p[0] > 0)
    if not pts or x < pts[0][0] or x > pts[-1][0]:
        return None
    for (b0, a0), (b1, a1) in zip(pts, pts[1:]):
        if b0 <= x <= b1:
            if b1 == b0:
                return max(a0, a1)
            w = (math.log(x) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return a0 + w * (a1 - a0)
    return pts[-1][1]


def best_within(points: Sequence[tuple[int, float]], x: int) -> float | None:
    """The best accept length among ``points`` ((bytes, accept) pairs) of at most ``x`` bytes, or ``None``."""
    return max((a for b, a in points if b <= x), default=None)


def assess(rows: Sequence[StudyRow]) -> list[Verdict]:
    """The issue's targets for one corpus's rows."""
    rest = sorted((r.bytes, r.accept_length) for r in rows if r.method == "rest")
    crest = sorted((r.bytes, r.accept_length) for r in rows if r.method in ("crest-single", "crest-combined"))
    m = max((r.n for r in rows if r.method == "merged"), default=0)  # merged extends combined n <= m
    combined = sorted((r.bytes, r.accept_length) for r in rows if r.method == "crest-combined" and r.n == m)
    merged = sorted((r.bytes, r.accept_length) for r in rows if r.method == "merged")
    out: list[Verdict] = []
    if rest and crest:
        best_bytes, best = max(rest, key=lambda p: (p[1], -p[0]))
        reach = min((b for b, a in crest if a >= best), default=None)
        if reach is None:
            out.append(Verdict("CREST reaches REST's best accept length with <= 1/10 of its bytes",
                               f"REST best {best:.3f} at {best_bytes:,} B; CREST's best is "
                               f"{max(a for _, a in crest):.3f}", False))
        else:
            ratio = best_bytes / reach
            out.append(Verdict("CREST reaches REST's best accept length with <= 1/10 of its bytes",
                               f"REST best {best:.3f} at {best_bytes:,} B; CREST reaches it at {reach:,} B "
                               f"({ratio:.1f}x less)", ratio >= 10))
        ratios = []
        for b, a in rest:
            c = best_within(crest, b)
            if c is not None and a > 0:
                ratios.append((b, c / a))
        if ratios:
            worst = min(r for _, r in ratios)
            out.append(Verdict("at equal bytes CREST >= 1.15x REST's accept length",
                               f"best CREST of <= the bytes of each of {len(ratios)} REST sizes: ratio min "
                               f"{worst:.2f}, max {max(r for _, r in ratios):.2f}", worst >= 1.15))
        else:
            out.append(Verdict("at equal bytes CREST >= 1.15x REST's accept length",
                               "every REST size is smaller than the smallest CREST datastore", False))
    if merged:
        above_crest = all(m >= c for (_, m), (_, c) in zip(merged, combined))
        vs_rest = [(m, r) for b, m in merged if (r := interpolate(rest, b)) is not None]
        above_rest = all(m >= r for m, r in vs_rest)
        margin = min((m - c for (_, m), (_, c) in zip(merged, combined)), default=float("nan"))
        out.append(Verdict("merged curve above CREST combined and REST",
                           f"merged - combined n<={m} >= {margin:+.3f} at every size; above REST at "
                           f"{sum(m >= r for m, r in vs_rest)}/{len(vs_rest)} shared sizes",
                           above_crest and above_rest))
    return out
