"""Calibrated node scores: each draft node's probability of being accepted by verification.

Count ratios rank a source's continuations well but are no probabilities (a count ratio of 0.5 was
accepted about 15% of the time). Here a logistic model (scikit-learn's ``LogisticRegression``) predicts
the *conditional* acceptance of a node, given that its parent was accepted, from what the sources
already know about it (:data:`FEATURES`). For each source of :data:`SOURCES` (the corpus datastore's
tree, the shared live layer's: every process's earlier outputs, the request's own tokens: its prompt and
output so far, and this process's finished outputs): whether the node is in it, its count ratio to its
parent (smoothed), the parent's count, the matched context's length (log), and whether that source
predicted other continuations of the parent and not this one; then how many sources agree, and the depth.
A node's score is the product of the conditionals along its path, so scores fall along every path (the
best nodes form a prefix-closed tree) and estimate ``P(node accepted)``.

Because at most one node per depth is accepted, a draft's expected accepted length (draft tokens; the
bonus token adds 1) is the sum of its nodes' scores: what the back-off lookup maximises over the candidate
n-grams (:func:`draft_from_candidates`) and what a node's verification cost is weighed against (a node is
worth verifying when its score exceeds its cost in accepted tokens).

Fitted from replay logs (``benchmarks/calibrate.py``) on one half of the public prompts, reported on the
other half; the parameters ship with the package (``decoder/data/calibration.json``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from datastore.extras import require
from datastore.tree import Match, TokenTree

from . import treeops
from .draft import Draft, ScoreKind
from .local import LocalStrategy, SuffixMatching, local_strategy

__all__ = ["SOURCES", "FEATURES", "COLUMN", "Calibration", "NodeTable", "TreeColumns", "tree_columns", "node_table",
           "draft_from_candidates", "DEFAULT_PATH"]

SOURCES = ("ds", "live", "local", "outputs")
"""The sources a node table merges, in union order: the corpus datastore, the shared live layer, the request's
own tokens (:mod:`decoder.local`), this process's finished outputs (:mod:`decoder.output_index`)."""
_BLOCK = ("on", "ratio", "log_parent", "ratio_x_log_parent", "log_n", "miss")
FEATURES = tuple(f"{src}_{f}" for src in SOURCES for f in _BLOCK) + ("agree", "log_depth")
COLUMN = {name: i for i, name in enumerate(FEATURES)}
"""Feature name -> its column in a node table's ``features``."""
DEFAULT_PATH = Path(__file__).with_name("data") / "calibration.json"


@dataclass(frozen=True)
class TreeColumns:
    """One source tree's per-node columns, computed once per tree (a datastore tree is reused at many steps).

    Attributes:
        tree: the tree. depths: ``[N]`` int64. children: :func:`decoder.treeops.children` of it.
        ratio: ``[N]`` float64 count / (parent count + prior). log_parent: ``[N]`` float64 log1p(parent count).
    """

    tree: TokenTree
    depths: np.ndarray
    children: list = field(repr=False)
    ratio: np.ndarray = field(repr=False)
    log_parent: np.ndarray = field(repr=False)


def _elementwise(f: Callable[[float], float], x: np.ndarray) -> np.ndarray:
    """``f`` (a :mod:`math` function: the C library's, as the native core calls) on each element, float64."""
    return np.fromiter((f(v) for v in x.tolist()), dtype=np.float64, count=len(x))


def tree_columns(tree: TokenTree, prior: float) -> TreeColumns:
    """The :class:`TreeColumns` of ``tree`` with count ratios smoothed by ``prior`` (>= 0)."""
    counts = tree.counts.astype(np.float64)
    par = tree.parents.astype(np.int64)
    root = float(tree.root_count or counts[par < 0].sum())
    parent_count = np.where(par >= 0, counts[np.maximum(par, 0)], root)
    return TreeColumns(tree, treeops.depths(par), treeops.children(tree.token_ids, par),
                       counts / (parent_count + prior), _elementwise(math.log1p, parent_count))


@dataclass(frozen=True)
class NodeTable:
    """The union of the sources' trees below the same root, with each node's features.

    Attributes:
        tokens: ``[N]`` int64. parents: ``[N]`` int64 (``-1``: child of the root; parents first).
        depths: ``[N]`` int64 (1 for a child of the root). features: ``[N, len(FEATURES)]`` float64.
    """

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    features: np.ndarray


