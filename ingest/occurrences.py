"""Find every occurrence of the kept n-grams in the token stream.

Each window of ``n`` tokens is hashed (64-bit multiply-xorshift), looked up in
the sorted hashes of the kept n-grams, and then compared token by token with
the candidate, so a hash collision can never attribute an occurrence to the
wrong n-gram. The result, one int32 tree id per stream position (-1 where no
kept n-gram starts), is written to a memory-mapped file so that partitions can
be read back without holding the corpus in RAM.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .counting import KeptNgrams, ngram_windows

_MUL = np.uint64(0x9E3779B97F4A7C15)
_MAX_SEEDS = 16


def ngram_hash(windows: np.ndarray, seed: int = 0) -> np.ndarray:
    """``[m]`` uint64 hash of each column of ``windows`` (``[n, m]`` uint32)."""
    h = np.full(windows.shape[1], np.uint64(seed) * _MUL + np.uint64(0x632BE59BD9B4E019), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for row in windows:
            h ^= row.astype(np.uint64)
            h *= _MUL
            h ^= h >> np.uint64(29)
    return h


def kept_index(kept: KeptNgrams) -> tuple[int, np.ndarray, np.ndarray]:
    """A seed under which all kept n-grams hash apart, their sorted hashes, and the sort order."""
    for seed in range(_MAX_SEEDS):
        h = ngram_hash(kept.ngrams.T, seed)
        order = np.argsort(h, kind="stable")
        sh = h[order]
        if len(sh) < 2 or not np.any(sh[1:] == sh[:-1]):
            return seed, sh, order
    raise RuntimeError(f"{_MAX_SEEDS} hash seeds all collided on the kept {kept.n}-grams")  # ~1e-100 odds


def tag_occurrences(stream: np.ndarray, kept: KeptNgrams, path: Path) -> np.ndarray:
    """Tag each stream position with the kept n-gram starting there.

    Args:
        stream: ``[num_tokens]`` uint32 token stream.
        kept: the kept n-grams of one n.
        path: file for the tags (created or truncated).

    Returns:
        ``[num_tokens]`` int32 memory map: the index into ``kept`` of the n-gram
        starting at each position, -1 where none does.
    """
    tags = np.lib.format.open_memmap(path, mode="w+", dtype=np.int32, shape=(max(len(stream), 1),))
    tag_into(stream, kept, tags)
    tags.flush()
    return tags


def tag_into(stream: np.ndarray, kept: KeptNgrams, tags: np.ndarray,
             index: tuple[int, np.ndarray, np.ndarray] | None = None) -> None:
    """Fill ``tags`` (``[>= len(stream)]`` int32, any writable array) as :func:`tag_occurrences` does.

    ``index``: a :func:`kept_index` of ``kept`` computed earlier (it is rebuilt when ``None``).
    """
    tags[:] = -1
    if len(kept) == 0:
        return
    seed, sorted_hashes, order = kept_index(kept) if index is None else index
    for start, valid, win in ngram_windows(stream, kept.n):
        h = ngram_hash(win, seed)
        idx = np.minimum(np.searchsorted(sorted_hashes, h), len(sorted_hashes) - 1)
        hit = valid & (sorted_hashes[idx] == h)
        where = np.flatnonzero(hit)
        cand = order[idx[where]]
        exact = np.all(win[:, where] == kept.ngrams[cand].T, axis=0)
        tags[start + where[exact]] = cand[exact].astype(np.int32)


def partition_plan(kept: KeptNgrams, max_occurrences: int) -> int:
    """How many parts keep each under about ``max_occurrences`` occurrences (>= 1)."""
    total = int(kept.counts.sum(dtype=np.uint64)) if len(kept) else 0
    return max(1, -(-total // max(max_occurrences, 1)))


def partition(tags: np.ndarray, num_kept: int, parts: int, p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Part ``p`` of ``parts``: kept n-grams are dealt round-robin (they are sorted by count, so
    the parts balance).

    Returns:
        ``(tree_index, positions, local_ids)``: ``tree_index`` ``[k]`` int64 indices into the
        kept n-grams, ``positions`` ``[m]`` int64 occurrence starts, ``local_ids`` ``[m]`` int64
        indices into ``tree_index``.
    """
    tree_index = np.arange(p, num_kept, parts, dtype=np.int64)
    positions = []
    for s in range(0, len(tags), 1 << 25):
        block = np.asarray(tags[s:s + (1 << 25)])
        hit = np.flatnonzero((block >= 0) & (block % parts == p))
        positions.append(hit.astype(np.int64) + s)
    pos = np.concatenate(positions) if positions else np.zeros(0, np.int64)
    return tree_index, pos, np.asarray(tags[pos], dtype=np.int64) // parts


def partitions(tags: np.ndarray, kept: KeptNgrams,
               max_occurrences: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Every part of :func:`partition_plan`, in order (see :func:`partition`)."""
    if len(kept) == 0:
        return
    parts = partition_plan(kept, max_occurrences)
    for p in range(parts):
        yield partition(tags, len(kept), parts, p)
