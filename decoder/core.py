"""The drafting core: the per-request and per-step work of the merged drafter after the datastore's round trip.

:class:`decoder.service.DraftingService` owns the lifecycle, the lookups and the figures; a core owns what is
computed from them: each request's index of its own tokens (:mod:`decoder.local`), this process's index of
finished outputs (:mod:`decoder.output_index`), and each step's merge of every source's tree into one node
table scored by the calibration (:mod:`decoder.calibration`), cut to a tree or the best chain under the budget.

Two cores compute the same drafts, bit for bit (``tests/test_native.py``):

- :class:`NativeCore` (the default): the C++ core of ``crest_native`` (nanobind), one call a step for the batch;
- :class:`PythonCore`: the reference, written with the tree operations of :mod:`decoder.treeops`; it also takes
  any local strategy (the N-gram trie included), the native core only suffix automata.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from datastore.tree import Match, TokenTree

from .calibration import Calibration, TreeColumns, draft_from_candidates
from .draft import Draft, ScoreKind
from .local import LocalIndex, LocalStrategy, SuffixMatching
from .output_index import CONTEXT_TOKENS, OutputIndex

__all__ = ["DraftCore", "PythonCore", "NativeCore", "default_core", "MATCH_NODES", "OUTPUTS_BYTES", "LOOKUP_TOKENS"]

log = logging.getLogger(__name__)

MATCH_NODES = 64
"""Nodes of the local and output matches (at least the budget): the calibration was fitted on matches this size."""
OUTPUTS_BYTES = 64 << 20
"""Default bound of the process-wide output index, bytes."""
LOOKUP_TOKENS = 16
"""Trailing tokens of a request handed to the datastore lookups (CREST keys are at most 5 tokens, 8 are checked)."""
_COLUMNS_KEPT = 8192  # hot datastore trees whose calibration columns (and children maps) are kept


H = TypeVar("H")


class DraftCore(Protocol[H]):
    """What :class:`decoder.service.DraftingService` needs from a core. Handles (``H``) are the core's own."""

    calibration: Calibration

    def start(self, prompt_ids: list[int]) -> H:
        """Index a new request's prompt; returns its handle."""

    def extend(self, handle: H, tokens: list[int]) -> None:
        """Append a request's committed tokens."""

    def stop(self, handle: H) -> list[int]:
        """Forget a request; its output (tokens committed since :meth:`start`) goes into the output index and is
        returned (for the live layer's writer)."""

    def context(self, handle: H) -> list[int]:
        """The request's last :data:`LOOKUP_TOKENS` tokens (what the datastore lookups read)."""

    def draft(self, handles: Sequence[H], budgets: Sequence[int], stored: Sequence[Sequence[Match]],
              live: Sequence[Match | None], chain: bool, min_score: float,
              lookup_s: float = 0.0) -> list[tuple[Draft, int]]:
        """One ``(draft, chosen candidate)`` per request (budgets >= 1): see :meth:`PythonCore.draft`."""

    def outputs_info(self) -> dict:
        """The output index's figures: ``outputs``, ``bytes`` (its size model, what ``max_bytes`` bounds),
        ``max_bytes``, ``evictions`` (the native core adds ``allocated``: what its arrays hold allocated)."""

    def config(self) -> dict:
        """JSON-ready description of everything that changes the drafts."""


def _check_local(calibration: Calibration, local: LocalStrategy | None) -> LocalStrategy:
    fitted = calibration.local_strategy()
    if local is None:
        return fitted
    if local.config() != fitted.config():
        raise ValueError(f"local source {local.config()}: the calibration was fitted with {fitted.config()}; fit "
                         "one for this source (benchmarks/calibrate.py --local ...) or leave `local` unset")
    return local


@dataclass
class _Request:
    local: LocalIndex
    tokens: list[int]  # the prompt, then the committed tokens
    prompt_len: int