def node_table(matches: Mapping[str, Match | None], prior: float = 1.0,
               columns: Mapping[str, TreeColumns] | None = None) -> NodeTable | None:
    """The union of the sources' matches, with :data:`FEATURES` per node.

    Args:
        matches: source name (of :data:`SOURCES`) -> its matched context and continuation tree (``None`` or
            absent: that source has nothing).
        prior: additive smoothing of the count ratios, >= 0.
        columns: source name -> precomputed :class:`TreeColumns` of that source's tree, where cached.

    Returns:
        The :class:`NodeTable` (the first source's nodes first, in their order, then each later source's
        new nodes), or ``None`` when no source has a node.

    Raises:
        ValueError: for a source name not in :data:`SOURCES`.
    """
    unknown = set(matches) - set(SOURCES)
    if unknown:
        raise ValueError(f"unknown sources {sorted(unknown)}: node tables merge {SOURCES}")
    given = columns or {}
    parts: list[tuple[str, Match, TreeColumns]] = []
    for src in SOURCES:
        m = matches.get(src)
        if m is not None and len(m.tree):
            cached = given.get(src)
            parts.append(
                (src, m, cached if cached is not None and cached.tree is m.tree else tree_columns(m.tree, prior))
            )
    if not parts:
        return None
    base = parts[0][2]
    u = treeops.union(
        base.tree.token_ids,
        base.tree.parents,
        base.depths,
        base.children,
        [(c.tree.token_ids, c.tree.parents) for _, _, c in parts[1:]],
    )
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
    x[:, COLUMN["agree"]] = np.maximum(sum(x[:, COLUMN[f"{s}_on"]] for s in SOURCES) - 1.0, 0.0)  # others that agree
    x[:, COLUMN["log_depth"]] = _elementwise(math.log, u.depths.astype(np.float64))
    return NodeTable(u.tokens, u.parents, u.depths, x)


