"""Python oracle of the engine's verdicts fed back into the goodput cut (``csrc/feedback.cpp``): written for reading,
not speed, with the same arithmetic in the same order (the native core's ratios are compared bit for bit)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

REQUEST_DECAY, CORE_DECAY, REQUEST_PRIOR, CORE_PRIOR = 0.9, 0.99, 4.0, 16.0


@dataclass
class Verdicts:
    """Decayed sums of a request's (or every request's) trials."""

    accepted: float = 0.0
    expected: float = 0.0


def judge(tokens: Sequence[int], parents: Sequence[int], scores: Sequence[float], committed: Sequence[int],
          request: Verdicts, core: Verdicts) -> None:
    """Walk the draft along the committed tokens: at each depth reached, the children's conditional score is expected
    and a committed token among them accepted; stop at the first miss, or where the draft or the tokens end."""
    accepted = expected = 0.0
    at, reached = -1, 1.0
    for token in committed:
        children = [i for i in range(len(tokens)) if parents[i] == at]
        mass = 0.0
        for i in children:
            mass += scores[i]
        if mass <= 0.0:
            break
        expected += min(1.0, mass / reached) if reached > 0.0 else 0.0
        hits = [i for i in children if tokens[i] == token]
        if not hits:
            break
        accepted += 1.0
        at = hits[-1]
        reached = scores[at]
    if expected <= 0.0:
        return
    request.accepted = request.accepted * REQUEST_DECAY + accepted
    request.expected = request.expected * REQUEST_DECAY + expected
    core.accepted = core.accepted * CORE_DECAY + accepted
    core.expected = core.expected * CORE_DECAY + expected


def acceptance_ratio(request: Verdicts, core: Verdicts) -> float:
    """The request's accepted over expected, shrunk towards the core-wide ratio (itself shrunk towards 1)."""
    fleet = (core.accepted + CORE_PRIOR) / (core.expected + CORE_PRIOR)
    return (request.accepted + REQUEST_PRIOR * fleet) / (request.expected + REQUEST_PRIOR)


def discount_chain(scores: Sequence[float], ratio: float) -> list[float]:
    """Each conditional score along the chain times ``ratio``, capped at 1, multiplied back into path scores."""
    out, parent, kept = [], 1.0, 1.0
    for s in scores:
        step = s / parent if parent > 0.0 else 0.0
        kept *= min(1.0, ratio * step)
        out.append(kept)
        parent = s
    return out
