"""The Python oracle of the native core's merge and cuts (``csrc/merge.cpp``, ``csrc/cut.cpp``): operations on flat
token trees.

A flat tree hangs below an implicit root (the sequence's last committed token). Node ``i`` has a token
``tokens[i]`` and a parent ``parents[i]`` (``-1``: a child of the root; always ``parents[i] < i``, so one
forward scan meets every parent before its children). Siblings carry different tokens.

- :func:`depths` and :func:`children`: what a tree's shape implies (the children maps index queries:
  ``0`` is the root, ``1 + i`` is node ``i``, as verification's logits are laid out);
- :func:`union`: several trees below one root merged into one, shared prefixes once;
- :func:`top_nodes`: the best ``budget`` nodes by score, which is prefix-closed when scores never rise
  along a path (a draft tree under a node budget);
- :func:`best_path`: the root path with the largest sum of scores (a chain's expected accepted length,
  when scores are acceptance probabilities).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from datastore.tree import Match, TokenTree

__all__ = ["depths", "children", "Union", "union", "top_nodes", "best_path"]


def depths(parents: np.ndarray) -> np.ndarray:
    """``[N]`` int64 depth of each node (``1`` for a child of the root), from ``[N]`` int ``parents``."""
    out = np.ones(len(parents), dtype=np.int64)
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            out[i] = out[p] + 1
    return out


def children(tokens: np.ndarray, parents: np.ndarray) -> list[dict[int, int]]:
    """``[N + 1]`` maps token -> child node: entry ``0`` for the root, ``1 + i`` for node ``i``; each map's
    insertion order is node order."""
    kids: list[dict[int, int]] = [{} for _ in range(len(parents) + 1)]
    for i, (t, p) in enumerate(zip(tokens.tolist(), parents.tolist())):
        kids[p + 1][t] = i
    return kids


@dataclass(frozen=True)
class Union:
    """Several trees merged below one root.

    Attributes:
        tokens: ``[M]`` int64. parents: ``[M]`` int64 (``-1``: child of the root). depths: ``[M]`` int64.
        where: one ``[N_k]`` int64 array per input tree: the merged node of each of its nodes.
    """

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    where: list[np.ndarray]


def union(base_tokens: np.ndarray, base_parents: np.ndarray, base_depths: np.ndarray,
          base_children: list[dict[int, int]], others: Sequence[tuple[np.ndarray, np.ndarray]]) -> Union:
    """Merge trees below one root: the first (``base``) whole, in its node order, then each of ``others``
    walked node by node; a node not yet present is appended after its parent's.

    The base's ``children`` maps are passed in (a datastore tree is merged at many steps; its maps are
    computed once), so the cost is the other trees' size.

    Args:
        base_tokens / base_parents / base_depths: ``[N]`` arrays of the first tree.
        base_children: :func:`children` of the first tree.
        others: ``(tokens, parents)`` ``[N_k]`` arrays of each further tree.

    Returns:
        The :class:`Union`.
    """
    n0 = len(base_tokens)
    tokens = base_tokens.astype(np.int64).tolist()
    parents = base_parents.astype(np.int64).tolist()
    levels = base_depths.tolist()
    where = [np.arange(n0, dtype=np.int64)]
    added: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node not in the base
    for toks, pars in others:
        at = [0] * len(toks)
        for i, (t, p) in enumerate(zip(toks.tolist(), pars.tolist())):
            up = -1 if p < 0 else at[p]
            node = base_children[up + 1].get(t) if up < n0 else None
            if node is None:
                node = added.get((up, t))
                if node is None:
                    node = added[(up, t)] = len(tokens)
                    tokens.append(t)
                    parents.append(up)
                    levels.append(1 if up < 0 else levels[up] + 1)
            at[i] = node
        where.append(np.asarray(at, dtype=np.int64))
    return Union(np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int64),
                 np.asarray(levels, dtype=np.int64), where)


def top_nodes(parents: np.ndarray, depths: np.ndarray, scores: np.ndarray, budget: int,
              min_score: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """The best ``budget`` nodes (score desc, depth asc, node order), dropping those scoring below ``min_score``.

    With scores that never rise along a path the kept nodes are prefix-closed, and in this order every
    parent precedes its children.

    Args:
        parents / depths / scores: ``[N]`` arrays of one tree.
        budget: most nodes kept, >= 0.
        min_score: nodes scoring below this are dropped.

    Returns:
        ``(order, new_parents)``: ``[K]`` int64 indices of the kept nodes, best first, and ``[K]`` int32 their
        parents renumbered to positions in ``order``.

    Raises:
        ValueError: when ``budget < 0``.
    """
    if budget < 0:
        raise ValueError(f"budget={budget}: must be >= 0")
    order = np.lexsort((np.arange(len(scores)), depths, -scores))[:budget]
    if min_score > 0:
        order = order[scores[order] >= min_score]
    renumber = np.full(len(scores) + 1, -1, dtype=np.int64)  # slot -1 keeps the root at -1
    renumber[order] = np.arange(len(order))
    return order, renumber[parents[order]].astype(np.int32)


def best_path(parents: np.ndarray, depths: np.ndarray, scores: np.ndarray, max_len: int,
              min_score: float = 0.0) -> np.ndarray:
    """The root path of at most ``max_len`` nodes, each scoring at least ``min_score``, with the largest sum
    of scores (ties: the earlier node in node order).

    Args:
        parents / depths / scores: ``[N]`` arrays of one tree.
        max_len: most nodes on the path, >= 0.
        min_score: nodes scoring below this (and so their subtrees) are not used.

    Returns:
        ``[K]`` int64 node indices, root first.

    Raises:
        ValueError: when ``max_len < 0``.
    """
    if max_len < 0:
        raise ValueError(f"max_len={max_len}: must be >= 0")
    usable = np.flatnonzero((scores >= min_score) & (depths <= max_len))
    total: dict[int, float] = {-1: 0.0}  # reachable nodes: sum of scores from the root
    came_from: dict[int, int] = {}
    best, best_sum = -1, 0.0
    for i, p, s in zip(usable.tolist(), parents[usable].tolist(), scores[usable].tolist()):
        if p in total:
            t = total[i] = s + total[p]
            came_from[i] = p
            if t > best_sum:
                best, best_sum = i, t
    path: list[int] = []
    while best >= 0:
        path.append(best)
        best = came_from[best]
    return np.asarray(path[::-1], dtype=np.int64)


def live_layer(main: Match | None, delta: Match | None) -> Match | None:
    """The live layer's match from its main build's and its delta's (``csrc/merge.cpp`` ``live_layer``): the longer
    match alone; at equal lengths the count-summed union, the main tree's nodes in order, then the delta's new nodes
    each after its parent; root counts added when both are known (else 0). An empty tree counts as no match."""
    if delta is None or not len(delta.tree):
        return main
    if main is None or not len(main.tree) or len(delta.ngram) > len(main.ngram):
        return delta
    if len(main.ngram) > len(delta.ngram):
        return main
    tokens, parents, counts = main.tree.token_ids.tolist(), main.tree.parents.tolist(), main.tree.counts.tolist()
    node = {(p, t): i for i, (p, t) in enumerate(zip(parents, tokens))}  # a repeated sibling: the later one
    where: list[int] = []
    for t, p, c in zip(delta.tree.token_ids.tolist(), delta.tree.parents.tolist(), delta.tree.counts.tolist()):
        up = -1 if p < 0 else where[p]
        i = node.get((up, t))
        if i is None:
            i = node[(up, t)] = len(tokens)
            tokens.append(t)
            parents.append(up)
            counts.append(0)
        counts[i] += c
        where.append(i)
    a, b = main.tree.root_count, delta.tree.root_count
    return Match(main.ngram, TokenTree(np.asarray(tokens), np.asarray(parents), np.asarray(counts),
                                       a + b if a and b else 0))
