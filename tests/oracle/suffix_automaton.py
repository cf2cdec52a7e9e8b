"""The suffix automaton of token sequences, with occurrence counts: every context of any length, matched in
time linear in its length, and the counted continuation tree below it.

A suffix automaton (Blumer et al., "The smallest automaton recognizing the subwords of a text", 1985;
built online as in Crochemore & Hancart's construction) of a sequence has at most ``2n`` states and ``3n``
transitions, and recognises exactly the sequence's substrings. Each state stands for the substrings that
end at the same set of positions (its ``endpos``); its ``count`` is the size of that set, the number of
occurrences of each of its substrings. Several sequences share one automaton (the generalised automaton:
:meth:`SuffixAutomaton.start_sequence` begins the next one), as the index of a process's finished outputs does.

Drafting reads it like SuffixDecoding's suffix trees (Oliaro et al., https://arxiv.org/abs/2411.04975,
§3) and SGLang's n-gram matcher, with no limit on the context's length:

- :meth:`SuffixAutomaton.match`: the longest suffix of a context that occurs in the sequences, and its state;
- :meth:`SuffixAutomaton.continuations`: below a state, the most frequent continuations, best-first by
  count (a prefix-closed token tree; each node counts the occurrences of the context followed by its path).

This is the Python reference of the native core's automaton (``crest_native``); both build the same
states in the same order, so their drafts are identical (``tests/drafting/test_native.py``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

import numpy as np

from datastore.tree import TokenTree

__all__ = ["SuffixAutomaton", "STATE_BYTES", "TRANSITION_BYTES", "TOKEN_BYTES"]

STATE_BYTES = 16
"""Bytes a state costs in the native core (length, suffix link, count, first transition)."""
TRANSITION_BYTES = 24
"""Bytes a transition costs in the native core (an edge: source, token, target, next; and its share of the
hash table at half load)."""
TOKEN_BYTES = 4
"""Bytes a kept token costs (the sequences are kept to rebuild after an eviction)."""


class SuffixAutomaton:
    """An online suffix automaton of one or several token sequences, with occurrence counts.

    Appending a token costs amortised O(1) transitions, plus one count update per state on its suffix-link
    path (as many as the distinct lengths of its repeated suffixes: short for text, long in repeated spans).
    """

    def __init__(self) -> None:
        self._len: list[int] = [0]           # state -> length of its longest substring
        self._link: list[int] = [-1]         # state -> suffix link (the root's is -1)
        self._count: list[int] = [0]         # state -> occurrences (endpos size); the root's stays 0
        self._next: list[dict[int, int]] = [{}]  # state -> {token: state}
        self._last = 0                       # the state of the whole current sequence
        self.num_transitions = 0
        self.num_tokens = 0

    @property
    def num_states(self) -> int:
        """States, the root included."""
        return len(self._len)

    @property
    def nbytes(self) -> int:
        """The automaton's size in the native core's layout, bytes (what an index's byte bound counts)."""
        return STATE_BYTES * self.num_states + TRANSITION_BYTES * self.num_transitions + TOKEN_BYTES * self.num_tokens

    def start_sequence(self) -> None:
        """Begin a new sequence: later tokens extend it, not the previous one (no context spans the two)."""
        self._last = 0

    def _new_state(self, length: int, link: int, count: int, nxt: dict[int, int]) -> int:
        self._len.append(length)
        self._link.append(link)
        self._count.append(count)
        self._next.append(nxt)
        self.num_transitions += len(nxt)
        return len(self._len) - 1

    def _clone(self, p: int, q: int, t: int) -> int:
        """Split state ``q``: a clone takes its substrings up to ``len(p) + 1`` tokens; ``p``'s suffix path now
        leads to the clone by ``t``."""
        nxt, link = self._next, self._link
        clone = self._new_state(self._len[p] + 1, link[q], self._count[q], dict(nxt[q]))
        while p >= 0 and nxt[p].get(t) == q:
            nxt[p][t] = clone
            p = link[p]
        link[q] = clone
        return clone

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens to the current sequence.

        Args:
            tokens: token ids (ints >= 0), in order.
        """
        nxt, length, link, count = self._next, self._len, self._link, self._count
        for t in tokens:
            t = int(t)
            last = self._last
            q = nxt[last].get(t)
            if q is not None:  # the extended sequence already occurs (a later sequence of a shared automaton)
                cur = q if length[q] == length[last] + 1 else self._clone(last, q, t)
            else:
                cur = self._new_state(length[last] + 1, 0, 0, {})
                p = last
                while p >= 0 and t not in nxt[p]:
                    nxt[p][t] = cur
                    self.num_transitions += 1
                    p = link[p]
                if p >= 0:
                    q = nxt[p][t]
                    link[cur] = q if length[p] + 1 == length[q] else self._clone(p, q, t)
            self._last = cur
            v = cur
            while v > 0:  # one more occurrence of every suffix of the sequence
                count[v] += 1
                v = link[v]
            self.num_tokens += 1

    def repeated_suffix(self) -> tuple[int, int]:
        """``(state, length)`` of the longest suffix of the current sequence that also occurs earlier
        (``(0, 0)``: none does)."""
        state = self._link[self._last] if self._last > 0 else 0
        return max(state, 0), self._len[state] if state > 0 else 0

    def match(self, context: Sequence[int]) -> tuple[int, int]:
        """``(state, length)`` of the longest suffix of ``context`` that occurs in the sequences (``(0, 0)``:
        not even its last token does).

        Args:
            context: token ids; the match reads every one of them, once.
        """
        nxt, link, length = self._next, self._link, self._len
        state = matched = 0
        for t in context:
            t = int(t)
            while state > 0 and t not in nxt[state]:
                state = link[state]
                matched = length[state]
            found = nxt[state].get(t)
            if found is None:
                state = matched = 0
            else:
                state, matched = found, matched + 1
        return state, matched

    def count(self, state: int) -> int:
        """Occurrences of the state's substrings."""
        return self._count[state]

    def continuations(self, state: int, budget: int, max_depth: int, own: int = 0) -> TokenTree:
        """The most frequent continuations below ``state``, best-first.

        Args:
            state: where the context's match ended (:meth:`match`, :meth:`repeated_suffix`).
            budget: most nodes, >= 0.
            max_depth: deepest node, >= 1.
            own: occurrences of the context that are not evidence (1 when the context ends the sequence being
                predicted: that occurrence has no continuation yet).

        Returns:
            A prefix-closed :class:`~datastore.tree.TokenTree`: nodes in the order taken (count descending; ties:
            the earlier parent, then the smaller token); ``counts[i]``: occurrences of the context followed
            by node ``i``'s path; ``root_count``: the context's occurrences less ``own``, at least the children's sum.
        """
        nxt, count = self._next, self._count
        heap = [(-count[s], -1, t, s, 1) for t, s in nxt[state].items()]
        heapq.heapify(heap)
        toks: list[int] = []
        parents: list[int] = []
        counts: list[int] = []
        while heap and len(toks) < budget:
            neg, parent, t, s, depth = heapq.heappop(heap)
            idx = len(toks)
            toks.append(t)
            parents.append(parent)
            counts.append(-neg)
            if depth < max_depth:
                for u, s2 in nxt[s].items():
                    heapq.heappush(heap, (-count[s2], idx, u, s2, depth + 1))
        top = sum(c for c, p in zip(counts, parents) if p < 0)
        return TokenTree.trusted(np.array(toks, dtype=np.uint32), np.array(parents, dtype=np.int32),
                                 np.array(counts, dtype=np.uint32), max(count[state] - own, top))
