"""Calibrated node scores: each draft node's probability of being accepted by verification.

The hand-weighted noisy-OR of smoothed count ratios (:func:`decoder.draft.merge_drafts`) ranks nodes
well but is no probability: a score of 0.5 was accepted about 15% of the time. Here a logistic model
(scikit-learn's ``LogisticRegression``) predicts the *conditional* acceptance of a node, given that its
parent was accepted, from what the sources already know about it (:data:`FEATURES`): for the corpus
datastore's tree, the live layer's (the model's earlier outputs) and the prompt trie's, whether the node
is in it, its count ratio to its parent (smoothed), the parent's count, the matched context's length,
whether that source predicted other continuations of the parent and not this one; how many sources
agree; the depth. A node's score is the product of the
conditionals along its path, so scores fall along every path (the best nodes form a prefix-closed tree)
and estimate ``P(node accepted)``.

Because at most one node per depth is accepted, a draft's expected accepted length (draft tokens; the
bonus token adds 1) is the sum of its nodes' scores: what the back-off lookup maximises over the candidate
n-grams (:func:`draft_from_candidates`) and what a node's verification cost is weighed against (a node is
worth verifying when its score exceeds its cost in accepted tokens).

Fitted from replay logs (``benchmarks/calibrate.py``) on one half of the public prompts, reported on the
other half; the parameters ship with the package (``decoder/data/calibration.json``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from datastore.tree import Match, TokenTree

from .draft import Draft, chain_from, select_best

__all__ = ["FEATURES", "Calibration", "NodeTable", "node_table", "accepted_nodes", "draft_from_candidates"]

_BLOCK = ("on", "ratio", "log_parent", "ratio_x_log_parent", "n", "miss")
FEATURES = tuple(f"{src}_{f}" for src in ("ds", "live", "trie") for f in _BLOCK) + ("agree", "log_depth")
_DS, _LIVE, _TRIE = 0, 6, 12  # first column of each source's block: corpus datastore, live layer, prompt trie
DEFAULT_PATH = Path(__file__).with_name("data") / "calibration.json"


@dataclass(frozen=True)
class NodeTable:
    """The union of a datastore tree and a trie tree below the same root, with each node's features.

    Attributes:
        tokens: ``[N]`` int64. parents: ``[N]`` int64 (``-1``: child of the root; parents first).
        depths: ``[N]`` int64 (1 for a child of the root). features: ``[N, len(FEATURES)]`` float64.
    """

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    features: np.ndarray


@dataclass
class _TreeColumns:
    """One source tree's per-node columns (computed once per tree: datastore trees are reused)."""

    tree: TokenTree
    depths: np.ndarray
    ratio: np.ndarray
    log_parent: np.ndarray
    children: list = field(repr=False)


def _columns(tree: TokenTree, prior: float) -> _TreeColumns:
    counts = tree.counts.astype(np.float64)
    par = tree.parents.astype(np.int64)
    root = float(tree.root_count or counts[par < 0].sum())
    parent_count = np.where(par >= 0, counts[np.maximum(par, 0)], root)
    depths = np.ones(len(par), dtype=np.int64)
    kids: list[dict[int, int]] = [{} for _ in range(len(par) + 1)]
    for i, (t, p) in enumerate(zip(tree.token_ids.tolist(), par.tolist())):
        if p >= 0:
            depths[i] = depths[p] + 1
        kids[p + 1][t] = i
    return _TreeColumns(tree, depths, counts / (parent_count + prior), np.log1p(parent_count), kids)