class PythonCore:
    """The reference core, in Python (numpy for the arrays).

    Args:
        calibration: the node scorer (default: the shipped parameters).
        local: how requests index their own tokens (default: the strategy the calibration was fitted with).
        outputs_bytes: the process-wide output index's bound, bytes (0: no output index).
        outputs_depth: its deepest continuation node, 1..64.

    Raises:
        ValueError: when an argument is out of range, or ``local`` is not the calibration's strategy.
    """

    def __init__(self, calibration: Calibration | None = None, local: LocalStrategy | None = None,
                 outputs_bytes: int = OUTPUTS_BYTES, outputs_depth: int = 16) -> None:
        self.calibration = calibration if calibration is not None else Calibration.load()
        self.local = _check_local(self.calibration, local)
        self.outputs = OutputIndex(outputs_bytes, outputs_depth)
        self._columns_kept: OrderedDict[int, tuple[TokenTree, TreeColumns]] = OrderedDict()

    def _columns(self, tree: TokenTree) -> TreeColumns:
        """A reused tree's calibration columns, computed once while it stays hot: the shared datastore's
        cache hands back the same tree object for the same n-gram."""
        entry = self._columns_kept.get(id(tree))
        if entry is not None and entry[0] is tree:
            self._columns_kept.move_to_end(id(tree))
            return entry[1]
        cols = self.calibration.columns(tree)
        self._columns_kept[id(tree)] = (tree, cols)
        if len(self._columns_kept) > _COLUMNS_KEPT:
            self._columns_kept.popitem(last=False)
        return cols

    def start(self, prompt_ids: list[int]) -> _Request:
        """Index a new request's prompt; the handle is its state."""
        local = self.local.new()
        local.extend(prompt_ids)
        return _Request(local, list(prompt_ids), len(prompt_ids))

    def extend(self, handle: _Request, tokens: list[int]) -> None:
        """Append committed tokens."""
        handle.local.extend(tokens)
        handle.tokens += tokens

    def stop(self, handle: _Request) -> list[int]:
        """The request's output, now in the output index."""
        output = handle.tokens[handle.prompt_len:]
        self.outputs.add(output)
        return output

    def context(self, handle: _Request) -> list[int]:
        """The last :data:`LOOKUP_TOKENS` tokens."""
        return handle.tokens[-LOOKUP_TOKENS:]

    def draft(self, handles: Sequence[_Request], budgets: Sequence[int], stored: Sequence[Sequence[Match]],
              live: Sequence[Match | None], chain: bool, min_score: float,
              lookup_s: float = 0.0) -> list[tuple[Draft, int]]:
        """Per request, the calibrated draft over the datastore's candidates (``stored``: longest first, one
        when not backing off), the live layer's match, the request's own match and the output index's match.

        Args:
            handles / budgets (>= 1) / stored / live: per request. chain: best paths instead of trees.
            min_score: the cut, a probability. lookup_s: the step's lookup seconds, recorded in each draft.

        Returns:
            ``(draft, chosen)`` per request: ``chosen`` is the index of the datastore candidate used (-1: none).
        """
        out = []
        for req, budget, cands, live_match in zip(handles, budgets, stored, live):
            t0 = time.perf_counter()
            nodes = max(budget, MATCH_NODES)
            others = {"live": live_match, "local": req.local.match(nodes),
                      "outputs": self.outputs.match(req.tokens[-CONTEXT_TOKENS:], nodes)}
            t1 = time.perf_counter()
            draft, chosen = draft_from_candidates(self.calibration, cands, others, budget, chain=chain,
                                                  min_score=min_score, columns=self._columns)
            out.append((draft.with_timing(lookup_s=lookup_s, trie_s=t1 - t0, merge_s=time.perf_counter() - t1), chosen))
        return out

    def outputs_info(self) -> dict:
        """The output index's figures."""
        o = self.outputs
        return {"outputs": o.num_outputs, "bytes": o.nbytes, "max_bytes": o.max_bytes, "evictions": o.evictions}

    def config(self) -> dict:
        """The local source, the scorer and the output index's settings."""
        return {"local": self.local.config(), "calibration": self.calibration.digest(),
                "outputs": {"max_bytes": self.outputs.max_bytes, "max_depth": self.outputs.max_depth}}


