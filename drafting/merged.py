"""The merged drafter's method: each row's draft from the union of its sources, every node scored by its calibrated
acceptance probability, in the native core (``csrc/core.hpp``).

The sources: the datastore's tree of the context's longest stored n-gram (CREST §3,
https://arxiv.org/abs/2408.04678; for trees of at least ``back_off_min_budget`` nodes, every stored suffix's, the one
whose draft has the largest expected accepted length winning), the live layer's (every process's earlier outputs,
compacted: :mod:`datastore.live`), the request's own longest earlier match (its suffix automaton) and the match in this
process's finished outputs (SuffixDecoding's two trees, https://arxiv.org/abs/2411.04975, §3), and, given a
:class:`drafting.heads.HeadSource`, a draft model's tree (S4C's heads). A tree is cut to the budget, a chain (what
vLLM verifies) is the path with the largest expected accepted length; both stop at nodes scoring below the cut.

Where the datastore's trees come from is the step's :class:`Retrieval` strategy, chosen each step:

- the host-local replicas (:mod:`datastore.replica`) once they are ready: ONE native call drafts the whole batch,
  probing them with each request's own last tokens, with the GIL released and nothing crossing back to Python but
  the drafts;
- otherwise the round trip: the core says what each row needs (its last tokens, whether it backs off), one query
  fetches it (:meth:`datastore.lookup.LookupClient.retrieve_batch`, most answered by the client's cache) and the core
  drafts from the trees given. A replica found damaged mid-step is dropped (one warning, written again in the
  background) and the step is drafted by the round trip: the two give the same drafts, bit for bit.

Every datastore fault drafts from the other sources (:class:`drafting.source.DatastoreSource`): output never changes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from crest_native import DEFAULTS
from datastore.cache import CACHE_BYTES
from datastore.tree import Match
from toolkit.forks import at_fork

from .calibration import HEADS_PATH, RETRIEVAL_SOURCES, Calibration, NodeTable
from .draft import ChainDrafts, Drafts, ScoreKind
from .heads import HeadSource, HeadTree
from .method import CoreSettings, Follow, FollowedStep, Step
from .source import DatastoreSource

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from .door import RequestId
    from .service import DraftingService

__all__ = ["MergeStats", "MergedMethod", "OutputSink", "native_tree"]

TAIL_TOKENS = 32
"""Trailing tokens of each row a round trip looks up (keys hold at most 31 tokens; CREST's at most 5)."""


class OutputSink(Protocol):
    """Where the merged drafter hands each finished request's output: the live layer's writer
    (:class:`datastore.admin.live_writer.LiveWriter`, which an application makes and passes in)."""

    def append(self, tokens: Sequence[int]) -> bool:
        """Take one output's token ids (enqueued: the step never waits); whether it was taken."""

    def close(self) -> None:
        """Flush what is pending and stop."""


class Closeable(Protocol):
    """Background work the method owns and stops with itself: the live layer's compactor
    (:class:`drafting.compaction.LiveCompactor`, which an application makes and passes in)."""

    def close(self) -> None:
        """Stop (work in flight is abandoned safely)."""


def native_tree(m: Match | None) -> tuple | None:
    """A retrieved match as the native core reads a source tree: ``(ngram_len, token_ids uint32, parents int32,
    counts uint32, root_count)``."""
    if m is None:
        return None
    t = m.tree
    return (len(m.ngram), t.token_ids, t.parents, t.counts, t.root_count)


@dataclass
class MergeStats:
    """Cumulative figures of the merged method's steps (seconds are wall-clock).

    Attributes:
        replica_steps: steps drafted from the replicas (one native call). round_trip_steps: steps drafted by the round
            trip. damaged: replicas found damaged mid-step.
        lookup_s: the round trips' seconds (their queries, or their cache). core_s: the native calls'.
        heads_s: the draft heads'. backed_off: drafts whose chosen datastore n-gram was shorter than the longest stored.
        stopped_meanwhile: rows whose request was stopped while their lookups ran (an empty draft each).
    """

    replica_steps: int = 0
    round_trip_steps: int = 0
    damaged: int = 0
    lookup_s: float = 0.0
    core_s: float = 0.0
    backed_off: int = 0
    stopped_meanwhile: int = 0


class MergedMethod:
    """The merged drafter's method (see the module docstring); a :class:`drafting.DraftingService` drafts with it.

    Args:
        lookups: the datastore's fault-tolerant lookups, its live layer included when its client was opened with one
            (``None``: drafts from the other sources only).
        vocab_size: the datastore's vocabulary (``len(tokenizer)``): a round trip asks only for keys of ids below it
            (default: the lookups', else every 32-bit id).
        calibration: the node scorer (default: the shipped parameters, :meth:`Calibration.load`; with ``heads``, the
            parameters fitted with them, :data:`drafting.calibration.HEADS_PATH`).
        sources: the sources drafted from, of ``crest_native.SOURCES`` (default the retrieval sources: ``ds``,
            ``live``, ``local``, ``outputs``; ``heads`` is added with ``heads``).
        min_score: a probability in [0, 1]: one node's verification cost in accepted tokens. Trees keep only nodes
            whose acceptance probability is at least this and chains stop before the first node below it (0: fill
            the budget); a step may pass its own.
        outputs_bytes: the bound of this process's index of finished outputs, bytes (0: off; ``None``: the core's
            default, :data:`crest_native.DEFAULTS`).
        back_off_min_budget: trees of at least this many nodes choose the datastore n-gram among ALL stored suffixes
            of the context (``None``: the core's default, chosen on the calibration's fit half).
        max_tokens: an engine's context length (vLLM's ``max_model_len``): each request's draft is cut to what fits
            beside its tokens and the bonus token (its tokens + draft + 1 <= ``max_tokens``), in the native core, so a
            step's budgets need not be (0: no bound).
        heads: a draft model's trees as one more source (S4C's heads: :class:`s4c.HeadsSource`).
        live_writer: each finished request's output is handed to it (enqueued; written on its own thread).
        compactor: keeps the live layer compacted on its own (:class:`drafting.compaction.LiveCompactor`); closed with
            the method.

    Raises:
        ValueError: when ``min_score`` is not a probability, a source is unknown or not weighed by the calibration,
            or ``max_tokens < 0``.
        FileNotFoundError: when the heads' calibration is missing (fit it: ``benchmarks/calibrate.py --heads``).
    """

    score_kind = ScoreKind.PROBABILITY
    cuts_to_curve = True  # in the native call, each request's scores discounted by the engine's verdicts

    def __init__(self, lookups: DatastoreSource | None = None, *, vocab_size: int | None = None,
                 calibration: Calibration | None = None, sources: tuple[str, ...] = RETRIEVAL_SOURCES,
                 min_score: float = 0.0, outputs_bytes: int | None = None, back_off_min_budget: int | None = None,
                 max_tokens: int = 0, heads: HeadSource | None = None, live_writer: OutputSink | None = None,
                 compactor: Closeable | None = None) -> None:
        from . import door

        self.min_score = door.min_score(min_score)
        self.name = "merged" if heads is None else f"merged+{heads.name}"
        self.heads = heads
        self.hidden_states = heads is not None
        if heads is not None:
            sources = tuple(dict.fromkeys((*sources, "heads")))
        self.calibration = calibration or (Calibration.load(HEADS_PATH) if heads is not None else Calibration.load())
        self.sources = tuple(sources)
        unweighed = [s for s in self.sources if s not in self.calibration.sources]
        if unweighed:
            raise ValueError(f"sources {unweighed} are not weighed by the calibration (it weighs "
                             f"{self.calibration.sources}); load one fitted with them, e.g. "
                             f"Calibration.load({str(HEADS_PATH)!r})")
        options: dict[str, Any] = {"local_depth": self.calibration.local_depth, "sources": list(self.sources)}
        if outputs_bytes is not None:
            options["outputs_bytes"] = outputs_bytes
        if back_off_min_budget is not None:
            options["back_off_min_budget"] = back_off_min_budget
        if max_tokens:
            options["max_tokens"] = max_tokens
        self._settings = CoreSettings.of(self.calibration, options)
        self._settings.core()  # refuses bad settings now, naming them
        self.lookups, self.live_writer, self.compactor = lookups, live_writer, compactor
        self.key_vocab = vocab_size or (lookups.vocab_size if lookups is not None else None) or 1 << 32
        self.stats = MergeStats()
        self._stats_lock = threading.Lock()
        at_fork(self, after_in_child=MergedMethod._forked)

    def _forked(self) -> None:
        """In a forked child: a fresh lock for the stats (another thread of the parent may have held it)."""
        self._stats_lock = threading.Lock()

    @classmethod
    def open(cls, datastore: str, *, tokenizer, database_url: str | None = None, live: bool = True,
             cache_bytes: int = CACHE_BYTES, replicas: bool = True, calibration: Calibration | None = None,
             min_score: float = 0.0, outputs_bytes: int | None = None, max_tokens: int = 0,
             live_writer: OutputSink | None = None, compactor: Closeable | None = None,
             reopen_in_background: bool = True) -> MergedMethod:
        """The merged method over datastore ``datastore``, its lookups composed in one place (what an engine's proposer
        uses; ``DraftingService(method, vocab_size=len(tokenizer))`` drafts with it).

        Args:
            datastore: the datastore name. tokenizer: the target's tokenizer (checked against the build's, and
                against the calibration's token term: a term fitted for another tokenizer is dropped, with a warning).
            database_url: libpq URL (default ``DATABASE_URL`` or the embedded server).
            live: also draft from the live layer ``<datastore>.live`` (once ``python -m ingest compact-live`` has
                built it), read with the datastore.
            cache_bytes: the round trip's tree cache bound, bytes.
            replicas: read host-local replicas of the builds (:mod:`datastore.replica`, ``CREST_REPLICAS``) once they
                are ready; ``False``: every step is a round trip.
            calibration / min_score / outputs_bytes / max_tokens / live_writer / compactor: as the constructor
                (``live_writer``: a :class:`datastore.admin.live_writer.LiveWriter` the caller made; ``compactor``: an
                :class:`drafting.compaction.LiveCompactor`).
            reopen_in_background: a failed datastore is reopened on a background thread, so no step ever waits for a
                connection attempt (an engine's step must not stall while the server is down).

        Raises:
            ValueError: as the constructor.
        """
        from datastore.live import live_name
        from datastore.shared import SharedDatastore
        from toolkit.tokenizer import tokenizer_fingerprint

        layer = live_name(datastore) if live else None
        fingerprint = tokenizer_fingerprint(tokenizer)  # once: it serializes the whole tokenizer (0.5 s here)
        calibration = calibration or Calibration.load()
        mine = calibration.for_tokenizer(fingerprint)
        if mine is not calibration:
            log.warning("the calibration's token term was fitted for another tokenizer: drafting without it (fit one "
                        "for yours with benchmarks/calibrate.py)")
        lookups = DatastoreSource(lambda: SharedDatastore.open(
            datastore, fingerprint=fingerprint, database_url=database_url, cache_bytes=cache_bytes, live=layer,
            replicas=replicas), reopen_in_background=reopen_in_background)
        return cls(lookups, vocab_size=len(tokenizer), calibration=mine, min_score=min_score,
                   outputs_bytes=outputs_bytes, max_tokens=max_tokens, live_writer=live_writer, compactor=compactor)

    def core_settings(self) -> CoreSettings:
        """The calibration and the core's settings."""
        return self._settings

    def node_tables(self, service: DraftingService, req_id: RequestId, candidates: Sequence[Match],
                    live: Match | None, heads: HeadTree | None = None) -> list[NodeTable]:
        """The merged node table of each datastore candidate (or of none) of request ``req_id``, active in ``service``
        (which drafts with this method), with its features and scores exactly as this method's step merges them: what
        fitting the calibration reads (``benchmarks/calibrate.py``; CREST, the calibrated acceptance probability).

        Raises:
            ValueError: when ``service`` drafts with another method. KeyError: when ``req_id`` is not active.
        """
        if service.method is not self:
            raise ValueError(f"the service drafts with {service.method.name!r}, not this merged method: pass the "
                             "DraftingService made with this method")
        stored, layer = [native_tree(m) for m in candidates], native_tree(live)
        native_heads = None if heads is None or not len(heads) else heads.native()
        tables = service.read_request(req_id, lambda core, handle: core.tables(handle, stored, layer, native_heads))
        return [NodeTable(*t) for t in tables]

    # -- per request ----------------------------------------------------------------------------------------------

    def start(self, prompt: np.ndarray) -> Any:
        """The heads' state (``None`` without heads: everything else is in the core)."""
        return None if self.heads is None else self.heads.start()

    def extend(self, state: Any, tokens: np.ndarray) -> None:
        """Nothing: the core holds the tokens (the heads read them from it)."""

    def add_hidden_states(self, state: Any, hidden: Any) -> None:
        """Feed the heads (see :class:`drafting.heads.HeadSource`)."""
        assert self.heads is not None  # the service calls this only when hidden_states is true
        self.heads.add_hidden_states(state, hidden)

    def stopped(self, state: Any, output: np.ndarray) -> None:
        """Hand a finished request's output to the live layer's writer, when there is one."""
        if self.live_writer is not None and len(output):
            self.live_writer.append(output.tolist())

    # -- the step -------------------------------------------------------------------------------------------------

    def draft(self, step: Step) -> Drafts:
        """Each row's draft: from the replicas in one native call when they are ready, else by the round trip."""
        cut = self.min_score if step.min_score is None else step.min_score
        heads = self._heads(step)
        stores = self.lookups.stores() if self.lookups is not None else None
        made, damaged = None, -1
        if stores is not None:
            start = time.perf_counter()
            with step.lock:
                made, damaged = step.core.draft_stored(step.handles, step.budgets, stores.datastore, stores.live,
                                                          heads, step.chain, cut, step.curve, stores.delta)
            self._replica_step(start, stores, damaged, 0)
        return self._drafts(step, heads, cut, None if damaged >= 0 else made)

    def draft_following(self, step: Step, follow: Follow) -> FollowedStep | None:
        """The engine's rows followed and their chains drafted from the replicas in one native call
        (``Core.follow_draft_stored``, which checks the rows, their counts and the budgets before anything changes);
        ``None`` before the replicas are ready, or with draft heads (the service follows, then drafts). A replica found
        damaged drafts the step by the round trip."""
        stores = self.lookups.stores() if self.lookups is not None else None
        if stores is None or self.heads is not None:
            return None
        cut = self.min_score if step.min_score is None else step.min_score
        start = time.perf_counter()
        with step.lock:
            followed, bad, bad_id, made, damaged = step.core.follow_draft_stored(
                step.handles, follow.rows, follow.at, follow.lengths, follow.limit, step.budgets, stores.datastore,
                stores.live, cut, step.curve, stores.delta)
        if made is None:  # a pair did not follow, or an id was refused: nothing drafted
            return followed, bad, bad_id, None
        if damaged >= 0:
            self._replica_step(start, stores, damaged, 0)
            return followed, -1, 0, self._drafts(step, None, cut, None).chains()
        lists, scores, backed_off = made  # scores: read-only already (a flag set here costs microseconds)
        self._replica_step(start, stores, damaged, backed_off)
        return followed, -1, 0, ChainDrafts(lists, scores)

    def _replica_step(self, start: float, stores, damaged: int, backed_off: int) -> None:
        """Count a step drafted from the replicas (``damaged``: the replica found damaged, -1: none; ``backed_off``:
        its rows drafted from a shorter datastore n-gram than the longest stored), and drop a damaged replica (it is
        written again)."""
        with self._stats_lock:
            self.stats.core_s += time.perf_counter() - start
            self.stats.backed_off += backed_off
            if damaged < 0:
                self.stats.replica_steps += 1
            else:
                self.stats.damaged += 1
        if damaged >= 0:
            assert self.lookups is not None
            self.lookups.replica_damaged(stores[damaged])

    def _drafts(self, step: Step, heads: list | None, cut: float, made: tuple | None) -> Drafts:
        """The step's drafts from the native call's arrays (``None``: drafted by the round trip instead)."""
        if made is None:
            made = self._round_trip(step, heads, cut)
        tokens, parents, scores, offsets, chosen, sources = made
        with self._stats_lock:
            self.stats.backed_off += sum(c > 0 for c in chosen.tolist())  # a numpy reduction costs microseconds
        return Drafts(tokens, parents, scores, offsets, self.score_kind, sources)

    def _round_trip(self, step: Step, heads: list | None, cut: float) -> tuple:
        """The step's lookups fetched in one query, then drafted from in one native call."""
        start = time.perf_counter()
        with step.lock:
            back_off, tails = step.core.plan(step.handles, step.budgets, step.chain, TAIL_TOKENS, self.key_vocab)
        asked = [i for i, tail in enumerate(tails) if tail]
        rows = len(tails)
        stored: list[list] = [[] for _ in range(rows)]
        live: list = [None] * rows
        delta: list = [None] * rows
        if self.lookups is not None and asked:
            found = self.lookups.retrieve_batch([tails[i] for i in asked], [bool(back_off[i]) for i in asked])
            for i, got in zip(asked, found):
                stored[i] = [native_tree(m) for m in got.candidates]
                live[i], delta[i] = native_tree(got.live), native_tree(got.delta)
        looked = time.perf_counter()
        with step.lock:
            gone = step.core.inactive(step.handles[asked])
            made = step.core.draft_given(step.handles, step.budgets, stored, live, heads, step.chain, cut, step.curve,
                                         delta)
        with self._stats_lock:
            st = self.stats
            st.round_trip_steps += 1
            st.stopped_meanwhile += gone
            st.lookup_s += looked - start
            st.core_s += time.perf_counter() - looked
        return made

    def _heads(self, step: Step) -> list | None:
        """Each row's heads tree as the core reads it (``None`` for all: no heads)."""
        if self.heads is None:
            return None
        return [None if t is None or not len(t) else t.native() for t in self.heads.trees(step)]

    # -- the rest -------------------------------------------------------------------------------------------------

    def step_seconds(self) -> dict[str, float]:
        """Seconds spent so far, by part of the step: ``lookup`` (the round trips), ``merge`` (the native core's calls,
        the replicas' probes included) and the heads' (``heads``)."""
        with self._stats_lock:
            out = {"lookup": self.stats.lookup_s, "merge": self.stats.core_s}
        return out | (self.heads.step_seconds() if self.heads is not None else {})

    def config(self) -> dict:
        """Everything that changes the drafts: the scorer, the sources and the core's settings, the cut, the heads and
        what the lookups serve."""
        core = {k: v for k, v in (DEFAULTS | self._settings.options).items() if k != "sources"}
        return {"name": self.name, "calibration": self.calibration.digest(), "sources": list(self.sources),
                "core": core, "min_score": self.min_score,
                "heads": None if self.heads is None else self.heads.config(),
                "source": None if self.lookups is None else self.lookups.identity()}

    def close(self) -> None:
        """Stop the compactor; close the lookups and the live layer's writer."""
        if self.compactor is not None:
            self.compactor.close()
        if self.lookups is not None:
            self.lookups.close()
        if self.live_writer is not None:
            self.live_writer.close()
