"""The per-prompt n-gram trie as a drafter, ranked by its own frequencies (N-Gram-Trie,
https://openreview.net/forum?id=MVfpYw1pxX, §3.1-3.2, Algorithm 1): the paper's baseline."""

from __future__ import annotations

import numpy as np

from ..draft import Draft, ScoreKind
from ..lifecycle import RequestDrafter
from .ngram_trie import NGramTrie


class TrieDrafter(RequestDrafter[NGramTrie]):
    """Drafts the most frequent continuations of the sequence's suffix in the prompt (and output so far),
    scored by count ratios.

    Args:
        window: the trie's sliding window ``n`` (default 13), 2..64.
        max_prefix: longest suffix matched, ``Lp`` (default 3), 1..window-1.
        prior: additive smoothing of count ratios when ranking nodes (default 1.0, >= 0).

    Raises:
        ValueError: when an argument is out of range.
    """

    name = "trie"
    score_kind = ScoreKind.COUNT_RATIO

    def __init__(self, window: int = 13, max_prefix: int = 3, prior: float = 1.0) -> None:
        super().__init__()
        if prior < 0:
            raise ValueError(f"prior={prior}: must be >= 0")
        NGramTrie(window, max_prefix)  # validates them now
        self.window, self.max_prefix, self.prior = window, max_prefix, prior

    def _start(self, prompt_ids: np.ndarray) -> NGramTrie:
        trie = NGramTrie(self.window, self.max_prefix)
        trie.extend(prompt_ids)
        return trie

    def _extend(self, state: NGramTrie, tokens: np.ndarray) -> None:
        state.extend(tokens.tolist())

    def _propose(self, states: list[NGramTrie], contexts: list[list[int]], budgets: list[int], chain: bool,
                 min_score: float | None) -> list[Draft]:
        out = []
        for trie, budget in zip(states, budgets):
            with self._lock:
                match = trie.match(max(budget, 1))
            if match is None or budget < 1:
                out.append(Draft.empty(self.score_kind))
                continue
            whole = Draft.from_tree(match.tree, self.prior)
            out.append(whole.best_path(budget) if chain else whole.top(budget))
        return out

    def config(self) -> dict:
        """Window, longest matched suffix and prior."""
        return {"name": self.name, "window": self.window, "max_prefix": self.max_prefix, "prior": self.prior}
