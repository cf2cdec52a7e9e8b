"""The token tree: a context's continuations with their counts, as stored and as retrieved.

A token tree hangs below an implicit root (the context n-gram). Node ``i``
carries a token id, the index of its parent (``-1`` for a child of the root) and
a count: the number of corpus occurrences of the root's context that continue
through that node (CREST §3, "prefix counts"). Parents always precede their
children (``parents[i] < i``), so a single forward scan visits every node after
its parent. A retrieval (from the Postgres datastore, the REST suffix array or a
prompt's n-gram trie) returns a :class:`Match`: the matched context and its tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["TokenTree", "Match"]


class TreeError(ValueError):
    """Raised when arrays do not form a valid token tree."""


@dataclass(frozen=True)
class TokenTree:
    """A token tree in flat array form.

    Attributes:
        token_ids: ``[num_nodes]`` uint32, the token at each node.
        parents: ``[num_nodes]`` int32, the parent's index, ``-1`` for a child of
            the root; ``parents[i] < i`` for every node.
        counts: ``[num_nodes]`` uint32, the number of occurrences that pass
            through each node; a child never counts more than its parent.
        root_count: occurrences of the root context itself (the n-gram count
            for a datastore tree); ``>=`` the sum of the root's children.

    Raises:
        TreeError: when the arrays differ in length, a parent index is out of
            range or not earlier than its child, or a count exceeds its parent's.
    """

    token_ids: np.ndarray
    parents: np.ndarray
    counts: np.ndarray
    root_count: int = 0

    def __post_init__(self) -> None:
        tok = np.ascontiguousarray(self.token_ids, dtype=np.uint32)
        par = np.ascontiguousarray(self.parents, dtype=np.int32)
        cnt = np.ascontiguousarray(self.counts, dtype=np.uint32)
        object.__setattr__(self, "token_ids", tok)
        object.__setattr__(self, "parents", par)
        object.__setattr__(self, "counts", cnt)
        object.__setattr__(self, "root_count", int(self.root_count))
        if not (tok.ndim == par.ndim == cnt.ndim == 1):
            raise TreeError("token_ids, parents and counts must be 1-D arrays")
        if not (len(tok) == len(par) == len(cnt)):
            raise TreeError(
                f"array lengths differ: token_ids={len(tok)}, parents={len(par)}, counts={len(cnt)}"
            )
        n = len(tok)
        idx = np.arange(n, dtype=np.int64)
        if n and (np.any(par < -1) or np.any(par >= idx)):
            bad = int(np.flatnonzero((par < -1) | (par >= idx))[0])
            raise TreeError(f"node {bad} has parent {int(par[bad])}; parents must satisfy -1 <= parents[i] < i")
        if n:
            has_parent = par >= 0
            if np.any(cnt[has_parent] > cnt[par[has_parent]]):
                bad = int(np.flatnonzero(has_parent & (cnt > cnt[np.maximum(par, 0)]))[0])
                raise TreeError(f"node {bad} counts {int(cnt[bad])}, more than its parent's {int(cnt[par[bad]])}")
        if self.root_count < 0:
            raise TreeError(f"root_count must be >= 0, got {self.root_count}")

    def __len__(self) -> int:
        return len(self.token_ids)

    @classmethod
    def trusted(cls, token_ids: np.ndarray, parents: np.ndarray, counts: np.ndarray, root_count: int) -> TokenTree:
        """Wrap arrays already validated by the caller (the codec checks every invariant while
        parsing): uint32 / int32 / uint32 contiguous arrays of equal length."""
        tree = object.__new__(cls)
        object.__setattr__(tree, "token_ids", token_ids)
        object.__setattr__(tree, "parents", parents)
        object.__setattr__(tree, "counts", counts)
        object.__setattr__(tree, "root_count", int(root_count))
        return tree

    def paths(self) -> list[tuple[int, ...]]:
        """Every node's token path from the root, in node order (for tests and debugging)."""
        out: list[tuple[int, ...]] = []
        toks = self.token_ids.tolist()
        for i, p in enumerate(self.parents.tolist()):
            out.append((out[p] if p >= 0 else ()) + (toks[i],))
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TokenTree):
            return NotImplemented
        return (
            self.root_count == other.root_count
            and np.array_equal(self.token_ids, other.token_ids)
            and np.array_equal(self.parents, other.parents)
            and np.array_equal(self.counts, other.counts)
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Match:
    """A retrieval hit: the matched context and its continuation tree.

    Attributes:
        ngram: the context tokens that matched (the longest stored suffix of the
            sequence: a datastore n-gram, a REST suffix, or a trie context).
        tree: the continuations of that context, with their counts.
    """

    ngram: tuple[int, ...]
    tree: TokenTree
