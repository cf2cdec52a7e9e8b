"""The per-prompt n-gram trie (N-Gram-Trie, "N-Gram Trie Speculative Decoding for Faster LLM In-Context
Inference", https://openreview.net/forum?id=MVfpYw1pxX, §3.1-3.2 and Algorithm 1).

The sequence is read through a sliding window of ``window`` tokens (default
13). Every window start inserts the window into one trie, so each sub-prefix of
a window (length 1..``max_prefix``) is a node whose subtree holds the window's
suffixes that followed it, with frequencies: the count of a node is the number
of positions where its path occurs as the start of a window. Appending tokens
(the prompt, then each step's accepted tokens) extends the windows still open,
so insertion costs ``window`` dictionary steps per token.

Drafting matches the longest suffix of the sequence, ``max_prefix`` tokens down
to 1, that has a continuation, and keeps the most frequent paths below it under
a node budget (best-first by count: the result is prefix-closed).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

import numpy as np

from datastore.tree import Match, TokenTree

__all__ = ["NGramTrie"]


class NGramTrie:
    """A trie of every ``window``-token window of one sequence, extended as the sequence grows.

    Args:
        window: sliding window length ``n`` (paper default 13), 2..64.
        max_prefix: longest context matched, ``Lp`` (paper default 3), 1..window-1.

    Raises:
        ValueError: when ``window`` or ``max_prefix`` is out of range.
    """

    def __init__(self, window: int = 13, max_prefix: int = 3) -> None:
        if not 2 <= window <= 64:
            raise ValueError(f"window={window}: must be in 2..64")
        if not 1 <= max_prefix < window:
            raise ValueError(f"max_prefix={max_prefix}: must be in 1..window-1 ({window - 1})")
        self.window = window
        self.max_prefix = max_prefix
        self._token: list[int] = [-1]          # node -> token (root: -1)
        self._count: list[int] = [0]           # node -> window occurrences through it
        self._kids: list[dict[int, int]] = [{}]  # node -> {token: child node}
        self._open: list[int] = []             # deepest node of each window still shorter than `window`
        self._tail: list[int] = []             # the last max_prefix tokens of the sequence
        self.num_tokens = 0                    # tokens appended so far

    def __len__(self) -> int:
        """Number of trie nodes, the root excluded."""
        return len(self._token) - 1

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens to the sequence: each opens a window and extends the open ones.

        Args:
            tokens: token ids (ints), in sequence order.
        """
        kids, count, token = self._kids, self._count, self._token
        window, lp = self.window, self.max_prefix
        opened = self._open  # oldest window first, so opened[j] sits at depth len(opened) - j
        tail = self._tail
        for t in tokens:
            t = int(t)
            opened.append(0)  # the window starting at this token
            for j, node in enumerate(opened):
                child = kids[node].get(t)
                if child is None:
                    child = len(token)
                    kids[node][t] = child
                    token.append(t)
                    count.append(0)
                    kids.append({})
                count[child] += 1
                opened[j] = child
            if len(opened) == window:  # the oldest window is complete
                del opened[0]
            tail.append(t)
            if len(tail) > lp:
                del tail[0]
            self.num_tokens += 1

    def context_node(self, context: Sequence[int]) -> int | None:
        """The node whose path is ``context``, or ``None`` when it never occurred."""
        node = 0
        for t in context:
            child = self._kids[node].get(int(t))
            if child is None:
                return None
            node = child
        return node

    def match(self, budget: int) -> Match | None:
        """Draft from the longest suffix of the sequence (``max_prefix`` .. 1 tokens) that has a continuation.

        Args:
            budget: most nodes to keep, >= 1.

        Returns:
            The matched context (1..``max_prefix`` tokens) and its best continuation paths as a
            :class:`~datastore.tree.Match` (``counts``: window occurrences through each node;
            ``root_count``: earlier occurrences of the context, not counting the one that ends
            the sequence), or ``None`` when no suffix has a continuation.

        Raises:
            ValueError: when ``budget < 1``.
        """
        if budget < 1:
            raise ValueError(f"budget={budget}: must be >= 1")
        tail = self._tail
        for n in range(len(tail), 0, -1):
            node = self.context_node(tail[-n:])
            if node is not None and self._kids[node]:
                return Match(tuple(tail[-n:]), self._best_paths(node, budget))
        return None

    def _best_paths(self, root: int, budget: int) -> TokenTree:
        """The ``budget`` most frequent nodes below ``root`` (best-first: count desc, then insertion order).

        Only a node's ``budget`` best children can ever be taken (each further child has ``budget``
        siblings ranking before it), so no more are pushed: the heap stays small for contexts with
        hundreds of continuations.
        """
        kids, count, token = self._kids, self._count, self._token

        def best_children(node: int, idx: int) -> list[tuple[int, int, int]]:
            below = [(-count[c], c, idx) for c in kids[node].values()]
            return below if len(below) <= budget else heapq.nsmallest(budget, below)

        heap = best_children(root, -1)
        heapq.heapify(heap)
        toks: list[int] = []
        parents: list[int] = []
        counts: list[int] = []
        while heap and len(toks) < budget:
            neg, node, parent = heapq.heappop(heap)
            idx = len(toks)
            toks.append(token[node])
            parents.append(parent)
            counts.append(-neg)
            for entry in best_children(node, idx):
                heapq.heappush(heap, entry)
        # the context's own occurrence at the end of the sequence is what is being predicted, not evidence:
        # it passes through the context node but has no continuation yet
        return TokenTree.trusted(
            np.array(toks, dtype=np.uint32), np.array(parents, dtype=np.int32),
            np.array(counts, dtype=np.uint32),
            max(count[root] - 1, sum(counts[i] for i, p in enumerate(parents) if p < 0)),
        )
