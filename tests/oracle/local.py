"""The Python oracle of the native core's stage 1 on a request (``csrc/core.cpp`` ``gather``): a request's suffix
automaton of its own tokens answers its longest repeated suffix and that suffix's counted continuations."""

from __future__ import annotations

from collections.abc import Iterable

from datastore.tree import Match

from .suffix_automaton import SuffixAutomaton


class RequestAutomaton:
    """A request's suffix automaton: the longest repeated suffix of its tokens and that suffix's continuations.

    Args:
        max_depth: deepest continuation node, >= 1.
    """

    def __init__(self, max_depth: int) -> None:
        self.automaton = SuffixAutomaton()
        self.max_depth = max_depth
        self._tail: list[int] = []  # the tokens, to name the matched context

    def extend(self, tokens: Iterable[int]) -> None:
        """Append committed tokens."""
        toks = [int(t) for t in tokens]
        self.automaton.extend(toks)
        self._tail += toks

    def match(self, budget: int) -> Match | None:
        """The longest suffix that occurred earlier (any length) and its most frequent continuations (the
        occurrence that ends the sequence is not counted), or ``None`` when none occurred or none continued.

        Raises:
            ValueError: when ``budget < 1``.
        """
        if budget < 1:
            raise ValueError(f"budget={budget}: must be >= 1")
        state, length = self.automaton.repeated_suffix()
        if length == 0:
            return None
        tree = self.automaton.continuations(state, budget, self.max_depth, own=1)
        return Match(tuple(self._tail[len(self._tail) - length:]), tree) if len(tree) else None
