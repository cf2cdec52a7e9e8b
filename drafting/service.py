"""The merged drafter as a service: many requests, one shared datastore, one round trip per proposal step.

Shaped after ArcticInference's suffix decoding (a request-keyed lifecycle,
https://github.com/snowflakedb/ArcticInference, ``arctic_inference/suffix_decoding``)
and vLLM's batch-first proposers (``vllm/v1/spec_decode``):

- :meth:`DraftingService.start_request` indexes the request's own tokens in the native core (a suffix automaton:
  contexts of any length);
- :meth:`DraftingService.propose` drafts for a whole batch of rows ``(req_id, context, budget)``: one round trip
  for every row (the datastore's trees and its live layer's, :meth:`datastore.lookup.LookupClient.retrieve_batch`;
  the cache of :class:`datastore.SharedDatastore` answers the hot n-grams without one), then one call of the native
  core: per request the union of the datastore's tree, the live layer's (every process's earlier outputs), the
  request's own match and the match in this process's finished outputs, every node scored by its calibrated
  acceptance probability (:mod:`drafting.calibration`), as a tree under the budget or, for chain verifiers such as
  vLLM's, as the path with the largest expected accepted length; for large trees the datastore n-gram is chosen
  among all stored suffixes (back-off);
- :meth:`DraftingService.add_tokens` and :meth:`DraftingService.stop_request` (the output then joins this process's
  output index, and the live layer's writer when there is one).

The same object drafts for the HF decoding loop (:func:`decoder.speculative_generate`), the replay simulator, the
benchmarks and the vLLM proposer. Every datastore fault falls back to drafts from the other sources
(:class:`drafting.DatastoreSource`), so the output never changes.

Thread-safe: the native core holds the only request table and every call on it runs under one lock; the round trip
runs outside it. A request stopped while another thread drafts for it gets an empty draft for its row.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from crest_native import Core
from datastore.context import TokenIds
from datastore.lookup import Retrieval
from datastore.tree import Match

from .calibration import HEADS_PATH, RETRIEVAL_SOURCES, Calibration, NodeTable
from .draft import Draft, ScoreKind
from .heads import HeadTree
from .lifecycle import RequestId, check_min_score, check_request_id, check_rows, token_ids
from .source import DatastoreSource

if TYPE_CHECKING:
    from datastore.admin.live_writer import LiveWriter

__all__ = ["DraftingService", "OUTPUTS_BYTES", "STEP_TIMES_KEPT"]

OUTPUTS_BYTES = 64 << 20
"""Default bound of the process-wide output index, bytes."""
STEP_TIMES_KEPT = 10_000
"""Steps whose seconds :class:`ServiceStats` keeps one by one."""
LOOKUP_TOKENS = 16
"""Trailing tokens of each row's context read (and checked) for the lookups: CREST keys are at most 5 tokens long."""
MATCH_NODES = 64
"""Nodes of the local and output matches (at least the budget): the calibration was fitted on matches this size."""
CONTEXT_TOKENS = 64
"""Trailing tokens of a request matched against this process's finished outputs."""
OUTPUTS_DEPTH = 16
"""Deepest continuation node of the output index's matches."""


@dataclass
class ServiceStats:
    """Cumulative figures of a service (seconds are wall-clock, summed over calls).

    Attributes:
        steps: :meth:`DraftingService.propose` calls. drafts: drafts returned. nodes: draft nodes returned.
        lookup_s: the steps' round trips (one a step; none when the cache answers all). core_s: the native core's
            drafting calls. step_s: whole ``propose`` calls. step_times: the last :data:`STEP_TIMES_KEPT` calls'
            seconds, one each (bounded: a service lives as long as its server).
        backed_off: drafts whose chosen datastore n-gram was shorter than the longest stored one.
        stopped_meanwhile: rows whose request was stopped while its lookups ran (an empty draft each).
    """

    steps: int = 0
    drafts: int = 0
    nodes: int = 0
    lookup_s: float = 0.0
    core_s: float = 0.0
    step_s: float = 0.0
    backed_off: int = 0
    stopped_meanwhile: int = 0
    step_times: deque = field(default_factory=lambda: deque(maxlen=STEP_TIMES_KEPT), repr=False)


