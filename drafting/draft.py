"""The draft tree: the one type that flows from every drafter through verification and replay.

A draft hangs below the sequence's last committed token. Node ``i`` carries a token, its parent (``-1`` for a child of
the root, ``parents[i] < i``) and a score, whose meaning is recorded with it (:class:`ScoreKind`):

- ``probability``: the estimated probability of being accepted (:mod:`drafting.calibration`), so the sum over a draft is
  its expected accepted length;
- ``model``: a draft model's own probability of the node's path (not calibrated);
- ``count_ratio``: a source's ranking, the product of child/parent count ratios along the path (CREST §3,
  https://arxiv.org/abs/2408.04678; REST §3.2, https://arxiv.org/abs/2311.08252), which is no probability;
- ``none``: unscored (a copied chain, as prompt lookup drafts).

Scores never rise along a path, so the best nodes form a prefix-closed tree. A draft is immutable (read-only arrays) and
carries nodes only: what drafting cost is recorded by the drafter (:class:`drafting.step.ServiceStats`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cached_property
from typing import NamedTuple, TypeAlias, overload

import numpy as np

from crest_native import Curve, chain_cut, goodput_keep, tree_cut
from datastore.tree import TokenTree

__all__ = ["ChainDrafts", "CostCurve", "Draft", "Drafts", "ScoreKind"]


class ScoreKind(str, Enum):
    """What a draft's scores mean (see the module docstring)."""

    PROBABILITY = "probability"
    MODEL = "model"
    COUNT_RATIO = "count_ratio"
    NONE = "none"