class NativeCore:
    """The C++ core (``crest_native``): the same drafts as :class:`PythonCore`, one native call a step.

    Args:
        calibration: the node scorer (default: the shipped parameters).
        local: a :class:`decoder.local.SuffixMatching` (default: the calibration's strategy).
        outputs_bytes / outputs_depth: as for :class:`PythonCore`.

    Raises:
        ValueError: when an argument is out of range, or ``local`` is not the calibration's strategy or not
            suffix matching (use :class:`PythonCore` for the trie).
        ImportError: when the native extension is not built (``pip install .`` builds it).
    """

    def __init__(self, calibration: Calibration | None = None, local: LocalStrategy | None = None,
                 outputs_bytes: int = OUTPUTS_BYTES, outputs_depth: int = 16) -> None:
        from crest_native import Core

        self.calibration = calibration if calibration is not None else Calibration.load()
        self.local = _check_local(self.calibration, local)
        if not isinstance(self.local, SuffixMatching):
            raise ValueError(f"local source {self.local.config()}: the native core indexes requests with suffix "
                             "automata only; use decoder.core.PythonCore for the trie")
        if outputs_bytes < 0 or not 1 <= outputs_depth <= 64:
            raise ValueError(f"outputs_bytes={outputs_bytes} must be >= 0 and outputs_depth={outputs_depth} in 1..64")
        cal = self.calibration
        self._core = Core(np.asarray(cal.coef, dtype=np.float64), float(cal.intercept), float(cal.prior),
                          self.local.max_depth, MATCH_NODES, int(outputs_bytes), int(outputs_depth), CONTEXT_TOKENS)
        self.outputs_bytes, self.outputs_depth = int(outputs_bytes), int(outputs_depth)

    def start(self, prompt_ids: list[int]) -> int:
        """Index a new request's prompt; the handle is the core's request number."""
        return self._core.start(np.asarray(prompt_ids, dtype=np.int64))

    def extend(self, handle: int, tokens: list[int]) -> None:
        """Append committed tokens."""
        self._core.extend(handle, np.asarray(tokens, dtype=np.int64))

    def stop(self, handle: int) -> list[int]:
        """The request's output, now in the output index."""
        return self._core.stop(handle).tolist()

    def context(self, handle: int) -> list[int]:
        """The last :data:`LOOKUP_TOKENS` tokens."""
        return self._core.context(handle, LOOKUP_TOKENS).tolist()

    def draft(self, handles: Sequence[int], budgets: Sequence[int], stored: Sequence[Sequence[Match]],
              live: Sequence[Match | None], chain: bool, min_score: float,
              lookup_s: float = 0.0) -> list[tuple[Draft, int]]:
        """As :meth:`PythonCore.draft`."""
        def tree(m: Match | None) -> tuple | None:
            if m is None:
                return None
            t = m.tree
            return (len(m.ngram), t.token_ids, t.parents, t.counts, t.root_count)

        tokens, parents, scores, offsets, chosen, local_s, merge_s = self._core.draft(
            np.asarray(handles, dtype=np.int64), np.asarray(budgets, dtype=np.int64),
            [[tree(m) for m in cands] for cands in stored], [tree(m) for m in live], chain, float(min_score))
        bounds, local_t, merge_t = offsets.tolist(), local_s.tolist(), merge_s.tolist()
        return [(Draft.trusted(tokens[s:e], parents[s:e], scores[s:e], ScoreKind.PROBABILITY, lookup_s, lt, mt), c)
                for s, e, c, lt, mt in zip(bounds, bounds[1:], chosen.tolist(), local_t, merge_t)]

    def outputs_info(self) -> dict:
        """The output index's figures."""
        return dict(self._core.outputs_info())

    def config(self) -> dict:
        """The same description as :meth:`PythonCore.config`."""
        return {"local": self.local.config(), "calibration": self.calibration.digest(),
                "outputs": {"max_bytes": self.outputs_bytes, "max_depth": self.outputs_depth}}


def default_core(calibration: Calibration | None = None, outputs_bytes: int = OUTPUTS_BYTES) -> DraftCore[Any]:
    """The native core with the calibration's local strategy, or the Python reference when the calibration was
    fitted with another strategy (the N-gram trie) or the extension is not built (logged once, at INFO)."""
    cal = calibration if calibration is not None else Calibration.load()
    if isinstance(cal.local_strategy(), SuffixMatching):
        try:
            return NativeCore(cal, outputs_bytes=outputs_bytes)
        except ImportError as exc:
            log.info("the native drafting core is not built (%s); drafting with the Python reference", exc)
    return PythonCore(cal, outputs_bytes=outputs_bytes)

