"""Calibrated node scores: the parameters of each draft node's probability of being accepted by verification.

Count ratios rank a source's continuations well but are no probabilities. The native core (``csrc/features.cpp``,
``csrc/scores.cpp``) scores each node of a merged draft with a logistic model of its *conditional* acceptance, given its
parent's, over the features the sources know (:data:`FEATURES`): per source, whether the node is in it, its count ratio
to its parent, the parent's count, the matched context's length, and whether the source predicted another continuation;
then how many sources agree, and the depth. A node's score is the product of the conditionals along its path, so scores
fall along every path and estimate ``P(node accepted)``; a draft's expected accepted length is the sum of its nodes'
scores.

:class:`Calibration` holds the weights by feature name, fitted by ``python -m evaluation calibrate`` from the core's
node tables (:meth:`drafting.MergedMethod.node_tables`) and shipped in ``drafting/data/calibration.json``. It may add a
:class:`TokenBias`: a logit bias for the fit's most frequent drafted tokens, named by its tokenizer
(:func:`toolkit.tokenizer.tokenizer_fingerprint`) and dropped for another (:meth:`Calibration.for_tokenizer`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from crest_native import FEATURES, MODEL_FEATURES, SOURCES
from toolkit.extras import require

__all__ = ["Calibration", "DEFAULT_PATH", "NodeTable", "RETRIEVAL_SOURCES", "TokenBias"]

DEFAULT_PATH = Path(__file__).with_name("data") / "calibration.json"
"""The merged drafter's calibration (the retrieval sources)."""
RETRIEVAL_SOURCES = ("ds", "live", "local", "outputs")
"""The sources every calibration weighs."""
_SHARED = ("agree", "log_depth")


def source_features(source: str) -> list[str]:
    """The feature names of one source's block."""
    return [name for name in FEATURES if name.startswith(f"{source}_")]


def features_of(sources: tuple[str, ...]) -> list[str]:
    """The features a calibration over ``sources`` weighs, in :data:`FEATURES` order."""
    return [name for name in FEATURES if name in _SHARED or name.split("_", 1)[0] in sources]


@dataclass(frozen=True)
class NodeTable:
    """One datastore candidate's merged node table, as the native core scores it (what fitting reads).

    Attributes:
        tokens: ``[N]`` int64. parents: ``[N]`` int32 (``-1``: a child of the root; parents first).
        depths: ``[N]`` int32 (1 for a child of the root). features: ``[N, len(FEATURES)]`` float64.
        scores: ``[N]`` float64, each node's P(accepted) under the scoring calibration.
    """

    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    features: np.ndarray
    scores: np.ndarray