def _frozen(a: np.ndarray, dtype) -> np.ndarray:
    out = np.asarray(a, dtype=dtype)
    if out is a:
        out = out.view()  # do not change the caller's own array's flags
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class Draft:
    """A draft tree ready for verification.

    Attributes:
        token_ids: ``[num_nodes]`` int64 draft tokens; siblings differ.
        parents: ``[num_nodes]`` int32 parent index, ``-1`` for a child of the root, ``parents[i] < i``.
        scores: ``[num_nodes]`` float64, non-increasing along every path; their meaning is ``score_kind``.
        score_kind: what the scores are (:class:`ScoreKind`).
        sources: ``[num_nodes]`` uint8, or ``None``: which sources' trees hold each node, bit ``k`` for
            ``crest_native.SOURCES[k]`` (``ds``, ``live``, ``local``, ``outputs``): the merged drafter's
            provenance of its nodes; ``None`` for a drafter that records none.

    Raises:
        ValueError: when the arrays differ in length.
    """

    token_ids: np.ndarray
    parents: np.ndarray
    scores: np.ndarray
    score_kind: ScoreKind = ScoreKind.NONE
    sources: np.ndarray | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", _frozen(self.token_ids, np.int64))
        object.__setattr__(self, "parents", _frozen(self.parents, np.int32))
        object.__setattr__(self, "scores", _frozen(self.scores, np.float64))
        object.__setattr__(self, "score_kind", ScoreKind(self.score_kind))
        if self.sources is not None:
            object.__setattr__(self, "sources", _frozen(self.sources, np.uint8))
        if not len(self.token_ids) == len(self.parents) == len(self.scores) == len(
                self.token_ids if self.sources is None else self.sources):
            raise ValueError(f"draft arrays differ in length: token_ids={len(self.token_ids)}, "
                             f"parents={len(self.parents)}, scores={len(self.scores)}"
                             + ("" if self.sources is None else f", sources={len(self.sources)}"))

    def _take(self, index: np.ndarray, parents: np.ndarray) -> Draft:
        """Nodes ``index`` of this draft (its cut), with ``parents``: their tokens, scores and sources."""
        return Draft(self.token_ids[index], parents, self.scores[index], self.score_kind,
                     None if self.sources is None else self.sources[index])

    def __len__(self) -> int:
        return len(self.token_ids)

    @cached_property
    def depths(self) -> np.ndarray:
        """``[num_nodes]`` int64 depth of each node; children of the root have depth 1."""
        out = np.ones(len(self.parents), dtype=np.int64)
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                out[i] = out[p] + 1
        return _frozen(out, np.int64)

    @cached_property
    def children(self) -> list[dict[int, int]]:
        """``children[q]`` maps token -> node for the children of query ``q``: ``q = 0`` is the root
        (the last committed token) and ``q = 1 + i`` is node ``i``; insertion order is node order."""
        kids: list[dict[int, int]] = [{} for _ in range(len(self.parents) + 1)]
        for i, (t, p) in enumerate(zip(self.token_ids.tolist(), self.parents.tolist())):
            kids[p + 1][t] = i
        return kids

    def _check_cut(self, min_score: float) -> None:
        if min_score > 0 and self.score_kind is not ScoreKind.PROBABILITY:
            raise ValueError(f"min_score={min_score} is a probability, and this draft's scores are "
                             f"{self.score_kind.value}: cut only calibrated drafts")

    def top(self, budget: int, min_score: float = 0.0) -> Draft:
        """The best ``budget`` nodes (score desc, depth asc, node order), each scoring at least ``min_score``
        (a probability), as a best-first, prefix-closed draft (the native core's tree cut).

        Raises:
            ValueError: when ``budget < 0``, or ``min_score > 0`` on scores that are not probabilities.
        """
        self._check_cut(min_score)
        order, parents = tree_cut(self.parents, self.scores, budget, min_score)
        return self._take(order, parents)

    def cut(self, budget: int, chain: bool) -> Draft:
        """What a verifier of ``budget`` nodes takes from this draft: :meth:`best_path` for a chain verifier
        (``chain``), else :meth:`top`."""
        return self.best_path(budget) if chain else self.top(budget)

    def best_path(self, max_len: int, min_score: float = 0.0) -> Draft:
        """The root path of at most ``max_len`` nodes, each scoring at least ``min_score`` (a probability),
        with the largest sum of scores, as a chain: what a chain verifier such as vLLM's takes from a tree
        (the native core's chain cut). With probabilities that sum is the chain's expected accepted length.

        Raises:
            ValueError: when ``max_len < 0``, or ``min_score > 0`` on scores that are not probabilities.
        """
        self._check_cut(min_score)
        path = chain_cut(self.parents, self.scores, max_len, min_score)
        return self._take(path, np.arange(-1, len(path) - 1, dtype=np.int32))

    @classmethod
    def empty(cls, score_kind: ScoreKind = ScoreKind.NONE) -> Draft:
        """No nodes: the step verifies only the last committed token (plain decoding)."""
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float64), score_kind)

    @classmethod
    def chain(cls, tokens: Sequence[int] | np.ndarray, scores: Sequence[float] | np.ndarray | None = None,
              score_kind: ScoreKind = ScoreKind.NONE) -> Draft:
        """A single path; ``scores`` default to 1.0 (unscored)."""
        k = len(tokens)
        return cls(np.asarray(tokens, dtype=np.int64).reshape(k), np.arange(-1, k - 1, dtype=np.int32),
                   np.ones(k) if scores is None else np.asarray(scores, dtype=np.float64), score_kind)

    @classmethod
    def from_tree(cls, tree: TokenTree, prior: float = 0.0) -> Draft:
        """A source's token tree ranked by its own counts (``count_ratio`` scores): each node gets the
        product of ``count(child) / (count(parent) + prior)`` along its path (with ``prior == 0`` this
        telescopes to ``count(node) / root_count``). Node order is the tree's.

        A positive ``prior`` shrinks ratios drawn from few occurrences (``2 / (2 + 2)`` instead of
        ``2 / 2``). When ``root_count`` is 0 (unknown), the sum of the root's children's counts stands in.

        Raises:
            ValueError: when ``prior < 0``.
        """
        if prior < 0:
            raise ValueError(f"prior={prior}: must be >= 0")
        counts = tree.counts.astype(np.float64)
        root = float(tree.root_count or counts[tree.parents < 0].sum())
        scores = np.zeros(len(counts), dtype=np.float64)
        for i, p in enumerate(tree.parents.tolist()):
            if p < 0:
                scores[i] = counts[i] / (root + prior) if root + prior > 0 else 0.0
            else:
                scores[i] = scores[p] * (counts[i] / (counts[p] + prior))  # ratio <= 1 first: never above the parent
        return cls(tree.token_ids.astype(np.int64), tree.parents.astype(np.int32), scores, ScoreKind.COUNT_RATIO)


CostCurve: TypeAlias = Curve
"""``T(N)``: an engine step's seconds verifying ``N`` tokens, as measured (:class:`drafting.cost.StepCostModel`),
``CostCurve(tokens, seconds, tail, draft_s=0.0)``: interpolated between points, flat below the first, ``tail`` seconds
per token past the last; plus ``draft_s`` once for a step that verifies any draft token (an engine's fixed work for
speculation, such as vLLM's rejection sampler, which runs only in a step with drafts). What a step's chains are cut to
(:func:`crest_native.goodput_keep`: the batch's draft tokens that maximise its expected tokens per second, SmartSpec's
goodput, https://arxiv.org/abs/2406.14066 §4). The native type (``crest_native.Curve``), checked when it is made.

Attributes:
    tokens: ``[points]`` float64, increasing (1..1024 points). seconds: ``[points]`` float64, >= 0, a step without
        drafts. tail: seconds per token past the last point, >= 0. draft_s: seconds a step pays once when it verifies
        any draft token, >= 0.

Raises:
    ValueError: for fewer than 1 or more than 1024 points, tokens that do not increase, a negative second, or a tail
        or draft_s that is negative or not finite.
"""


