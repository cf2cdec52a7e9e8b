"""The Python oracle of the native drafting core (``csrc/core.cpp``, ``crest_native.Core``): the same request table
and the same step, written with the other oracles; driven call for call like the native core, it drafts the same
bits (``tests/drafting/test_native.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from datastore.tree import Match
from drafting.calibration import Calibration
from drafting.draft import Draft

from . import feedback, goodput
from .calibration import draft_from_candidates
from .local import RequestAutomaton
from .output_index import OutputIndex
from .treeops import live_layer

MATCH_NODES = 64
CONTEXT_TOKENS = 64


@dataclass
class _Request:
    local: RequestAutomaton
    tokens: list[int]
    prompt_len: int
    last: Draft | None = None  # its last draft, until its next tokens judge it
    verdicts: feedback.Verdicts = field(default_factory=feedback.Verdicts)


class PythonCore:
    """The oracle core: ``start`` / ``extend`` / ``stop`` keyed by the caller's id, ``draft`` a batch.

    Args:
        calibration: the node scorer. outputs_bytes: the output index's bound (0: none). local_depth /
        outputs_depth: the automata's deepest continuation node. sources: the sources drafted from.
    """

    def __init__(self, calibration: Calibration, outputs_bytes: int, local_depth: int = 16, outputs_depth: int = 16,
                 sources: Sequence[str] = ("ds", "live", "local", "outputs")) -> None:
        self.calibration, self.local_depth, self.sources = calibration, local_depth, set(sources)
        self.outputs = OutputIndex(outputs_bytes, outputs_depth)
        self.requests: dict = {}
        self.verdicts = feedback.Verdicts()

    def start(self, key, prompt: list[int]) -> None:
        local = RequestAutomaton(self.local_depth)
        local.extend(prompt)
        self.requests[key] = _Request(local, list(prompt), len(prompt))

    def extend(self, key, tokens: list[int]) -> None:
        r = self.requests[key]
        if r.last is not None and tokens:
            d = r.last
            feedback.judge(d.token_ids.tolist(), d.parents.tolist(), d.scores.tolist(), tokens, r.verdicts,
                           self.verdicts)
        r.last = None
        r.local.extend(tokens)
        r.tokens += tokens

    def acceptance(self, key) -> float:
        """The request's acceptance ratio (``feedback.acceptance_ratio``)."""
        return feedback.acceptance_ratio(self.requests[key].verdicts, self.verdicts)

    def cut_to_curve(self, keys: Sequence, chains: Sequence[Draft], curve) -> list[int]:
        """How many of each chain's tokens the goodput cut keeps, each request's scores discounted by its ratio."""
        discounted = [feedback.discount_chain(d.scores.tolist(), self.acceptance(k)) for k, d in zip(keys, chains)]
        keep = goodput.goodput_keep([s for row in discounted for s in row], len(keys), curve)
        out, at = [], 0
        for row in discounted:
            out.append(sum(keep[at:at + len(row)]))
            at += len(row)
        return out

    def stop(self, key) -> list[int]:
        r = self.requests.pop(key)
        output = r.tokens[r.prompt_len:]
        self.outputs.add(output)
        return output

    def draft(self, keys: Sequence, budgets: Sequence[int], stored: Sequence[Sequence[Match]],
              live: Sequence[Match | None], chain: bool, min_score: float,
              delta: Sequence[Match | None] | None = None) -> list[tuple[Draft, int]]:
        out = []
        deltas = delta or [None] * len(keys)
        for key, budget, cands, live_match, delta_match in zip(keys, budgets, stored, live, deltas):
            r = self.requests[key]
            nodes = max(budget, MATCH_NODES)
            others = {"live": live_layer(live_match, delta_match) if "live" in self.sources else None,
                      "local": r.local.match(nodes) if "local" in self.sources else None,
                      "outputs": self.outputs.match(r.tokens[-CONTEXT_TOKENS:], nodes)
                      if "outputs" in self.sources else None}
            cands = list(cands) if "ds" in self.sources else []
            out.append(draft_from_candidates(self.calibration, cands, others, budget, chain=chain,
                                             min_score=min_score))
            r.last = out[-1][0]
        return out
