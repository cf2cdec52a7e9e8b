"""The process-wide index of finished outputs: every output this process has generated is draftable from the
next request on, bounded in bytes, the oldest evicted first.

SuffixDecoding keeps one suffix tree of all earlier responses beside each prompt's
(https://arxiv.org/abs/2411.04975, §3 "global suffix tree"), so what a model has said once it can draft the
next time at once, in process. Here the outputs share one generalised suffix automaton
(:class:`oracle.suffix_automaton.SuffixAutomaton`): a context of any length is matched against all of them in
time linear in the context, and its continuations come with their counts across outputs.

An automaton cannot forget one sequence, so the index evicts in halves: when its size passes ``max_bytes``
it keeps the newest outputs that fit in half the bound and rebuilds from them (each output is rebuilt at
most about once more, so the cost per token stays constant). The shared live layer in Postgres
(:mod:`live`: every process's outputs, compacted) sits on top of this one.

The Python oracle of the native core's index (``csrc/output_index.cpp``): both evict at the same moments and build
the same states, so their drafts are identical.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

from datastore.tree import Match

from .suffix_automaton import SuffixAutomaton

__all__ = ["OutputIndex", "CONTEXT_TOKENS"]

CONTEXT_TOKENS = 64
"""Trailing tokens of a request matched against the outputs (the longest match is at most this long)."""


class OutputIndex:
    """Finished outputs of this process, matched by their longest common context with a request.

    Thread-safe: one index serves every request of a drafting service.

    Args:
        max_bytes: the bound on the automaton's size (:attr:`nbytes`, the native core's layout); 0 keeps nothing.
        max_depth: deepest continuation node, >= 1.

    Raises:
        ValueError: when an argument is out of range.
    """

    def __init__(self, max_bytes: int = 64 << 20, max_depth: int = 16) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes={max_bytes}: must be >= 0")
        if not 1 <= max_depth <= 64:
            raise ValueError(f"max_depth={max_depth}: must be in 1..64")
        self.max_bytes, self.max_depth = max_bytes, max_depth
        self._outputs: deque[list[int]] = deque()
        self._automaton = SuffixAutomaton()
        self._lock = threading.Lock()
        self.evictions = 0  # rebuilds after the bound was passed
        self.evicted = 0    # outputs dropped

    @property
    def nbytes(self) -> int:
        """The automaton's size, bytes (<= ``max_bytes`` after every :meth:`add`)."""
        return self._automaton.nbytes

    @property
    def num_outputs(self) -> int:
        """Outputs held."""
        return len(self._outputs)

    def add(self, tokens: Sequence[int]) -> None:
        """Index one finished output (its generated tokens, not its prompt); evicts the oldest outputs when the
        index passes ``max_bytes``.

        Args:
            tokens: token ids (ints >= 0).
        """
        toks = [int(t) for t in tokens]
        if not toks or self.max_bytes == 0:
            return
        with self._lock:
            self._outputs.append(toks)
            self._automaton.start_sequence()
            self._automaton.extend(toks)
            if self._automaton.nbytes > self.max_bytes:
                self._evict()

    def _evict(self) -> None:
        """Keep the newest outputs whose share of the size fits in half the bound; rebuild from them."""
        size, tokens = self._automaton.nbytes, self._automaton.num_tokens
        target = self.max_bytes // 2
        kept: list[list[int]] = []
        held = 0
        for out in reversed(self._outputs):  # newest first; sizes pro rata to tokens, in exact integers
            if (held + len(out)) * size > target * tokens:
                break
            kept.append(out)
            held += len(out)
        self.evicted += len(self._outputs) - len(kept)
        self.evictions += 1
        self._outputs = deque(reversed(kept))
        self._automaton = SuffixAutomaton()
        for out in self._outputs:
            self._automaton.start_sequence()
            self._automaton.extend(out)

    def match(self, context: Sequence[int], budget: int) -> Match | None:
        """The longest suffix (of the last :data:`CONTEXT_TOKENS` tokens) of ``context`` found in the outputs,
        and its most frequent continuations, or ``None`` when nothing matches or nothing continues.

        Args:
            context: the request's token ids. budget: most nodes, >= 1.

        Raises:
            ValueError: when ``budget < 1``.
        """
        if budget < 1:
            raise ValueError(f"budget={budget}: must be >= 1")
        tail = [int(t) for t in context[-CONTEXT_TOKENS:]]
        with self._lock:
            state, length = self._automaton.match(tail)
            if length == 0:
                return None
            tree = self._automaton.continuations(state, budget, self.max_depth)
        return Match(tuple(tail[len(tail) - length:]), tree) if len(tree) else None
