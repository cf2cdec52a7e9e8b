"""Continuation token trees built from occurrences in a token stream (CREST §3.2), vectorized.

The CREST build (every kept n-gram) and the REST suffix array (:mod:`benchmarks.rest_index`) build their trees here. A
token stream is uint32 token ids with documents separated by :data:`SEPARATOR`; no continuation crosses it.

For a kept n-gram, every occurrence contributes the path of the (up to ``depth``) tokens that follow it; a node's count
is the number of occurrences whose continuation passes through it. The tree is pruned to its ``budget`` best nodes by
count descending, then depth ascending, then token path: a child never counts more than its parent and is deeper, so the
kept set is prefix-closed. Nodes are emitted in level order, so ``parents[i] < i``.

The trie is built one depth at a time over all occurrences at once: the nodes at depth ``d`` are the distinct pairs
(node at depth ``d-1``, next token): one ``np.unique`` on packed uint64 keys, in tie-break order. An occurrence is
dropped, and its subtree with it, once its node (count ``c``) cannot make the budget: the tree already holds ``budget``
nodes at smaller depths with counts of ``c`` or more.
"""

from __future__ import annotations

import numpy as np

from datastore.codec import TreeBatch

SEPARATOR = np.uint32(0xFFFFFFFF)
"""Document separator in a token stream; a tokenizer whose vocabulary reaches 2**32 - 1 ids is refused."""


class _TopCounts:
    """The ``budget`` largest node counts seen so far in each prunable tree.

    Kept as one sorted uint64 array of ``(tree << 32) | ~count`` keys, so that a
    new depth merges in with one near-linear sort (two sorted runs).
    """

    def __init__(self, num_trees: int, budget: int) -> None:
        self.budget = budget
        self.keys = np.zeros(0, dtype=np.uint64)
        self.threshold = np.zeros(num_trees, dtype=np.int64)  # budget-th largest, 0 if fewer

    def add(self, trees: np.ndarray, counts: np.ndarray) -> None:
        new = np.sort((trees.astype(np.uint64) << np.uint64(32)) | (np.uint64(_COUNT_MASK) - counts.astype(np.uint64)))
        keys = np.sort(np.concatenate([self.keys, new]), kind="stable")  # timsort: merges two runs
        tree_of = (keys >> np.uint64(32)).astype(np.int64)
        starts = np.flatnonzero(np.r_[True, tree_of[1:] != tree_of[:-1]])
        rank = np.arange(len(keys), dtype=np.int64) - np.repeat(starts, np.diff(np.r_[starts, len(keys)]))
        self.keys = keys[rank < self.budget]
        at_k = rank == self.budget - 1
        self.threshold[tree_of[at_k]] = _COUNT_MASK - (keys[at_k] & np.uint64(_COUNT_MASK)).astype(np.int64)


_COUNT_MASK = 0xFFFFFFFF


def build_trees(
    tokens: np.ndarray,
    positions: np.ndarray,
    tree_ids: np.ndarray,
    root_counts: np.ndarray,
    n: int,
    depth: int,
    budget: int,
) -> TreeBatch:
    """Build the pruned continuation trees of a set of n-grams.

    Args:
        tokens: ``[num_tokens]`` uint32 token stream, documents separated by
            :data:`SEPARATOR` (continuations stop there and at the end).
        positions: ``[num_occurrences]`` int64, start of each n-gram occurrence.
        tree_ids: ``[num_occurrences]`` int64 in ``0..num_trees-1``, which tree
            (kept n-gram) each occurrence belongs to.
        root_counts: ``[num_trees]`` uint64, each n-gram's count (its occurrences).
        n: the n-gram length (continuations start at ``position + n``).
        depth: continuation length, tokens (REST/CREST: 10).
        budget: the most nodes a tree keeps (CREST: 64).

    Returns:
        A :class:`TreeBatch` of ``num_trees`` trees, tree ``k`` for ``tree_ids == k``.

    Raises:
        ValueError: when ``depth`` or ``budget`` is not positive.
    """
    if depth < 1 or budget < 1:
        raise ValueError(f"depth and budget must be >= 1, got depth={depth}, budget={budget}")
    num_trees = len(root_counts)
    vocab = np.uint64(int(tokens.max(initial=0)) + 1)  # SEPARATOR never reaches the keys
    # Only a tree with more than `budget` possible nodes can ever need pruning.
    prunable = np.asarray(root_counts, dtype=np.int64) * depth > budget
    occ_pos = positions.astype(np.int64) + n
    occ_node = tree_ids.astype(np.int64)  # node index at the previous depth (tree id at depth 0)
    parent_tree = np.arange(num_trees, dtype=np.int64)  # tree of each node at the previous depth
    top = _TopCounts(num_trees, budget)  # top.threshold: budget-th best count at smaller depths
    levels: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []  # (tree, parent, token, count)
    for _ in range(depth):
        step = _next_level(tokens, occ_pos, occ_node, parent_tree, vocab, top.threshold)
        if step is None:
            break
        occ_pos, occ_node, level = step
        levels.append(level)
        parent_tree = node_tree = level[0]
        big = prunable[node_tree]
        top.add(node_tree[big], level[3][big])

    return _select(levels, root_counts, top.threshold, budget)