class ChainDrafts(NamedTuple):
    """A step's chains as an engine takes them (vLLM's ``draft_token_ids``), from one native call
    (:meth:`drafting.DraftingService.step`).

    Attributes:
        token_ids: ``[rows]`` lists of ints, each row's chain (``[]``: no draft).
        scores: ``[nodes]`` float64, read-only: each token's score (its chain's path probability up to it, for the
            merged drafter), row after row in chain order.
    """

    token_ids: list[list[int]]
    scores: np.ndarray

    @property
    def nodes(self) -> int:
        """Draft tokens in the whole step."""
        return len(self.scores)


class Drafts(Sequence[Draft]):
    """A batch's drafts in flat arrays, as one native call makes them: draft ``i`` holds nodes
    ``offsets[i]:offsets[i + 1]``. A sequence of :class:`Draft` (each made when it is asked for, as read-only views of
    the arrays), plus :meth:`token_lists` for an engine that takes plain token ids.

    Args:
        token_ids: ``[nodes]`` int64. parents: ``[nodes]`` int32 (each draft's own node indices). scores: ``[nodes]``
            float64. offsets: ``[drafts + 1]`` int64, from 0, non-decreasing. score_kind: what the scores are.
        sources: ``[nodes]`` uint8, or ``None``: each node's sources (:attr:`Draft.sources`).

    The arrays are made read-only, not copied: the caller hands them over.
    """

    __slots__ = ("_bounds", "parents", "score_kind", "scores", "sources", "token_ids")

    def __init__(self, token_ids: np.ndarray, parents: np.ndarray, scores: np.ndarray, offsets: np.ndarray,
                 score_kind: ScoreKind, sources: np.ndarray | None = None) -> None:
        for a in (token_ids, parents, scores) if sources is None else (token_ids, parents, scores, sources):
            a.setflags(write=False)
        self.token_ids, self.parents, self.scores, self.score_kind = token_ids, parents, scores, score_kind
        self.sources = sources
        self._bounds: list[int] = offsets.tolist()

    @classmethod
    def of(cls, drafts: Sequence[Draft], score_kind: ScoreKind) -> Drafts:
        """The batch of separately made drafts (copied into flat arrays)."""
        sizes = [len(d) for d in drafts]
        offsets = np.zeros(len(drafts) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])

        def cat(name: str, dtype) -> np.ndarray:
            return np.concatenate([getattr(d, name) for d in drafts]).astype(dtype) if drafts else np.zeros(0, dtype)

        known = bool(drafts) and all(d.sources is not None for d in drafts)
        return cls(cat("token_ids", np.int64), cat("parents", np.int32), cat("scores", np.float64), offsets,
                   score_kind, cat("sources", np.uint8) if known else None)

    def __len__(self) -> int:
        return len(self._bounds) - 1

    @overload
    def __getitem__(self, i: int) -> Draft: ...

    @overload
    def __getitem__(self, i: slice) -> list[Draft]: ...

    def __getitem__(self, i: int | slice) -> Draft | list[Draft]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"draft {i} of a batch of {len(self)}")
        s, e = self._bounds[i % len(self)], self._bounds[i % len(self) + 1]
        draft = object.__new__(Draft)  # views of read-only arrays: valid, read-only, not copied
        for name, value in (("token_ids", self.token_ids[s:e]), ("parents", self.parents[s:e]),
                            ("scores", self.scores[s:e]), ("score_kind", self.score_kind),
                            ("sources", None if self.sources is None else self.sources[s:e])):
            object.__setattr__(draft, name, value)
        return draft

    @property
    def nodes(self) -> int:
        """Draft nodes in the whole batch."""
        return self._bounds[-1]

    def token_lists(self) -> list[list[int]]:
        """Each draft's token ids as a list of ints (what vLLM's hook returns), from one conversion of the batch."""
        tokens, b = self.token_ids.tolist(), self._bounds
        return [tokens[s:e] for s, e in zip(b, b[1:])]

    def chains(self) -> ChainDrafts:
        """These drafts as an engine that verifies chains takes them (each draft a chain: its nodes in order)."""
        scores = self.scores.view()
        scores.flags.writeable = False
        return ChainDrafts(self.token_lists(), scores)

    def goodput(self, curve: CostCurve, rows: int) -> Drafts:
        """These chains cut to the batch's draft tokens that maximise its expected tokens per second on ``curve`` with
        ``rows`` rows decoding (:func:`crest_native.goodput_keep`; a chain's kept tokens are a prefix of it).

        Raises:
            ValueError: for a malformed curve or ``rows < 1``.
        """
        keep = np.zeros(self.nodes + 1, np.int64)
        np.cumsum(goodput_keep(self.scores, rows, curve), out=keep[1:])
        b = np.asarray(self._bounds, np.int64)
        counts = keep[b[1:]] - keep[b[:-1]]
        kept = np.zeros(len(self) + 1, np.int64)
        np.cumsum(counts, out=kept[1:])
        index = np.repeat(b[:-1] - kept[:-1], counts) + np.arange(kept[-1])  # each chain's first kept nodes
        return Drafts(self.token_ids[index], self.parents[index], self.scores[index], kept, self.score_kind,
                      None if self.sources is None else self.sources[index])
