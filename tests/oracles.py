"""Brute-force references the vectorized ingest code is checked against."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ingest.tokens import SEPARATOR


def documents(stream: np.ndarray) -> list[list[int]]:
    """Split a token stream into its documents."""
    docs, cur = [], []
    for t in np.asarray(stream).tolist():
        if t == int(SEPARATOR):
            docs.append(cur)
            cur = []
        else:
            cur.append(t)
    if cur:
        docs.append(cur)
    return docs


def count_ngrams(stream: np.ndarray, n: int) -> Counter:
    """Every n-gram of every document, counted one by one."""
    c: Counter = Counter()
    for doc in documents(stream):
        for i in range(len(doc) - n + 1):
            c[tuple(doc[i:i + n])] += 1
    return c


def top_t(counter: Counter, t: int, min_count: int = 1) -> list[tuple[tuple[int, ...], int]]:
    """The t most frequent, ties by tokens ascending."""
    items = sorted(((g, c) for g, c in counter.items() if c >= min_count), key=lambda gc: (-gc[1], gc[0]))
    return items[:t]


def continuation_tree(stream: np.ndarray, ngram: tuple[int, ...], depth: int, budget: int):
    """(root_count, [(path, count)] in level order) from a dict trie of all occurrences."""
    n = len(ngram)
    counts: Counter = Counter()
    root = 0
    for doc in documents(stream):
        for i in range(len(doc) - n + 1):
            if tuple(doc[i:i + n]) == ngram:
                root += 1
                cont = doc[i + n:i + n + depth]
                for d in range(1, len(cont) + 1):
                    counts[tuple(cont[:d])] += 1
    ranked = sorted(counts.items(), key=lambda pc: (-pc[1], len(pc[0]), pc[0]))[:budget]
    return root, sorted(ranked, key=lambda pc: (len(pc[0]), pc[0]))
