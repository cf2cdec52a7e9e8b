"""REST as a drafter: the suffix-array retrieval over a corpus token stream (the study's baseline)."""

from __future__ import annotations

import time
from collections import deque
from typing import Sequence

from ..draft import EMPTY_DRAFT, merge_drafts
from ..suffix_index import REST_DEFAULTS, SuffixIndex
from .base import Proposal

__all__ = ["RestDrafter"]


class RestDrafter:
    """Drafts REST's retrieved continuation tree (He et al., REST, §3; see :mod:`decoder.suffix_index`).

    Args:
        index: the corpus suffix index.
        min_len / max_len: shortest and longest matched suffix, tokens (REST: 2 and 16).
        max_matches: occurrences used per retrieval (REST: 5000).
        depth: continuation tokens (REST: 10). tree_budget: nodes of the retrieved tree (REST: 64).
        prior: additive smoothing of count ratios when ranking nodes for a smaller ``budget``, >= 0.

    Raises:
        ValueError: when a length, count or budget is below 1, or ``max_len < min_len``.
    """

    name = "rest"

    def __init__(self, index: SuffixIndex, min_len: int = REST_DEFAULTS["min_len"],
                 max_len: int = REST_DEFAULTS["max_len"], max_matches: int = REST_DEFAULTS["max_matches"],
                 depth: int = REST_DEFAULTS["depth"], tree_budget: int = REST_DEFAULTS["budget"],
                 prior: float = 1.0) -> None:
        if min(min_len, max_matches, depth, tree_budget) < 1 or max_len < min_len:
            raise ValueError(f"REST parameters out of range: min_len={min_len}, max_len={max_len}, "
                             f"max_matches={max_matches}, depth={depth}, tree_budget={tree_budget}")
        self.index = index
        self.params = {"min_len": min_len, "max_len": max_len, "max_matches": max_matches, "depth": depth,
                       "budget": tree_budget}
        self.prior = prior
        self._tail: deque[int] = deque(maxlen=max_len)

    def begin(self, prompt_ids: Sequence[int]) -> None:
        """Remember the prompt's last ``max_len`` tokens."""
        self._tail.clear()
        self._tail.extend(int(t) for t in prompt_ids[-self.params["max_len"]:])

    def extend(self, tokens: Sequence[int]) -> None:
        """Append committed tokens."""
        self._tail.extend(int(t) for t in tokens)

    def propose(self, budget: int) -> Proposal:
        """The retrieved tree, pruned to ``budget`` nodes by estimated acceptance."""
        start = time.perf_counter()
        match = self.index.retrieve(list(self._tail), **self.params)
        mid = time.perf_counter()
        if match is None or budget < 1:
            return Proposal(EMPTY_DRAFT, lookup_s=mid - start)
        draft = merge_drafts([(match.tree, 1.0)], budget, self.prior)
        return Proposal(draft, lookup_s=mid - start, merge_s=time.perf_counter() - mid)

    def end(self) -> None:
        """Nothing per request."""