def _by_name(names: list, weights: list, source: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """The weights in :data:`FEATURES` order (0 for a source the file does not weigh), then the
    :data:`MODEL_FEATURES`' where it weighs them (all or none), and the sources it weighs.

    Raises:
        ValueError: naming the first feature the file and the native core do not share.
    """
    if len(names) != len(weights) or len(set(names)) != len(names):
        raise ValueError(f"{source}: its features and weights do not pair up ({len(names)} names, {len(weights)} "
                         "weights); refit it with python -m evaluation calibrate")
    given = dict(zip(names, weights))
    weighed = tuple(s for s in SOURCES if s in RETRIEVAL_SOURCES or any(n in given for n in source_features(s)))
    for name in features_of(weighed):
        if name not in given:
            raise ValueError(f"{source} has no weight for feature {name!r}, which the native core computes; "
                             "refit it with python -m evaluation calibrate")
    for name in names:
        if name not in FEATURES and name not in MODEL_FEATURES:
            raise ValueError(f"{source} weighs feature {name!r}, which the native core does not compute "
                             f"(it computes {', '.join(FEATURES + MODEL_FEATURES)}); refit it with python -m "
                             "evaluation calibrate")
    model = [name in given for name in MODEL_FEATURES]
    if any(model) and not all(model):
        raise ValueError(f"{source} weighs some of the model features {MODEL_FEATURES}, not all; refit it with "
                         "python -m evaluation train-head")
    columns = FEATURES + (MODEL_FEATURES if all(model) else ())
    return np.array([float(given.get(name, 0.0)) for name in columns], dtype=np.float64), weighed


@dataclass(frozen=True)
class TokenBias:
    """The calibration's term per drafted token: ``bias[i]`` is added to the logit of every node whose token is
    ``tokens[i]`` (any other token: 0), after the features' terms.

    Attributes:
        tokens: ``[T]`` int64 token ids, ascending, unique, in ``[0, 2**31)``.
        bias: ``[T]`` float64, finite, in logit units.
        tokenizer: the fingerprint of the tokenizer the ids belong to
            (:func:`toolkit.tokenizer.tokenizer_fingerprint`).

    Raises:
        ValueError: when the arrays do not pair up, the ids are not ascending, unique and in range, a bias is not
            finite, or ``tokenizer`` is empty.
    """

    tokens: np.ndarray
    bias: np.ndarray
    tokenizer: str

    def __post_init__(self) -> None:
        tokens = np.array(self.tokens, dtype=np.int64).reshape(-1)
        bias = np.array(self.bias, dtype=np.float64).reshape(-1)
        if len(tokens) != len(bias):
            raise ValueError(f"token bias: {len(tokens)} tokens and {len(bias)} biases do not pair up")
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= 2**31 or (np.diff(tokens) <= 0).any()):
            raise ValueError("token bias: the token ids must be ascending, unique and in [0, 2**31)")
        if not np.isfinite(bias).all():
            raise ValueError("token bias: every bias must be finite")
        if not self.tokenizer:
            raise ValueError("token bias: name the tokenizer its ids belong to (tokenizer_fingerprint)")
        tokens.setflags(write=False)
        bias.setflags(write=False)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "bias", bias)

    def to_json(self) -> dict:
        """The term as a JSON-ready dict (what :meth:`Calibration.load` reads)."""
        return {"tokenizer": self.tokenizer, "tokens": self.tokens.tolist(), "bias": self.bias.tolist()}