def _next_level(tokens: np.ndarray, occ_pos: np.ndarray, occ_node: np.ndarray, parent_tree: np.ndarray,
                vocab: np.uint64, threshold: np.ndarray):
    """One depth of :func:`build_trees`: the distinct (parent node, next token) pairs of the live occurrences, those
    whose count beats their tree's ``threshold`` kept. Returns None when no occurrence continues, else the surviving
    occurrences' next positions and node indices, and the level ``(tree, parent, token, count)`` of kept nodes."""
    inside = occ_pos < len(tokens)
    occ_pos, occ_node = occ_pos[inside], occ_node[inside]
    tok = np.asarray(tokens[occ_pos], dtype=np.uint32)
    live = tok != SEPARATOR
    occ_pos, occ_node, tok = occ_pos[live], occ_node[live], tok[live]
    if len(occ_pos) == 0:
        return None
    keys = occ_node.astype(np.uint64) * vocab + tok.astype(np.uint64)
    uniq, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    node_parent = (uniq // vocab).astype(np.int64)
    node_token = (uniq % vocab).astype(np.uint32)
    node_tree = parent_tree[node_parent]
    counts = counts.astype(np.int64)
    keep = counts > threshold[node_tree]
    new_index = np.cumsum(keep) - 1  # index of each surviving node, -1 for pruned ones
    new_index[~keep] = -1
    occ_new = new_index[inverse.ravel()]
    alive = occ_new >= 0
    level = (node_tree[keep], node_parent[keep], node_token[keep], counts[keep])
    return occ_pos[alive] + 1, occ_new[alive], level


def _select(levels, root_counts: np.ndarray, threshold: np.ndarray, budget: int) -> TreeBatch:
    """Keep each tree's ``budget`` best nodes and lay them out in level order.

    ``threshold[t]`` is the budget-th largest count in tree ``t`` (0 when it has
    fewer nodes): nodes above it are kept, nodes below dropped, and nodes equal
    to it kept in (depth, path) order, i.e. level order, until the budget is full.
    """
    num_trees = len(root_counts)
    above = np.zeros(num_trees, dtype=np.int64)
    for tree, _, _, count in levels:
        above += np.bincount(tree[count > threshold[tree]], minlength=num_trees)
    room = budget - above  # how many nodes tied at the threshold still fit
    offsets = np.zeros(num_trees + 1, dtype=np.int64)
    kept_masks = []
    for tree, _, _, count in levels:
        keep = count > threshold[tree]
        tie = np.flatnonzero(count == threshold[tree])
        if len(tie):
            tt = tree[tie]
            rank = np.arange(len(tie), dtype=np.int64) - np.searchsorted(tt, tt, side="left")
            fits = rank < room[tt]
            keep[tie[fits]] = True
            room -= np.bincount(tt[fits], minlength=num_trees)
        kept_masks.append(keep)
        offsets[1:] += np.bincount(tree[keep], minlength=num_trees)
    np.cumsum(offsets, out=offsets)

    filled = offsets[:-1].copy()  # next free slot of each tree
    total = int(offsets[-1])
    token_ids = np.zeros(total, dtype=np.uint32)
    parents = np.zeros(total, dtype=np.int32)
    counts = np.zeros(total, dtype=np.uint32)
    prev_local = None  # local index of each node of the previous depth (-1 if dropped)
    for (tree, parent, token, count), keep in zip(levels, kept_masks):
        idx = np.flatnonzero(keep)
        tt = tree[idx]
        rank = np.arange(len(idx), dtype=np.int64) - np.searchsorted(tt, tt, side="left")
        slot = filled[tt] + rank
        local = np.full(len(tree), -1, dtype=np.int64)
        local[idx] = slot - offsets[tt]
        token_ids[slot] = token[idx]
        counts[slot] = count[idx]
        if prev_local is None:
            parents[slot] = -1
        else:
            par = prev_local[parent[idx]]
            if np.any(par < 0):
                raise RuntimeError("internal error: pruned tree is not prefix-closed")
            parents[slot] = par
        filled += np.bincount(tt, minlength=num_trees)
        prev_local = local
    return TreeBatch(offsets, token_ids, parents, counts, np.asarray(root_counts, dtype=np.uint64))
