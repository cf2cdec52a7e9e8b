"""Brute-force references the vectorized ingest code is checked against."""

from __future__ import annotations

from collections import Counter

import numpy as np

from ingest.tokens import SEPARATOR


def documents(stream: np.ndarray) -> list[list[int]]:
    """Split a token stream into its documents."""
    docs: list[list[int]] = []
    cur: list[int] = []
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


def rest_retrieve(stream: np.ndarray, vocab_size: int, context: list[int], min_len: int, max_len: int,
                  max_matches: int, depth: int, budget: int):
    """REST by brute force: ``(context_len, occurrences, used, [(path, count)] in level order)`` or ``None``.

    Scans every position for the longest suffix of ``context`` (``max_len`` down to ``min_len``),
    orders its occurrences by the whole remaining stream (separator = ``vocab_size``), as a suffix
    array does, takes the first ``max_matches`` and counts their continuations' prefixes.
    """
    seq = [vocab_size if t == SEPARATOR else int(t) for t in stream.tolist()]
    for k in range(min(max_len, len(context)), min_len - 1, -1):
        pattern = [int(t) for t in context[-k:]]
        hits = [i for i in range(len(seq) - k + 1) if seq[i:i + k] == pattern]
        if not hits:
            continue
        hits.sort(key=lambda i: seq[i:])
        used = hits[:max_matches]
        counts: Counter = Counter()
        for i in used:
            cont = []
            for t in seq[i + k:i + k + depth]:
                if t == vocab_size:
                    break
                cont.append(t)
            for d in range(1, len(cont) + 1):
                counts[tuple(cont[:d])] += 1
        ranked = sorted(counts.items(), key=lambda pc: (-pc[1], len(pc[0]), pc[0]))[:budget]
        return k, len(hits), len(used), sorted(ranked, key=lambda pc: (len(pc[0]), pc[0]))
    return None


def tree_paths(tree) -> list[tuple[tuple[int, ...], int]]:
    """A token tree as ``[(path, count)]`` in (depth, path) order."""
    paths: list[tuple[int, ...]] = []
    for tok, par in zip(tree.token_ids.tolist(), tree.parents.tolist()):
        paths.append((paths[par] if par >= 0 else ()) + (int(tok),))
    return sorted(zip(paths, tree.counts.tolist()), key=lambda pc: (len(pc[0]), pc[0]))