def node_table(stored: Match | None, matched: Match | None, prior: float = 1.0,
               stored_columns: _TreeColumns | None = None, live: Match | None = None,
               live_columns: _TreeColumns | None = None) -> NodeTable | None:
    """The union of the datastore's match, the live layer's and the trie's, with :data:`FEATURES` per node.

    Args:
        stored: the corpus datastore's n-gram and its tree (``None``: none).
        matched: the prompt trie's context and its tree (``None``: none).
        prior: additive smoothing of the count ratios, >= 0.
        stored_columns / live_columns: precomputed columns (:meth:`Calibration.columns`) of ``stored`` /
            ``live``, when cached.
        live: the live layer's n-gram (from earlier outputs of the model) and its tree (``None``: none).

    Returns:
        The :class:`NodeTable` (the first source's nodes first, in their order, then each later source's
        new nodes), or ``None`` when every source is ``None`` or empty.
    """
    given = {id(stored): stored_columns, id(live): live_columns}
    parts = [(m, col) for m, col in ((stored, _DS), (live, _LIVE), (matched, _TRIE)) if m is not None and len(m.tree)]
    if not parts:
        return None
    cols = [given.get(id(m)) or _columns(m.tree, prior) for m, _ in parts]
    base = cols[0]
    n0 = len(base.depths)
    tokens = base.tree.token_ids.astype(np.int64).tolist()
    parents = base.tree.parents.astype(np.int64).tolist()
    depths = base.depths.tolist()
    wheres = [np.arange(n0)]
    added: dict[tuple[int, int], int] = {}
    for other in cols[1:]:
        where = np.zeros(len(other.depths), dtype=np.int64)
        for i, (t, p) in enumerate(zip(other.tree.token_ids.tolist(), other.tree.parents.tolist())):
            up = -1 if p < 0 else int(where[p])
            node = base.children[up + 1].get(t) if up < n0 else None
            if node is None:
                node = added.get((up, t))
                if node is None:
                    node = added[(up, t)] = len(tokens)
                    tokens.append(t)
                    parents.append(up)
                    depths.append(1 if up < 0 else depths[up] + 1)
            where[i] = node
        wheres.append(where)
    n = len(tokens)
    par = np.asarray(parents, dtype=np.int64)
    x = np.zeros((n, len(FEATURES)), dtype=np.float64)
    for (m, col), c, at in zip(parts, cols, wheres):
        on = np.zeros(n, dtype=bool)
        on[at] = True
        x[at, col] = 1.0
        x[at, col + 1] = c.ratio
        x[at, col + 2] = c.log_parent
        x[at, col + 3] = c.ratio * c.log_parent
        x[at, col + 4] = len(m.ngram)
        has_kids = np.zeros(n + 1, dtype=bool)  # slot 0: the root
        has_kids[par[on] + 1] = True
        x[:, col + 5] = ~on & has_kids[par + 1]  # the source predicted other continuations of the parent
    x[:, -2] = np.maximum(x[:, _DS] + x[:, _LIVE] + x[:, _TRIE] - 1.0, 0.0)  # other sources that agree
    d = np.asarray(depths, dtype=np.int64)
    x[:, -1] = np.log(d)
    return NodeTable(np.asarray(tokens, dtype=np.int64), par, d, x)


def accepted_nodes(table: NodeTable, reference: np.ndarray, pos: int) -> np.ndarray:
    """``[N]`` bool: whether verification accepts each node when ``reference[pos:]`` is what the target
    generates next (the node's whole path matches the reference)."""
    at = pos + table.depths - 1
    ok = np.zeros(len(table.tokens), dtype=bool)
    inside = at < len(reference)
    ok[inside] = table.tokens[inside] == reference[at[inside]]
    for depth in range(2, int(table.depths.max(initial=1)) + 1):
        level = table.depths == depth
        ok[level] &= ok[table.parents[level]]
    return ok