def _tree(m: Match | None) -> tuple | None:
    """A match as the native core reads a source tree."""
    if m is None:
        return None
    t = m.tree
    return (len(m.ngram), t.token_ids, t.parents, t.counts, t.root_count)


class DraftingService:
    """The merged drafter: request-keyed, batched drafting from one datastore and its live layer, each request's own
    tokens and this process's finished outputs, every node scored by its calibrated acceptance probability.

    Args:
        lookups: the datastore's fault-tolerant lookups, its live layer included when its client was opened with one
            (``None``: drafts from the other sources only). :meth:`open` composes everything for a datastore name.
        vocab_size: token ids are checked to be below this where they enter (default: the open datastore's
            vocabulary; required when there is none to tell it).
        calibration: the node scorer (default: the shipped parameters, :meth:`Calibration.load`).
        outputs_bytes: the bound of this process's index of finished outputs, bytes (0: off).
        sources: the sources drafted from, of ``crest_native.SOURCES`` (default the retrieval sources: ``ds``,
            ``live``, ``local``, ``outputs``; add ``heads`` to draft from the S4C heads' trees each step passes, under
            a calibration fitted with them, :data:`drafting.calibration.HEADS_PATH`).
        min_score: a probability in [0, 1]: one node's verification cost in accepted tokens. Trees keep only nodes
            whose acceptance probability is at least this and chains stop before the first node below it (0: fill
            the budget).
        back_off_min_budget: trees of at least this many nodes choose the datastore n-gram among ALL stored
            suffixes of the context (the one whose draft has the largest expected accepted length, still one round
            trip); chains and smaller trees take the longest match (chosen on the calibration's fit half).
        live_writer: each request's output is handed to it at :meth:`stop_request` (enqueued; written on its thread).

    Raises:
        ValueError: when an argument is out of range, a source is unknown or not weighed by the calibration, or
            ``vocab_size`` is needed and not given.
    """

    name = "merged"
    score_kind = ScoreKind.PROBABILITY

    def __init__(self, lookups: DatastoreSource | None = None, *, vocab_size: int | None = None,
                 calibration: Calibration | None = None, outputs_bytes: int = OUTPUTS_BYTES,
                 sources: Sequence[str] = RETRIEVAL_SOURCES, min_score: float = 0.0, back_off_min_budget: int = 32,
                 live_writer: LiveWriter | None = None) -> None:
        self.min_score = check_min_score(min_score)
        if back_off_min_budget < 0 or outputs_bytes < 0:
            raise ValueError(f"back_off_min_budget={back_off_min_budget} and outputs_bytes={outputs_bytes}: "
                             "must be >= 0")
        vocab = vocab_size if vocab_size is not None else lookups.vocab_size if lookups is not None else None
        if vocab is None or vocab < 1:
            raise ValueError(f"vocab_size={vocab_size}: pass the tokenizer's vocabulary size (len(tokenizer)); "
                             "no open datastore tells it")
        self.vocab_size = int(vocab)
        self.calibration = calibration if calibration is not None else Calibration.load()
        cal = self.calibration
        self.sources = tuple(sources)
        unweighed = [s for s in self.sources if s not in cal.sources]
        if unweighed:
            raise ValueError(f"sources {unweighed} are not weighed by the calibration (it weighs {cal.sources}); "
                             f"load one fitted with them, e.g. Calibration.load({str(HEADS_PATH)!r})")
        self._core = Core(cal.coef, cal.intercept, cal.prior, self.vocab_size, cal.local_depth, MATCH_NODES,
                          int(outputs_bytes), OUTPUTS_DEPTH, CONTEXT_TOKENS, list(self.sources))
        self.outputs_bytes = int(outputs_bytes)
        self.lookups, self.live_writer = lookups, live_writer
        self.back_off_min_budget = back_off_min_budget
        self.stats = ServiceStats()
        self._lock = threading.Lock()

    @classmethod
    def open(cls, datastore: str, *, tokenizer, database_url: str | None = None, live: bool = True,
             live_url: str | None = None, cache_bytes: int = 64 << 20, outputs_bytes: int = OUTPUTS_BYTES,
             calibration: Calibration | None = None, min_score: float = 0.0,
             reopen_in_background: bool = True) -> DraftingService:
        """The merged drafter over datastore ``datastore``, composed in one place (what an engine's proposer uses).

        Args:
            datastore: the datastore name. tokenizer: the target's tokenizer (checked against the build's).
            database_url: libpq URL (default ``DATABASE_URL`` or the embedded server).
            live: also draft from the live layer ``<datastore>.live`` (once ``python -m ingest compact-live`` has
                built it; in the same round trip) and append every finished output to it from a background thread.
            live_url: the role that appends outputs (``INSERT`` on ``live_outputs`` only; default ``database_url``).
            cache_bytes: the tree cache's bound, bytes. outputs_bytes: the output index's bound, bytes (0: off).
            calibration / min_score: as for the constructor.
            reopen_in_background: a failed datastore is reopened on a background thread, so no step ever waits for a
                connection attempt (an engine's step must not stall while the server is down).

        Raises:
            ValueError: as the constructor.
        """
        from datastore.live import live_name
        from datastore.shared import SharedDatastore

        layer = live_name(datastore) if live else None
        lookups = DatastoreSource(lambda: SharedDatastore.open(
            datastore, tokenizer=tokenizer, database_url=database_url, cache_bytes=cache_bytes, live=layer),
            reopen_in_background=reopen_in_background)
        writer = None
        if live:
            from datastore.admin.live_writer import LiveWriter

            writer = LiveWriter(datastore, live_url or database_url)
        return cls(lookups, vocab_size=len(tokenizer), calibration=calibration, outputs_bytes=outputs_bytes,
                   min_score=min_score, live_writer=writer)

    # -- the request table (in the native core) ---------------------------------------------------------------

    def start_request(self, req_id: RequestId, prompt_ids: TokenIds) -> None:
        """Start drafting for ``req_id`` from ``prompt_ids`` (the prompt, and any output already generated).

        Raises:
            ValueError: when ``req_id`` is already active, or a token id is outside the vocabulary.
            TypeError: for a ``req_id`` that is not an int or a str.
            datastore.errors.InvalidContext: when ``prompt_ids`` is not a sequence of token ids (nothing coerced).
        """
        key, prompt = check_request_id(req_id), token_ids(prompt_ids, "prompt_ids")
        with self._lock:
            self._core.start(key, prompt)

    def add_tokens(self, req_id: RequestId, tokens: TokenIds) -> None:
        """Append the tokens the target committed for ``req_id`` (bonus token included).

        Raises:
            KeyError: when ``req_id`` is not active (start_request it first).
            ValueError: when a token id is outside the vocabulary.
            datastore.errors.InvalidContext: when ``tokens`` is not a sequence of token ids (nothing coerced).
        """
        key, checked = check_request_id(req_id), token_ids(tokens, "tokens")
        with self._lock:
            self._core.extend(key, checked)

    def follow(self, req_id: RequestId, tokens: np.ndarray) -> bool:
        """When ``req_id``'s tokens so far are a prefix of ``tokens``, append the rest and return ``True``; else change
        nothing and return ``False`` (a request not active included). What an engine that passes each row's whole
        sequence, and no request id, keys its rows by (:class:`serving.RowTracker`).

        Args:
            tokens: ``[N]`` int32 or int64, the row's whole sequence.

        Raises:
            ValueError: when a token id past the request's own is outside the vocabulary.
            datastore.errors.InvalidContext: for anything but a 1-D integer array.
        """
        key, arr = check_request_id(req_id), token_ids(tokens, "tokens", self.vocab_size)
        with self._lock:
            return self._core.follow(key, arr.astype(np.int32))

    def stop_request(self, req_id: RequestId) -> None:
        """Forget ``req_id`` (one not active is ignored); its output joins this process's output index, and the live
        layer's writer when there is one."""
        key = check_request_id(req_id)
        with self._lock:
            output = self._core.stop(key)
        if output is not None and len(output) and self.live_writer is not None:
            self.live_writer.append(output.tolist())

    @property
    def active_requests(self) -> frozenset:
        """The ids of the requests started and not stopped."""
        with self._lock:
            return frozenset(self._core.keys())

    # -- drafting ---------------------------------------------------------------------------------------------

    def propose(self, batch: Sequence[tuple[RequestId, TokenIds, int]], *, chain: bool = False,
                min_score: float | None = None, heads: Sequence[HeadTree | None] | None = None) -> list[Draft]:
        """One draft per row ``(req_id, context, budget)``, in one round trip and one native call.

        Args:
            batch: the rows: the request, its token ids so far (the last :data:`LOOKUP_TOKENS` are looked up) and
                its budget, an int in ``0..MAX_BUDGET`` (0: no draft).
            chain: each row's best path (at most ``budget`` tokens) instead of a tree.
            min_score: this step's cut, a probability in [0, 1] (``None``: the service's ``min_score``).
            heads: per row, the draft heads' candidate tree (``None``: none for that row), for a service that drafts
                from the ``heads`` source (:class:`s4c.MergedS4CDrafter` passes them).

        Returns:
            ``[len(batch)]`` drafts with ``probability`` scores; empty for a row whose request was stopped meanwhile.

        Raises:
            KeyError: when a request is not active when the call starts.
            TypeError / ValueError: for a malformed row (naming it), a ``min_score`` outside [0, 1], or ``heads`` that
                do not pair with the rows, hold a token outside the vocabulary or are given to a service without the
                ``heads`` source.
            datastore.errors.InvalidContext: for a context that is not a sequence of token ids in the vocabulary.
        """
        start = time.perf_counter()
        ids, contexts, budgets = check_rows(batch, self.vocab_size, LOOKUP_TOKENS)
        cut = self.min_score if min_score is None else check_min_score(min_score)
        trees = self._check_heads(heads, len(budgets))
        with self._lock:
            for key in ids:
                if not self._core.active(key):
                    raise KeyError(f"request {key!r} is not active; start_request it first")
        rows = [i for i, b in enumerate(budgets) if b > 0]
        backs_off = [not chain and budgets[i] >= self.back_off_min_budget for i in rows]
        found = self._retrieve([contexts[i] for i in rows], backs_off)
        looked = time.perf_counter()
        with self._lock:
            gone = sum(not self._core.active(ids[i]) for i in rows)
            made = self._core.draft([ids[i] for i in rows], np.asarray([budgets[i] for i in rows], dtype=np.int64),
                                    [[_tree(m) for m in f.candidates] for f in found], [_tree(f.live) for f in found],
                                    [trees[i] for i in rows], chain, cut) if rows else None
        drafted = time.perf_counter()
        drafts = [Draft.empty(self.score_kind)] * len(budgets)
        if made is not None:
            tokens, parents, scores, offsets, chosen = made
            bounds = offsets.tolist()
            for i, s, e in zip(rows, bounds, bounds[1:]):
                drafts[i] = Draft.trusted(tokens[s:e], parents[s:e], scores[s:e], self.score_kind)
            self._count(drafts, chosen, gone, looked - start, drafted - looked, time.perf_counter() - start)
        return drafts

    def _check_heads(self, heads: Sequence[HeadTree | None] | None, rows: int) -> list[tuple | None]:
        """Each row's heads tree as the core reads it (``None``: none), checked at the door."""
        if heads is None:
            return [None] * rows
        if "heads" not in self.sources:
            raise ValueError("heads trees were passed to a service that does not draft from the heads source; "
                             "construct it with sources=[..., 'heads'] and the heads' calibration")
        if isinstance(heads, (str, bytes)) or not isinstance(heads, Sequence) or len(heads) != rows:
            raise ValueError(f"heads must be a list with one HeadTree (or None) per row of the batch ({rows} rows)")
        out: list[tuple | None] = []
        for i, tree in enumerate(heads):
            if tree is not None and not isinstance(tree, HeadTree):
                raise TypeError(f"heads[{i}] is a {type(tree).__name__}; pass a drafting.heads.HeadTree or None")
            if tree is not None and len(tree) and int(tree.token_ids.max()) >= self.vocab_size:
                raise ValueError(f"heads[{i}] holds token id {int(tree.token_ids.max())}, outside the vocabulary "
                                 f"[0, {self.vocab_size})")
            out.append(tree.native() if tree is not None and len(tree) else None)
        return out

    def _retrieve(self, contexts: list[list[int]], backs_off: list[bool]) -> list[Retrieval]:
        """The step's round trip: per row, its datastore candidates (all stored suffixes where it backs off, else the
        longest) and its live match."""
        if self.lookups is None or not contexts:
            return [Retrieval([], None) for _ in contexts]
        found = self.lookups.retrieve_batch(contexts, any(backs_off))
        return [f if b else Retrieval(f.candidates[:1], f.live) for f, b in zip(found, backs_off)]

    def _count(self, drafts: list[Draft], chosen: np.ndarray, gone: int, lookup_s: float, core_s: float,
               step_s: float) -> None:
        with self._lock:
            st = self.stats
            st.steps += 1
            st.drafts += len(drafts)
            st.nodes += sum(len(d) for d in drafts)
            st.backed_off += int((chosen > 0).sum())
            st.stopped_meanwhile += gone
            st.lookup_s += lookup_s
            st.core_s += core_s
            st.step_s += step_s
            st.step_times.append(step_s)

    def node_tables(self, req_id: RequestId, candidates: Sequence[Match], live: Match | None,
                    heads: HeadTree | None = None) -> list[NodeTable]:
        """The merged node table of each datastore candidate (or of none) of an active request, with its features and
        scores, exactly as a step merges it: what fitting the calibration reads (``benchmarks/calibrate.py``).

        Raises:
            KeyError: when ``req_id`` is not active.
            ValueError / TypeError: for ``heads`` as :meth:`propose` checks them.
        """
        key = check_request_id(req_id)
        tree = self._check_heads(None if heads is None else [heads], 1)[0]
        with self._lock:
            tables = self._core.tables(key, [_tree(m) for m in candidates], _tree(live), tree)
        return [NodeTable(*t) for t in tables]

    def step_seconds(self) -> dict[str, float]:
        """Seconds spent so far, by part of the step: ``lookup`` (the round trips) and ``merge`` (the native core)."""
        with self._lock:
            return {"lookup": self.stats.lookup_s, "merge": self.stats.core_s}

    def outputs_info(self) -> dict:
        """This process's output index: ``outputs`` held, ``bytes`` (its size model, what ``max_bytes`` bounds),
        ``allocated`` (what its arrays hold allocated), ``max_bytes``, ``evictions``."""
        with self._lock:
            return dict(self._core.outputs_info())

    def config(self) -> dict:
        """Everything that changes the drafts: the scorer, the sources and the output index, the cut, the back-off
        and what the lookups serve."""
        return {"name": self.name, "calibration": self.calibration.digest(),
                "local": {"kind": "suffix", "max_depth": self.calibration.local_depth}, "sources": list(self.sources),
                "outputs": {"max_bytes": self.outputs_bytes, "max_depth": OUTPUTS_DEPTH},
                "min_score": self.min_score, "back_off_min_budget": self.back_off_min_budget,
                "source": None if self.lookups is None else self.lookups.identity()}

    def close(self) -> None:
        """Close the lookups and the live layer's writer (what :meth:`open` opened)."""
        if self.lookups is not None:
            self.lookups.close()
        if self.live_writer is not None:
            self.live_writer.close()