@dataclass(frozen=True)
class Calibration:
    """A fitted logistic model of a node's conditional acceptance, and how it was fitted: the merged drafter's scorer.

    Attributes:
        coef: ``[len(FEATURES)]`` float64 weights (on raw features), in :data:`FEATURES` order; a with-model
            calibration (:attr:`with_model`, what :class:`drafting.DraftHead` carries) adds one weight per
            :data:`MODEL_FEATURES` after them.
        intercept: the bias. prior: the count-ratio smoothing the features are computed with (>= 0).
        meta: provenance and held-out figures (prompts, rows, datastores, ``local``: the requests' automata's
            ``max_depth`` it was fitted with ...).
        sources: the sources it weighs (:data:`RETRIEVAL_SOURCES`); the features of any other have weight 0 and a
            drafter that uses one is refused.
        token_bias: the term per drafted token (``None``: none).

    Raises:
        ValueError: when ``coef`` does not have one weight per feature, ``prior < 0``, a source is unknown, or a
            source it does not weigh has a non-zero weight.
    """

    coef: np.ndarray
    intercept: float
    prior: float = 1.0
    meta: dict = field(default_factory=dict)
    sources: tuple[str, ...] = RETRIEVAL_SOURCES
    token_bias: TokenBias | None = None

    def __post_init__(self) -> None:
        coef = np.array(self.coef, dtype=np.float64)
        coef.setflags(write=False)
        object.__setattr__(self, "coef", coef)
        if coef.shape not in ((len(FEATURES),), (len(FEATURES) + len(MODEL_FEATURES),)):
            raise ValueError(f"calibration has {coef.shape} weights, expected {len(FEATURES)} ({FEATURES}), or "
                             f"{len(FEATURES) + len(MODEL_FEATURES)} with the model features {MODEL_FEATURES}")
        if not self.prior >= 0:
            raise ValueError(f"prior={self.prior}: must be >= 0")
        object.__setattr__(self, "sources", tuple(self.sources))
        if not set(RETRIEVAL_SOURCES) <= set(self.sources) <= set(SOURCES):
            raise ValueError(f"sources={self.sources}: a calibration weighs {RETRIEVAL_SOURCES}, and may add "
                             f"{tuple(s for s in SOURCES if s not in RETRIEVAL_SOURCES)}")
        weighed = set(features_of(self.sources))
        if any(w != 0.0 for name, w in zip(FEATURES, coef.tolist()) if name not in weighed):
            raise ValueError(f"a calibration over {self.sources} has non-zero weights for another source's features")

    @property
    def with_model(self) -> bool:
        """Whether it weighs the :data:`MODEL_FEATURES` (a row drafted with a next-state estimate is scored by it)."""
        return len(self.coef) > len(FEATURES)

    @property
    def local_depth(self) -> int:
        """The requests' automata's deepest continuation node this calibration was fitted with (default 16)."""
        return int(self.meta.get("local", {}).get("max_depth", 16))

    def flat(self) -> Calibration:
        """This calibration with every weight and the intercept 0 and no token term (the same sources, prior and
        width): every node a coin flip, what a datastore with no calibration at all starts from and the online fit
        (``online_strength``) learns from there."""
        return replace(self, coef=np.zeros_like(self.coef), intercept=0.0, token_bias=None,
                       meta={"flat": True, "local": self.meta.get("local", {})})

    def for_tokenizer(self, fingerprint: str) -> Calibration:
        """This calibration for token ids of the tokenizer with ``fingerprint``: itself, or, when its token term
        belongs to another tokenizer, a copy without the term (its ids would name other tokens)."""
        if self.token_bias is None or self.token_bias.tokenizer == fingerprint:
            return self
        return replace(self, token_bias=None)

    def digest(self) -> str:
        """A short hash of the parameters (caches of anything the scores decide key on it)."""
        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        """The parameters as a JSON-ready dict (the format :meth:`load` reads)."""
        names = features_of(self.sources) + (list(MODEL_FEATURES) if self.with_model else [])
        column = {name: j for j, name in enumerate(FEATURES + MODEL_FEATURES)}
        out = {"version": 1, "features": names, "coef": [float(self.coef[column[n]]) for n in names],
               "intercept": self.intercept, "prior": self.prior, "meta": self.meta}
        if self.token_bias is not None:
            out["token_bias"] = self.token_bias.to_json()
        return out

    def save(self, path: str | Path) -> None:
        """Write the parameters as JSON."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path = DEFAULT_PATH) -> Calibration:
        """Read parameters written by :meth:`save` (default: the ones shipped with the package), weights matched to
        the native core's features by name.

        Raises:
            FileNotFoundError: when the file is missing (fit one: ``python -m evaluation calibrate``).
            ValueError: naming the feature, when the file weighs a feature the core does not compute or lacks one
                it does; when the file is not JSON or its token term is malformed.
        """
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no calibration at {path}: fit one with python -m evaluation calibrate")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not a calibration file ({e}); refit it with python -m evaluation "
                             "calibrate") from e
        return cls.from_json(raw, str(path))

    @classmethod
    def from_json(cls, raw: dict, source: str) -> Calibration:
        """The calibration of :meth:`to_json`'s dict ``raw``, read from ``source`` (named by its errors).

        Raises:
            ValueError: as :meth:`load`.
        """
        coef, sources = _by_name(list(raw.get("features", ())), list(raw.get("coef", ())), source)
        term = raw.get("token_bias")
        try:
            bias = None if term is None else TokenBias(term["tokens"], term["bias"], term["tokenizer"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{source}: its token_bias is malformed ({e}); refit it with python -m evaluation "
                             "calibrate") from e
        return cls(coef, float(raw["intercept"]), float(raw["prior"]), raw.get("meta", {}), sources, bias)

    @classmethod
    def fit(cls, features: np.ndarray, accepted: np.ndarray, *, prior: float = 1.0, meta: dict | None = None,
            regularization: float = 1.0, sources: tuple[str, ...] = RETRIEVAL_SOURCES,
            tokens: np.ndarray | None = None, token_terms: int = 0, tokenizer: str | None = None) -> Calibration:
        """Fit the conditional model on nodes whose parent was accepted (needs the ``fit`` extra: scikit-learn).

        Args:
            features: ``[rows, len(FEATURES)]`` float64, from the core's node tables (:class:`NodeTable`); with the
                :data:`MODEL_FEATURES` after them (tables read with a next-state estimate), a with-model calibration.
            accepted: ``[rows]`` bool, the node's token was the target's choice.
            prior: the smoothing the features were computed with.
            regularization: scikit-learn's ``C`` (inverse L2 strength) on standardized features and on the token
                indicators.
            sources: the sources weighed; the other sources' features are left out of the fit (weight 0).
            tokens: ``[rows]`` int64, each node's token (needed with ``token_terms``).
            token_terms: fit a bias for the ``token_terms`` most frequent tokens of ``tokens`` (ties: the smaller
                id), fitted jointly with the weights (0: no token term).
            tokenizer: the fingerprint of the tokenizer of ``tokens`` (needed with ``token_terms``).

        Raises:
            ValueError: when the shapes differ, only one class is present, or ``token_terms`` is negative or lacks
                ``tokens`` or ``tokenizer``.
            ModuleNotFoundError: when scikit-learn is missing (the message names the extra).
        """
        require("sklearn", "fit", "fitting the calibration")
        from scipy import sparse
        from sklearn.linear_model import LogisticRegression
        from sklearn.preprocessing import StandardScaler

        features = np.asarray(features, dtype=np.float64)
        accepted = np.asarray(accepted, dtype=bool)
        width = features.shape[1] if features.ndim == 2 else -1
        if width not in (len(FEATURES), len(FEATURES) + len(MODEL_FEATURES)) or len(features) != len(accepted):
            raise ValueError(f"features {features.shape} and accepted {accepted.shape} do not match "
                             f"[rows, {len(FEATURES)}] (or [rows, {len(FEATURES) + len(MODEL_FEATURES)}] with the "
                             "model features) and [rows]")
        if accepted.all() or not accepted.any():
            raise ValueError("accepted holds one class only: replay more prompts")
        if token_terms < 0:
            raise ValueError(f"token_terms={token_terms}: must be >= 0")
        if token_terms and (tokens is None or not tokenizer):
            raise ValueError("token_terms needs each row's token (tokens) and the tokenizer's fingerprint (tokenizer)")
        used = np.array([name in set(features_of(tuple(sources))) for name in FEATURES]
                        + [True] * (width - len(FEATURES)))
        x = features[:, used]
        scaler = StandardScaler().fit(x)
        scale = np.where(scaler.scale_ > 0, scaler.scale_, 1.0)
        design = (x - scaler.mean_) / scale
        kept = np.zeros(0, dtype=np.int64)
        if token_terms:
            kept, onehot = _token_indicators(np.asarray(tokens, dtype=np.int64), accepted, token_terms)
            design = sparse.hstack([sparse.csr_matrix(design), onehot], format="csr")
        model = LogisticRegression(C=regularization, max_iter=4000).fit(design, accepted)
        coef = np.zeros(width)
        coef[used] = model.coef_[0][: int(used.sum())] / scale  # back to raw features
        intercept = float(model.intercept_[0] - (coef[used] * scaler.mean_).sum())
        bias = None
        if token_terms:
            bias = TokenBias(kept, model.coef_[0][int(used.sum()):], str(tokenizer))
        return cls(coef, intercept, prior, dict(meta or {}), tuple(sources), bias)

    def logits(self, features: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """``[rows]`` float64: each node's conditional logit under this calibration, from its features (``[rows,
        len(coef)]``) and tokens (``[rows]`` int64; the token term's bias where it has one)."""
        z = self.intercept + np.asarray(features, dtype=np.float64) @ self.coef
        if self.token_bias is not None:
            ids = self.token_bias.tokens
            at = np.minimum(np.searchsorted(ids, tokens), max(len(ids) - 1, 0))
            hit = ids[at] == tokens if len(ids) else np.zeros(len(tokens), dtype=bool)
            z[hit] += self.token_bias.bias[at[hit]]
        return z

    def with_model_terms(self, features: np.ndarray, accepted: np.ndarray, tokens: np.ndarray, *,
                         meta: dict | None = None) -> Calibration:
        """This calibration stacked with the model features (needs the ``fit`` extra): a logistic model of a node's
        acceptance given this calibration's logit and the :data:`MODEL_FEATURES`, fitted on nodes whose parent was
        accepted, folded back into one with-model calibration (this one's weights, intercept and token biases scaled
        by the logit's fitted weight, the model features' weights after them). What the features of the sources
        taught this calibration (the live layer's included) is kept; only how far to trust it beside the model is
        fitted.

        Args:
            features: ``[rows, len(FEATURES) + len(MODEL_FEATURES)]`` float64 (node tables read with a next-state
                estimate). accepted: ``[rows]`` bool. tokens: ``[rows]`` int64, each node's token.

        Raises:
            ValueError: for this calibration already weighing the model, other shapes, or one class only.
            ModuleNotFoundError: when scikit-learn is missing (the message names the extra).
        """
        require("sklearn", "fit", "fitting the calibration")
        from sklearn.linear_model import LogisticRegression

        features = np.asarray(features, dtype=np.float64)
        accepted = np.asarray(accepted, dtype=bool)
        if self.with_model:
            raise ValueError("this calibration weighs the model features already; stack the model on a plain one")
        if features.shape != (len(accepted), len(FEATURES) + len(MODEL_FEATURES)) or len(tokens) != len(accepted):
            raise ValueError(f"features {features.shape}, accepted {accepted.shape} and tokens {np.shape(tokens)} do "
                             f"not match [rows, {len(FEATURES) + len(MODEL_FEATURES)}], [rows] and [rows]")
        if accepted.all() or not accepted.any():
            raise ValueError("accepted holds one class only: replay more prompts")
        base = self.logits(features[:, :len(FEATURES)], np.asarray(tokens, dtype=np.int64))
        model = LogisticRegression(C=1.0, max_iter=2000).fit(np.column_stack([base, features[:, len(FEATURES):]]),
                                                              accepted)
        scale, terms = float(model.coef_[0][0]), model.coef_[0][1:]
        bias = None if self.token_bias is None else replace(self.token_bias, bias=self.token_bias.bias * scale)
        return replace(self, coef=np.concatenate([self.coef * scale, terms]),
                       intercept=float(self.intercept * scale + model.intercept_[0]),
                       meta={**self.meta, **(meta or {})}, token_bias=bias)


def _token_indicators(tokens: np.ndarray, accepted: np.ndarray, token_terms: int):
    """``(kept, onehot)``: the ``token_terms`` most frequent of ``tokens`` (``[rows]`` int64; ties: the smaller id),
    sorted, and the ``[rows, len(kept)]`` sparse indicator of each row's token among them."""
    from scipy import sparse

    if tokens.shape != accepted.shape:
        raise ValueError(f"tokens {tokens.shape} does not match accepted {accepted.shape}")
    ids, counts = np.unique(tokens, return_counts=True)
    kept = np.sort(ids[np.lexsort((ids, -counts))[:token_terms]])
    at = np.searchsorted(kept, tokens)
    hit = (at < len(kept)) & (kept[np.minimum(at, len(kept) - 1)] == tokens)
    onehot = sparse.csr_matrix((np.ones(int(hit.sum())), (np.flatnonzero(hit), at[hit])),
                               shape=(len(tokens), len(kept)))
    return kept, onehot