@dataclass(frozen=True)
class Calibration:
    """A fitted logistic model of a node's conditional acceptance, and how it was fitted: the merged
    drafter's scorer (:class:`decoder.service.DraftingService`).

    Attributes:
        coef: ``[len(FEATURES)]`` float64 weights (on raw features). intercept: the bias.
        prior: the count-ratio smoothing the features were computed with.
        meta: provenance and held-out figures (prompts, rows, datastores, ``local``: the local source's
            :meth:`decoder.local.LocalStrategy.config` it was fitted with ...).

    Raises:
        ValueError: when ``coef`` does not match :data:`FEATURES`.
    """

    coef: np.ndarray
    intercept: float
    prior: float = 1.0
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        coef = np.array(self.coef, dtype=np.float64)
        coef.setflags(write=False)
        object.__setattr__(self, "coef", coef)
        if coef.shape != (len(FEATURES),):
            raise ValueError(f"calibration has {coef.shape} weights, expected {len(FEATURES)} ({FEATURES})")

    def conditional(self, features: np.ndarray) -> np.ndarray:
        """``[N]`` float64 P(node accepted | parent accepted) for ``[N, len(FEATURES)]`` features.

        The logit sums the terms in feature order and each exponential is the C library's, exactly as the
        native core computes it, so both give the same bits.
        """
        z = np.full(len(features), self.intercept, dtype=np.float64)
        for j, w in enumerate(self.coef.tolist()):
            z += w * features[:, j]
        return 1.0 / (1.0 + _elementwise(math.exp, -z))

    def scores(self, table: NodeTable) -> np.ndarray:
        """``[N]`` float64 P(node accepted): the product of the conditionals along each path."""
        p = self.conditional(table.features)
        for depth in range(2, int(table.depths.max(initial=1)) + 1):
            level = table.depths == depth
            p[level] *= p[table.parents[level]]
        return p

    def local_strategy(self) -> LocalStrategy:
        """The local source this calibration was fitted with (``meta["local"]``; default: :class:`SuffixMatching`).

        Raises:
            ValueError: when ``meta["local"]`` names no known strategy.
        """
        fitted = self.meta.get("local")
        return SuffixMatching() if fitted is None else local_strategy(fitted)

    def columns(self, tree: TokenTree) -> TreeColumns:
        """A tree's :class:`TreeColumns` with this calibration's smoothing, to cache for a reused tree."""
        return tree_columns(tree, self.prior)

    def digest(self) -> str:
        """A short hash of the parameters (caches of anything the scores decide key on it)."""
        import hashlib

        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        """The parameters as a JSON-ready dict (the format :meth:`load` reads)."""
        return {
            "version": 1,
            "features": list(FEATURES),
            "coef": self.coef.tolist(),
            "intercept": self.intercept,
            "prior": self.prior,
            "meta": self.meta,
        }

    def save(self, path: str | Path) -> None:
        """Write the parameters as JSON."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path = DEFAULT_PATH) -> Calibration:
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
            raise ValueError(
                f"{path} was fitted on features {raw.get('features')}, this version uses {FEATURES}: "
                "refit it with benchmarks/calibrate.py"
            )
        return cls(np.asarray(raw["coef"]), float(raw["intercept"]), float(raw["prior"]), raw.get("meta", {}))

    @classmethod
    def fit(
        cls,
        features: np.ndarray,
        accepted: np.ndarray,
        *,
        prior: float = 1.0,
        meta: dict | None = None,
        regularization: float = 1.0,
    ) -> Calibration:
        """Fit the conditional model on nodes whose parent was accepted (needs the ``fit`` extra: scikit-learn).

        Args:
            features: ``[rows, len(FEATURES)]`` float64, from :func:`node_table`.
            accepted: ``[rows]`` bool, the node's token was the target's choice.
            prior: the smoothing the features were computed with.
            regularization: scikit-learn's ``C`` (inverse L2 strength) on standardized features.

        Raises:
            ValueError: when the shapes differ or only one class is present.
            ModuleNotFoundError: when scikit-learn is missing (the message names the extra).
        """
        require("sklearn", "fit", "fitting the calibration")
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import StandardScaler

        features = np.asarray(features, dtype=np.float64)
        accepted = np.asarray(accepted, dtype=bool)
        if features.ndim != 2 or features.shape != (len(accepted), len(FEATURES)):
            raise ValueError(
                f"features {features.shape} and accepted {accepted.shape} do not match "
                f"[rows, {len(FEATURES)}] and [rows]"
            )
        if accepted.all() or not accepted.any():
            raise ValueError("accepted holds one class only: replay more prompts")
        scaler = StandardScaler().fit(features)
        scale = np.where(scaler.scale_ > 0, scaler.scale_, 1.0)
        model = LogisticRegression(C=regularization, max_iter=2000).fit((features - scaler.mean_) / scale, accepted)
        coef = model.coef_[0] / scale  # back to raw features
        intercept = float(model.intercept_[0] - (coef * scaler.mean_).sum())
        return cls(coef, intercept, prior, dict(meta or {}))


def draft_from_candidates(
    calibration: Calibration,
    candidates: Sequence[Match | None],
    others: Mapping[str, Match | None],
    budget: int,
    *,
    chain: bool = False,
    min_score: float = 0.0,
    columns: Callable[[TokenTree], TreeColumns] | None = None,
) -> tuple[Draft, int]:
    """The calibrated draft, backing off among the datastore's candidate n-grams: the candidate (a stored
    suffix of the context) whose union with the other sources gives the largest expected accepted length.

    Args:
        calibration: the node model.
        candidates: the datastore's matches, longest first (``[]`` or ``[None]``: no datastore match).
        others: the other sources' matches (``"live"``, ``"local"``, ``"outputs"``), merged into every
            candidate's draft.
        budget: most draft nodes (tree) or tokens (chain), >= 0.
        chain: return the best path (at most ``budget`` tokens) instead of a tree.
        min_score: drop nodes whose acceptance probability is below this (a node's verification cost in
            accepted tokens: the draft stops where the expected gain falls below it).
        columns: ``tree -> TreeColumns`` cache for the trees a datastore client hands out again (the
            corpus datastore's and the live layer's);
            ``None``: computed each call.

    Returns:
        ``(draft, chosen)``: the best-first draft (``probability`` scores) and the index of the chosen
        candidate (``-1`` for none).

    Raises:
        ValueError: when ``budget < 0``.
    """
    if budget < 0:
        raise ValueError(f"budget={budget}: must be >= 0")
    cached: dict[str, TreeColumns] = {}
    if columns is not None:
        cached = {src: columns(m.tree) for src, m in others.items() if m is not None and src == "live" and len(m.tree)}
    best, best_gain, chosen = Draft.empty(ScoreKind.PROBABILITY), -1.0, -1
    for i, cand in enumerate(list(candidates) or [None]):
        if cand is not None and columns is not None and len(cand.tree):
            cached["ds"] = columns(cand.tree)
        table = node_table({**others, "ds": cand}, calibration.prior, cached)
        if table is None or budget == 0:
            continue
        p = calibration.scores(table)
        if chain:
            path = treeops.best_path(table.parents, table.depths, p, budget, min_score)
            draft = Draft.chain(table.tokens[path], p[path], ScoreKind.PROBABILITY)
        else:
            order, parents = treeops.top_nodes(table.parents, table.depths, p, budget, min_score)
            draft = Draft(table.tokens[order], parents, p[order], ScoreKind.PROBABILITY)
        gain = 0.0
        for score in draft.scores.tolist():  # in node order, as the native core adds them
            gain += score
        if gain > best_gain:
            best, best_gain, chosen = draft, gain, (i if cand is not None else -1)
    return best, chosen
