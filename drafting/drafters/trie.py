"""The per-prompt n-gram trie as a drafting method, ranked by its own frequencies (N-Gram-Trie,
https://openreview.net/forum?id=MVfpYw1pxX, §3.1-3.2, Algorithm 1): the paper's baseline."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..draft import Draft, ScoreKind
from ..method import TABLE_ONLY, CoreSettings, Follow, Step
from .ngram_trie import NGramTrie

__all__ = ["Trie"]


class Trie:
    """Drafts the most frequent continuations of the sequence's suffix in the prompt (and output so far),
    scored by count ratios: a :class:`drafting.DraftingService` method whose state per request is its trie.

    Args:
        window: the trie's sliding window ``n`` (default 13), 2..64.
        max_prefix: longest suffix matched, ``Lp`` (default 3), 1..window-1.
        prior: additive smoothing of count ratios when ranking nodes (default 1.0, >= 0).

    Raises:
        ValueError: when an argument is out of range.
    """

    name = "trie"
    score_kind = ScoreKind.COUNT_RATIO
    hidden_states = False
    cuts_to_curve = False

    def __init__(self, window: int = 13, max_prefix: int = 3, prior: float = 1.0) -> None:
        if prior < 0:
            raise ValueError(f"prior={prior}: must be >= 0")
        NGramTrie(window, max_prefix)  # validates them now
        self.window, self.max_prefix, self.prior = window, max_prefix, prior
        self._lock = threading.Lock()  # a trie is read by a step while the service's table may extend it

    def core_settings(self) -> CoreSettings:
        """Only the request table."""
        return TABLE_ONLY

    def start(self, prompt: np.ndarray) -> NGramTrie:
        """The request's trie of its prompt."""
        trie = NGramTrie(self.window, self.max_prefix)
        trie.extend(prompt.tolist())
        return trie

    def extend(self, state: NGramTrie, tokens: np.ndarray) -> None:
        """Add the committed tokens' windows."""
        with self._lock:
            state.extend(tokens.tolist())

    def add_hidden_states(self, state: Any, hidden: Any) -> None:
        """Never called: the trie reads no hidden states."""

    def draft(self, step: Step) -> list[Draft]:
        """Each row's most frequent continuations, cut to its budget (its best path for a chain)."""
        out = []
        for trie, budget in zip(step.states, step.budgets.tolist()):
            with self._lock:
                match = trie.match(max(budget, 1))
            if match is None or budget < 1:
                out.append(Draft.empty(self.score_kind))
                continue
            whole = Draft.from_tree(match.tree, self.prior)
            out.append(whole.cut(budget, step.chain))
        return out

    def draft_following(self, step: Step, follow: Follow) -> None:
        """Not in one call: the service follows, then drafts."""

    def stopped(self, state: Any, output: np.ndarray) -> None:
        """Nothing learned across requests."""

    def step_seconds(self) -> dict[str, float]:
        """No parts timed."""
        return {}

    def close(self) -> None:
        """Nothing opened."""

    def config(self) -> dict:
        """Window, longest matched suffix and prior."""
        return {"name": self.name, "window": self.window, "max_prefix": self.max_prefix, "prior": self.prior}
