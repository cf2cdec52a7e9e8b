"""The Python oracle of the native core's stages 3 to 7 (``csrc/merge.cpp``, ``features.cpp``, ``scores.cpp``,
``cut.cpp``): the union of the sources' trees, each node's features by name, the calibrated scores, and the chain or
tree cut of each datastore candidate's union; the candidate with the largest expected accepted length wins. The same
arithmetic in the same order (numpy, and the C library's ``log``, ``log1p`` and ``exp`` through :mod:`math`), so the
same bits."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from crest_native import FEATURES, MODEL_FEATURES, SOURCES
from datastore.tree import Match, TokenTree
from drafting.calibration import Calibration
from drafting.draft import Draft, ScoreKind

from . import treeops

COLUMN = {name: i for i, name in enumerate(FEATURES)}
"""Feature name -> its column, by the native core's names."""


@dataclass(frozen=True)
class TreeColumns:
    """One source tree's per-node columns, computed once per tree."""

    tree: TokenTree
    depths: np.ndarray
    children: list = field(repr=False)
    ratio: np.ndarray = field(repr=False)
    log_parent: np.ndarray = field(repr=False)


def _elementwise(f: Callable[[float], float], x: np.ndarray) -> np.ndarray:
    """``f`` (a :mod:`math` function: the C library's, as the native core calls) on each element, float64."""
    return np.fromiter((f(v) for v in x.tolist()), dtype=np.float64, count=len(x))


def tree_columns(tree: TokenTree, prior: float) -> TreeColumns:
    counts = tree.counts.astype(np.float64)
    par = tree.parents.astype(np.int64)
    root = float(tree.root_count or counts[par < 0].sum())
    parent_count = np.where(par >= 0, counts[np.maximum(par, 0)], root)
    return TreeColumns(tree, treeops.depths(par), treeops.children(tree.token_ids, par),
                       counts / (parent_count + prior), _elementwise(math.log1p, parent_count))


def _shape(c: TreeColumns) -> tuple[np.ndarray, np.ndarray]:
    t = c.tree
    return (t.token_ids, t.parents)


@dataclass(frozen=True)
class NodeTable:
    """The union of the sources' trees with each node's features (``[N, len(FEATURES)]``)."""

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    features: np.ndarray


def node_table(matches: Mapping[str, Match | None], prior: float = 1.0) -> NodeTable | None:
    """The union of the sources' matches (source name of ``SOURCES`` -> match), with the features per node; ``None``
    when no source has a node. Raises ``ValueError`` for a source name the core does not know."""
    unknown = set(matches) - set(SOURCES)
    if unknown:
        raise ValueError(f"unknown sources {sorted(unknown)}: node tables merge {SOURCES}")
    parts = [(src, m, tree_columns(m.tree, prior)) for src in SOURCES
             if (m := matches.get(src)) is not None and len(m.tree)]
    if not parts:
        return None
    base = parts[0][2]
    u = treeops.union(*_shape(base), base.depths, base.children, [_shape(c) for _, _, c in parts[1:]])
    n = len(u.tokens)
    x = np.zeros((n, len(FEATURES)), dtype=np.float64)
    has_kids = np.zeros(n + 1, dtype=bool)  # slot 0: the root
    for (src, m, c), at in zip(parts, u.where):
        x[at, COLUMN[f"{src}_on"]] = 1.0
        x[at, COLUMN[f"{src}_ratio"]] = c.ratio
        x[at, COLUMN[f"{src}_log_parent"]] = c.log_parent
        x[at, COLUMN[f"{src}_ratio_x_log_parent"]] = c.ratio * c.log_parent
        x[at, COLUMN[f"{src}_log_n"]] = math.log1p(len(m.ngram))
        has_kids[:] = False
        has_kids[u.parents[at] + 1] = True
        on = x[:, COLUMN[f"{src}_on"]] > 0
        x[:, COLUMN[f"{src}_miss"]] = ~on & has_kids[u.parents + 1]  # it predicted other continuations of the parent
    x[:, COLUMN["agree"]] = np.maximum(sum(x[:, COLUMN[f"{s}_on"]] for s in SOURCES) - 1.0, 0.0)
    x[:, COLUMN["log_depth"]] = _elementwise(math.log, u.depths.astype(np.float64))
    return NodeTable(u.tokens, u.parents, u.depths, x)