@dataclass(frozen=True)
class Calibration:
    """A fitted logistic model of a node's conditional acceptance, and how it was fitted.

    Attributes:
        coef: ``[len(FEATURES)]`` float64 weights (on raw features). intercept: the bias.
        prior: the count-ratio smoothing the features were computed with.
        meta: provenance and held-out figures (prompts, rows, datastore, Brier score ...).

    Raises:
        ValueError: when ``coef`` does not match :data:`FEATURES`.
    """

    coef: np.ndarray
    intercept: float
    prior: float = 1.0
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "coef", np.asarray(self.coef, dtype=np.float64))
        if self.coef.shape != (len(FEATURES),):
            raise ValueError(f"calibration has {self.coef.shape} weights, expected {len(FEATURES)} ({FEATURES})")

    def conditional(self, features: np.ndarray) -> np.ndarray:
        """``[N]`` float64 P(node accepted | parent accepted) for ``[N, len(FEATURES)]`` features."""
        return 1.0 / (1.0 + np.exp(-(features @ self.coef + self.intercept)))

    def scores(self, table: NodeTable) -> np.ndarray:
        """``[N]`` float64 P(node accepted): the product of the conditionals along each path."""
        p = self.conditional(table.features)
        for depth in range(2, int(table.depths.max(initial=1)) + 1):
            level = table.depths == depth
            p[level] *= p[table.parents[level]]
        return p

    def columns(self, tree: TokenTree) -> _TreeColumns:
        """A tree's per-node columns, to cache for a tree that is reused (a datastore tree)."""
        return _columns(tree, self.prior)

    def to_json(self) -> dict:
        return {"version": 1, "features": list(FEATURES), "coef": self.coef.tolist(), "intercept": self.intercept,
                "prior": self.prior, "meta": self.meta}

    def save(self, path: str | Path) -> None:
        """Write the parameters as JSON."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path = DEFAULT_PATH) -> "Calibration":
        """Read parameters written by :meth:`save` (default: the ones shipped with the package).

        Raises:
            FileNotFoundError: when the file is missing (fit one: ``benchmarks/calibrate.py``).
            ValueError: when its features are not :data:`FEATURES` (fitted by another version).
        """
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no calibration at {path}: fit one with benchmarks/calibrate.py")
        raw = json.loads(path.read_text())
        if tuple(raw.get("features", ())) != FEATURES:
            raise ValueError(f"{path} was fitted on features {raw.get('features')}, this version uses {FEATURES}: "
                             "refit it with benchmarks/calibrate.py")
        return cls(np.asarray(raw["coef"]), float(raw["intercept"]), float(raw["prior"]), raw.get("meta", {}))

    @classmethod
    def fit(cls, features: np.ndarray, accepted: np.ndarray, *, prior: float = 1.0, meta: dict | None = None,
            regularization: float = 1.0) -> "Calibration":
        """Fit the conditional model on nodes whose parent was accepted.

        Args:
            features: ``[rows, len(FEATURES)]`` float64, from :func:`node_table`.
            accepted: ``[rows]`` bool, the node's token was the target's choice.
            prior: the smoothing the features were computed with.
            regularization: scikit-learn's ``C`` (inverse L2 strength) on standardized features.

        Raises:
            ValueError: when the shapes differ or only one class is present.
        """
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import StandardScaler

        features = np.asarray(features, dtype=np.float64)
        accepted = np.asarray(accepted, dtype=bool)
        if features.ndim != 2 or features.shape != (len(accepted), len(FEATURES)):
            raise ValueError(f"features {features.shape} and accepted {accepted.shape} do not match "
                             f"[rows, {len(FEATURES)}] and [rows]")
        if accepted.all() or not accepted.any():
            raise ValueError("accepted holds one class only: replay more prompts")
        scaler = StandardScaler().fit(features)
        scale = np.where(scaler.scale_ > 0, scaler.scale_, 1.0)
        model = LogisticRegression(C=regularization, max_iter=2000).fit((features - scaler.mean_) / scale, accepted)
        coef = model.coef_[0] / scale  # back to raw features
        intercept = float(model.intercept_[0] - (coef * scaler.mean_).sum())
        return cls(coef, intercept, prior, dict(meta or {}))


def draft_from_candidates(calibration: Calibration, candidates: Sequence[Match | None], matched: Match | None,
                          budget: int, *, chain: bool = False, min_score: float = 0.0,
                          columns=None, live: Match | None = None) -> tuple[Draft, int]:
    """The back-off lookup's draft: among the datastore's candidate n-grams (all stored suffixes of the
    context), the one whose merge with the trie's match gives the largest expected accepted length.

    Args:
        calibration: the node model.
        candidates: the stored suffixes' matches, longest first (``[None]`` or ``[]``: trie only).
        matched: the prompt trie's match, or ``None``.
        budget: most draft nodes (tree) or tokens (chain), >= 0.
        chain: return the best path (at most ``budget`` tokens) instead of a tree.
        min_score: drop nodes whose acceptance probability is below this (a node's verification
            cost in accepted tokens: the budget stops where the expected gain falls below it).
        columns: ``tree -> _TreeColumns`` cache for datastore trees (``None``: computed each call).
        live: the live layer's longest match (the model's earlier outputs), merged into every candidate's draft.

    Returns:
        ``(draft, chosen)``: the best-first draft, scores = acceptance probabilities, and the index of
        the chosen candidate (``-1`` for none).

    Raises:
        ValueError: when ``budget < 0``.
    """
    if budget < 0:
        raise ValueError(f"budget={budget}: must be >= 0")
    best, best_gain, chosen = Draft.empty(), -1.0, -1
    for i, cand in enumerate(list(candidates) or [None]):
        cols = None if cand is None or columns is None else columns(cand.tree)
        live_cols = None if live is None or columns is None else columns(live.tree)
        table = node_table(cand, matched, calibration.prior, cols, live, live_cols)
        if table is None or budget == 0:
            continue
        p = calibration.scores(table)
        if chain:
            draft = chain_from(table.tokens, table.parents, table.depths, p, budget, min_score)
        else:
            draft = select_best(table.tokens, table.parents, table.depths, p, budget, min_score)
        gain = float(draft.scores.sum())
        if gain > best_gain:
            best, best_gain, chosen = draft, gain, (i if cand is not None else -1)
    return best, chosen
