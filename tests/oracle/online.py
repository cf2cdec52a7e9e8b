"""Python oracle of the calibration fitted online on the engine's verdicts (``csrc/online.cpp``): written for reading,
not speed. The native fit's coefficients are compared with these within float64 rounding (the native sums run over the
nonzero features only and solve by Cholesky; numpy's ``solve`` pivots)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


class OnlineFit:
    """A logistic model of a node's acceptance, refitted by a Newton step every ``refit_every`` outcomes on decayed sums
    of its Fisher information and gradient, towards the posterior mode under a Gaussian prior of weight ``strength``
    centred on the prior's coefficients (``coef`` then the intercept)."""

    def __init__(self, coef: Sequence[float] | np.ndarray, intercept: float, strength: float, memory: float,
                 refit_every: int) -> None:
        self.prior = np.array([*coef, intercept], dtype=np.float64)
        self.now = self.prior.copy()
        self.strength, self.keep, self.refit_every = strength, math.exp(-1.0 / memory), refit_every
        self.h = np.zeros((len(self.now), len(self.now)))
        self.g = np.zeros(len(self.now))
        self.pending = 0

    def add(self, x: Sequence[float], offset: float, accepted: bool) -> None:
        """One outcome: a node's features, its logit offset (its token's bias) and whether the target took it."""
        v = np.array([*x, 1.0])
        p = 1.0 / (1.0 + math.exp(-(float(self.now @ v) + offset)))
        self.h = self.h * self.keep + p * (1.0 - p) * np.outer(v, v)
        self.g = self.g * self.keep + ((1.0 if accepted else 0.0) - p) * v
        self.pending += 1
        if self.pending >= self.refit_every:
            self.refit()

    def refit(self) -> None:
        self.pending = 0
        a = self.h + self.strength * np.eye(len(self.now))
        b = self.g - self.strength * (self.now - self.prior)
        if np.any(np.linalg.eigvalsh(a) <= 0):
            return
        step = np.linalg.solve(a, b)
        self.now = self.now + step
        self.g = self.g - self.h @ step

    @property
    def coef(self) -> np.ndarray:
        return self.now[:-1]

    @property
    def intercept(self) -> float:
        return float(self.now[-1])


def trial(tokens: Sequence[int], parents: Sequence[int], picked: Sequence[int]) -> list[tuple[int, int]]:
    """What a draft can be judged on: the union's nodes whose parent is the root or a drafted node (``picked``: union
    indices), as ``(union index, trial parent)`` with the trial parent the index in this list of the drafted parent
    (-1: the root), in union order (parents first)."""
    drafted = set(picked)
    slot: dict[int, int] = {}
    out: list[tuple[int, int]] = []
    for m, p in enumerate(parents):
        if p < 0 or (p in drafted and p in slot):
            slot[m] = len(out)
            out.append((m, -1 if p < 0 else slot[p]))
    return out


def outcomes(tokens: Sequence[int], parents: Sequence[int], picked: Sequence[int],
             committed: Sequence[int]) -> list[tuple[int, bool]]:
    """The trial's outcomes against the committed tokens: at each depth along the path they take, every trial child of
    the node reached, and whether the committed token is it; from the root, until a depth with no trial child or no
    hit. ``(union index, accepted)`` in the order they are judged."""
    nodes = trial(tokens, parents, picked)
    out: list[tuple[int, bool]] = []
    at = -1
    for token in committed:
        children = [(k, m) for k, (m, parent) in enumerate(nodes) if parent == at]
        if not children:
            break
        hit = -1
        for k, m in children:
            yes = tokens[m] == token
            out.append((m, yes))
            if yes:
                hit = k
        if hit < 0:
            break
        at = hit
    return out