def model_features(lm_head: np.ndarray, state: np.ndarray, table: NodeTable) -> np.ndarray:
    """``[N, len(MODEL_FEATURES)]``: per depth-1 node whose token is a row of ``lm_head`` (``[V, d]`` float32), 1, its
    log-probability among those nodes under ``state`` (``[d]`` float32; logits summed in order, in float64) and
    whether it is their argmax; zeros elsewhere (``csrc/scores.cpp``, ``model_features``)."""
    out = np.zeros((len(table.tokens), len(MODEL_FEATURES)))
    scored = [n for n in range(len(table.tokens)) if table.depths[n] == 1 and 0 <= table.tokens[n] < len(lm_head)]
    for n in scored:
        z = 0.0
        for w, x in zip(lm_head[table.tokens[n]].tolist(), state.tolist()):
            z += w * x
        out[n, :2] = 1.0, z
    if not scored:
        return out
    top = max(out[n, 1] for n in scored)
    total = 0.0
    for n in scored:
        total += math.exp(out[n, 1] - top)
    log_total = top + math.log(total)
    for n in scored:
        out[n, 1:] = out[n, 1] - log_total, float(out[n, 1] == top)
    return out


def conditional(cal: Calibration, features: np.ndarray, tokens: np.ndarray | None = None) -> np.ndarray:
    """``[N]`` P(node accepted | parent accepted): the logit summed in feature order, then the node's token's bias
    (``tokens``: ``[N]``, needed when the calibration has a token term), the C library's ``exp``."""
    z = np.full(len(features), cal.intercept, dtype=np.float64)
    for j, w in enumerate(cal.coef.tolist()):
        z += w * features[:, j]
    if cal.token_bias is not None:
        if tokens is None:
            raise ValueError("a calibration with a token term scores nodes by their tokens: pass tokens")
        ids = cal.token_bias.tokens
        at = np.minimum(np.searchsorted(ids, tokens), max(len(ids) - 1, 0))
        hit = ids[at] == tokens if len(ids) else np.zeros(len(tokens), dtype=bool)
        z[hit] += cal.token_bias.bias[at[hit]]
    return 1.0 / (1.0 + _elementwise(math.exp, -z))


def scores(cal: Calibration, table: NodeTable) -> np.ndarray:
    """``[N]`` P(node accepted): the product of the conditionals along each path."""
    p = conditional(cal, table.features, table.tokens)
    for depth in range(2, int(table.depths.max(initial=1)) + 1):
        level = table.depths == depth
        p[level] *= p[table.parents[level]]
    return p


def holders(table: NodeTable) -> np.ndarray:
    """``[N]`` uint8: which sources' trees hold each node, bit ``k`` for ``SOURCES[k]`` (``Draft.sources``)."""
    out = np.zeros(len(table.tokens), dtype=np.uint8)
    for k, src in enumerate(SOURCES):
        out |= ((table.features[:, COLUMN[f"{src}_on"]] > 0).astype(np.uint8) << k).astype(np.uint8)
    return out


def draft_from_candidates(cal: Calibration, candidates: Sequence[Match | None],
                          others: Mapping[str, Match | None],
                          budget: int, *, chain: bool = False, min_score: float = 0.0) -> tuple[Draft, int]:
    """The calibrated draft, backing off among the datastore's candidates (longest first): the one whose union with
    ``others`` gives the largest expected accepted length. Returns ``(draft, chosen)`` (-1: no candidate)."""
    if budget < 0:
        raise ValueError(f"budget={budget}: must be >= 0")
    nothing = (np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float64))
    best, best_gain, chosen = Draft(*nothing, ScoreKind.PROBABILITY, np.zeros(0, np.uint8)), -1.0, -1
    for i, cand in enumerate(list(candidates) or [None]):
        table = node_table({**others, "ds": cand}, cal.prior)
        if table is None:
            continue
        p, held = scores(cal, table), holders(table)
        if chain:
            path = treeops.best_path(table.parents, table.depths, p, budget, min_score)
            draft = Draft(table.tokens[path], np.arange(-1, len(path) - 1, dtype=np.int32), p[path],
                          ScoreKind.PROBABILITY, held[path])
        else:
            order, parents = treeops.top_nodes(table.parents, table.depths, p, budget, min_score)
            draft = Draft(table.tokens[order], parents, p[order], ScoreKind.PROBABILITY, held[order])
        gain = 0.0
        for score in draft.scores.tolist():  # in node order, as the native core adds them
            gain += score
        if gain > best_gain:
            best, best_gain, chosen = draft, gain, (i if cand is not None else -1)
    return best, chosen
