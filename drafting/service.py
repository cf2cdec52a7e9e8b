"""The merged drafter: one request-keyed, batch-first lifecycle over the native core, which owns each request's data.

Shaped after ArcticInference's suffix decoding (https://github.com/snowflakedb/ArcticInference,
``arctic_inference/suffix_decoding``) and vLLM's batch-first proposers (``vllm/v1/spec_decode``):
:meth:`DraftingService.start_request` puts a prompt in the core, :meth:`DraftingService.step` follows each request's new
tokens and drafts the batch (one native call once the replicas are mapped), :meth:`DraftingService.stop_request` ends a
request (its output joins the output index and the live layer's writer), :meth:`DraftingService.close` ends the drafter.
An engine steps its batch by request id through :meth:`DraftingService.engine_batch` (:class:`drafting.EngineBatch`:
starting, following, stopping and drafting in one native call a step), or, where it gives no ids, by its rows' tokens
(:meth:`DraftingService.batch`, :meth:`DraftingService.step_rows`). Each row's draft is the union of its sources (the
datastore's tree of the context's longest stored n-gram, CREST §3, https://arxiv.org/abs/2408.04678, from each
datastore of the set its request drafts from, :mod:`drafting.catalog`; the live layer's; the request's own earlier
match and the match in the finished outputs, SuffixDecoding's two trees, https://arxiv.org/abs/2411.04975, §3), every
node scored by its calibrated acceptance probability (:mod:`drafting.calibration`).

Thread-safe (one lock guards the table and every native call, which releases the GIL) and fork-safe (``os.fork`` waits
for a call in flight). What a caller sees while other threads call too: a step reads each request's state once, at its
draft, and drafts it from lookups made for exactly that context (a round trip whose rows another thread followed
meanwhile is looked up again, :data:`STALE_ROUNDS`); a request another thread follows during the step is drafted for
the tokens it holds then; a request another thread stops during the step follows nothing and gets an empty draft, and
only its row changes; every other row is what a single-threaded drafter drafts. :meth:`DraftingService.close` is final
for every method, and nothing reopens a source or starts a thread after it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

import crest_native
from crest_native import DEFAULTS, EngineRows, NodeTable
from datastore.context import TokenIds
from datastore.errors import ClosedError, InvalidContext
from datastore.tree import Match
from toolkit.forks import at_fork

from . import door
from .calibration import RETRIEVAL_SOURCES, Calibration
from .catalog import DatastoreCatalog
from .door import RequestId
from .draft import CostCurve, ScoreKind
from .engine import EngineBatch
from .head import DraftHead
from .native import core_options, native_core
from .opening import open_service
from .retrieval import DatastoreTrees, native_tree
from .source import DatastoreSource
from .step import Batch, OutputSink, ServiceStats, StepResult

__all__ = ["STALE_ROUNDS", "DraftingService", "FitKey"]

log = logging.getLogger(__name__)

class FitKey(NamedTuple):
    """One online fit a fleet may share (:meth:`DraftingService.fits`): datastore set ``set_id`` drafting for the
    datastore ``name``, started from the calibration whose digest is ``prior``, with the model features or not."""

    set_id: int
    name: str
    prior: str
    with_model: bool


STALE_ROUNDS = 4
"""Round trips a step makes at most while other threads follow its requests between its lookups and its draft; the
last one holds the drafter's table."""


class DraftingService:
    """The merged drafter (see the module docstring): a request table over the native core, and the sources it drafts
    from. :meth:`open` composes it for a datastore name.

    Args:
        lookups: the datastores requests draft from (:class:`drafting.catalog.DatastoreCatalog`), or one shared
            datastore's fault-tolerant lookups (its live layer included when its client was opened with one; a
            catalog of it alone), or ``None``: drafts from the other sources only.
        vocab_size: token ids are checked to be below this where they enter (``len(tokenizer)``; an engine's model's
            vocabulary when it is larger), in ``1..2**32``.
        key_vocab: the datastore's vocabulary: a round trip asks only for keys of ids below it (default: the shared
            datastore's, else ``vocab_size``).
        calibration: the node scorer (default: the shipped parameters, :meth:`Calibration.load`).
        sources: the sources drafted from, of ``crest_native.SOURCES`` (default all four: ``ds``, ``live``, ``local``,
            ``outputs``).
        min_score: a probability in [0, 1]: one node's verification cost in accepted tokens. Trees keep only nodes
            whose acceptance probability is at least this and chains stop before the first node below it (0: fill
            the budget); a step may pass its own.
        outputs_bytes: the bound of this process's index of finished outputs, bytes (0: off; ``None``: the core's
            default, :data:`crest_native.DEFAULTS`).
        back_off_min_budget: trees of at least this many nodes choose the datastore n-gram among ALL stored suffixes
            of the context (``None``: the core's default, chosen on the calibration's fit half).
        max_tokens: an engine's context length (vLLM's ``max_model_len``): each request's draft is cut to what fits
            beside its tokens and the bonus token (tokens + draft + 1 <= ``max_tokens``), in the core (0: no bound).
        online_strength: the calibration refitted online on the engine's verdicts, per datastore set
            (``csrc/online.hpp``): the weight of the given calibration as its prior, in outcomes' worth of Fisher
            information (0: off, the calibration stays as given; ``None``: the core's default, 10, chosen on the fit
            halves; :data:`crest_native.DEFAULTS`).
        online_memory: the outcomes after which one weighs 1/e, >= 1 (``None``: the core's default).
        online_share: the most outcomes each datastore set keeps between two folds into the fleet's fit
            (:meth:`fold_fit`, :class:`live.FitFeed`), >= 0; beyond it, an outcome is learnt here only (``None``: the
            core's default, 0: no fleet).
        live_writer: each finished request's output is handed to it, under the name of its request's first datastore
            (:class:`live.LiveWriter`); closed with the drafter.

    Attributes:
        name: ``"merged"``. score_kind: probability. stats: :class:`ServiceStats`. retrieval: the datastores' side
            (:class:`drafting.retrieval.DatastoreTrees`, its figures in ``retrieval.stats``). catalog: the datastores.

    Raises:
        ValueError: when ``vocab_size`` is out of range, ``min_score`` is not a probability, a source is unknown or
            not weighed by the calibration, or a core setting is out of range (naming it).
        TypeError: for a setting of the wrong type.
    """

    name = "merged"
    score_kind = ScoreKind.PROBABILITY

    def __init__(self, lookups: DatastoreCatalog | DatastoreSource | None = None, *, vocab_size: int,
                 key_vocab: int | None = None, calibration: Calibration | None = None,
                 sources: Sequence[str] = RETRIEVAL_SOURCES, min_score: float = 0.0, outputs_bytes: int | None = None,
                 back_off_min_budget: int | None = None, max_tokens: int = 0, online_strength: float | None = None,
                 online_memory: float | None = None, online_share: int | None = None,
                 live_writer: OutputSink | None = None) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 1 <= vocab_size <= 1 << 32:
            raise ValueError(f"vocab_size={vocab_size!r}: pass the tokenizer's vocabulary size (len(tokenizer)), an "
                             "int in 1..2**32")
        self.vocab_size = vocab_size
        self.min_score = door.min_score(min_score)
        self.calibration = calibration or Calibration.load()
        self.sources = tuple(sources)
        unweighed = [s for s in self.sources if s not in self.calibration.sources]
        if unweighed:
            raise ValueError(f"sources {unweighed} are not weighed by the calibration (it weighs "
                             f"{self.calibration.sources}); fit one with them: python -m evaluation calibrate")
        self.options = core_options(self.calibration, self.sources, outputs_bytes, back_off_min_budget, max_tokens,
                                    online_strength, online_memory, online_share)
        self._core = native_core(self.calibration, self.options)
        self.catalog = lookups if isinstance(lookups, DatastoreCatalog) else DatastoreCatalog(lookups)
        self.retrieval = DatastoreTrees(self.catalog)
        shared = self.catalog.shared
        self.key_vocab = key_vocab or (shared.vocab_size if shared is not None else None) or vocab_size
        self.live_writer = live_writer
        self._model_calibration: Calibration | None = None  # set_model's
        self._requests: dict[RequestId, int] = {}  # request id -> its handle in the core
        self._generation = 0  # counts starts and stops: a Batch read before a change is read again
        self._lock = threading.Lock()
        self._closed = False
        self.stats = ServiceStats()
        at_fork(self, before=DraftingService._hold, after_in_parent=DraftingService._release,
                after_in_child=DraftingService._release)

    open = classmethod(open_service)

    # -- the lifecycle of a request ---------------------------------------------------------------------------------

    def start_request(self, req_id: RequestId, prompt_ids: TokenIds, *, datastore: str | None = None,
                      shared: bool = True) -> None:
        """Start drafting for ``req_id`` from ``prompt_ids`` (the prompt, and any output already generated).

        Args:
            req_id: an ``int`` (64-bit) or ``str``. prompt_ids: a list, tuple or 1-D integer array of token ids.
            datastore: a datastore of the catalog's to draft from besides the shared one (``None``: the shared one
                alone; a name the catalog cannot serve, or one still opening, drafts from the shared one,
                :mod:`drafting.catalog`). shared: also draft from the shared datastore (with ``datastore``).

        Raises:
            ValueError: when ``req_id`` is already active. TypeError: for a ``req_id`` that is no request id, a
                ``datastore`` that is no str or a ``shared`` that is no bool.
            datastore.errors.InvalidContext: when ``prompt_ids`` is not a sequence of token ids of the vocabulary.
            datastore.errors.ClosedError: after :meth:`close`.
        """
        key, prompt = door.request_id(req_id), door.token_ids(prompt_ids, self.vocab_size, "prompt_ids")
        name, on = door.datastore_choice(datastore, shared)
        with self._lock:
            self._check_open()
            if key in self._requests:
                raise ValueError(f"request {key!r} is already active; stop_request it first")
            set_id = self.catalog.resolve(name, on)
            self._forget_retired()
            self._requests[key] = self._core.start(prompt, set_id)
            self.catalog.acquire(set_id)
            self._generation += 1

    def stop_request(self, req_id: RequestId) -> None:
        """Forget ``req_id`` (one not active is ignored); its output joins this process's output index and is handed to
        the live layer's writer.

        Raises:
            TypeError: for a ``req_id`` that is no request id. datastore.errors.ClosedError: after :meth:`close`.
        """
        key = door.request_id(req_id)
        with self._lock:
            self._check_open()
            handle = self._requests.pop(key, None)
            if handle is None:
                return
            self._generation += 1
            set_id = self._core.set_of(handle)
            output = self._core.stop(handle)
            self.catalog.release(set_id)
        self._hand_on(output, set_id)

    def _forget_retired(self) -> None:
        """Under the lock: the sets the catalog retired since start over (an id may now be another datastore's)."""
        for set_id in self.catalog.take_retired():
            self._core.forget(set_id)

    def _hand_on(self, output: np.ndarray, set_id: int) -> None:
        """A finished request's output (of set ``set_id``) to the live layer's writer."""
        if self.live_writer is not None and len(output):
            self.live_writer.append(output.tolist(), self.catalog.members(set_id).name)

    # -- the library's step -----------------------------------------------------------------------------------------

    def step(self, requests: Sequence[RequestId], budgets: np.ndarray | Sequence[int], *,
             tokens: Sequence[TokenIds] | None = None, chain: bool = False, min_score: float | None = None,
             states: np.ndarray | None = None, state_rows: np.ndarray | None = None) -> StepResult:
        """Follow each request's new tokens, then draft for each, ``budgets[i]`` nodes for request ``requests[i]``.

        Args:
            requests: ``[rows]`` active request ids.
            budgets: ``[rows]`` ints, each in ``0..MAX_BUDGET`` (:data:`crest_native.MAX_BUDGET`; 0: no draft).
            tokens: what each request committed since its last step (the target's accepted tokens and its bonus
                token): a list of token ids per request (``None``: nothing new).
            chain: each row's best path (at most ``budgets[i]`` tokens) instead of a tree (a ``bool``).
            min_score: this step's cut, a probability: nodes whose acceptance probability is below it are not drafted
                (``None``: the drafter's own).
            states: ``[rows, hidden_size]`` float32 (C order, read in place): each row's state (:meth:`set_model`
                first): with a head, the target's final-normed hidden state at the row's last accepted token, which
                the core's head reads with the row's last token (its bonus token); without one, the next-state
                estimate itself (``None``: none). Finite: a NaN or inf is refused.
            state_rows: ``[rows]`` bool, the rows whose ``states`` are valid (``None``: all; only with ``states``).

        Returns:
            A :class:`StepResult`: the drafts (a request another thread stopped during the step: an empty one).

        Raises:
            KeyError: when a request is not active. TypeError / ValueError: for a malformed argument, naming it (a
                budget outside ``0..MAX_BUDGET``, states without :meth:`set_model`, of another shape or dtype, or not
                finite; nothing followed, nothing drafted).
            datastore.errors.InvalidContext: for a new token id outside the vocabulary (naming ``tokens[i]`` and the
                id; nothing followed).
            datastore.errors.ClosedError: after :meth:`close`.
        """
        start = time.perf_counter()
        ids = door.request_ids(requests)
        b = crest_native.Batch()
        b.budgets = door.budgets(budgets, len(ids))
        b.chain = door.chain(chain)
        b.min_score = self.min_score if min_score is None else door.min_score(min_score)
        if tokens is not None:
            b.appended, b.counts = door.token_lists(tokens, len(ids), self.vocab_size)
        self._set_states(b, states, state_rows, len(ids))
        with self._lock:
            self._check_open()
            b.handles = self._handles(ids)
        made = self._draft(b, start)
        return StepResult(made.followed, made)

    def _set_states(self, b: crest_native.Batch, states: np.ndarray | None, state_rows: np.ndarray | None,
                    rows: int) -> None:
        """``states`` and ``state_rows`` checked (:func:`drafting.door.states`) onto ``b``."""
        if states is None:
            if state_rows is not None:
                raise TypeError("state_rows was given without states; pass the rows' states too, or neither")
            return
        b.states, b.has_state = door.states(states, state_rows, rows, self._core.model_width)

    # -- an engine's rows, keyed by their tokens --------------------------------------------------------------------

    def batch(self, req_ids: Sequence[RequestId], *, chain: bool = False, min_score: float | None = None) -> Batch:
        """``req_ids`` resolved for :meth:`step_rows` (an engine's persistent batch, stepped again and again), with
        the settings of every step of it: ``chain`` and ``min_score``, as :meth:`step` takes them.

        Raises:
            KeyError: when a request is not active. TypeError / ValueError: for an id that is no request id, or a
                setting :meth:`step` refuses. datastore.errors.ClosedError: after :meth:`close`.
        """
        ids = door.request_ids(req_ids)
        chained = door.chain(chain)
        cut = self.min_score if min_score is None else door.min_score(min_score)
        with self._lock:
            self._check_open()
            return Batch(self, ids, self._handles(ids), self._generation, chained, cut)

    def step_rows(self, batch: Batch, budgets: np.ndarray | Sequence[int], rows: EngineRows, *,
                  curve: CostCurve | None = None,
                  states: np.ndarray | None = None, state_rows: np.ndarray | None = None) -> StepResult:
        """Follow an engine's rows, then draft for each request of ``batch`` (its own settings), ``budgets[i]`` nodes
        for request ``batch.ids[i]``: what an engine that gives no request ids steps (:class:`drafting.RowTracker`).

        Args:
            batch: this drafter's :meth:`batch`.
            budgets: ``[rows]`` int64 (or ints), as :meth:`step`'s.
            rows: the engine's rows (:class:`drafting.EngineRows`, views of its arrays): a request whose tokens are
                the first of its row takes the rest; one that is not follows nothing, and nothing is drafted.
            curve: an engine's step-cost curve: the chains are cut to the batch's draft tokens that maximise its
                expected tokens per second (SmartSpec's goodput, :func:`crest_native.goodput_keep`), each request's
                scores discounted by what the engine accepted of its earlier drafts (``csrc/feedback.hpp``); ``None``:
                not cut. A batch of chains only.
            states / state_rows: as :meth:`step`'s.

        Returns:
            A :class:`StepResult`: which requests followed their rows, and the drafts when every one did.

        Raises:
            ValueError: for a :class:`Batch` another drafter made. KeyError: when a request is not active.
            TypeError / ValueError: for rows, counts or an index an engine cannot mean, a curve on a batch of trees,
                or as :meth:`step` (nothing followed, nothing drafted).
            datastore.errors.InvalidContext: for a new token id outside the vocabulary (naming the request and the
                id; nothing followed). datastore.errors.ClosedError: after :meth:`close`.
        """
        start = time.perf_counter()
        if type(batch) is not Batch:
            raise TypeError(f"batch is a {type(batch).__name__}; pass a drafting.Batch of this drafter's batch()")
        if type(rows) is not EngineRows:
            raise TypeError(f"rows is a {type(rows).__name__}; pass a drafting.EngineRows of the engine's arrays")
        if batch.drafter is not self:
            raise ValueError(f"this Batch of requests {batch.ids[:3]!r}... was made by another drafter "
                             f"({batch.drafter!r}); step a drafter with the batches its own batch() makes")
        b = batch.native
        b.budgets = budgets if type(budgets) is np.ndarray and budgets.dtype == np.int64 and budgets.ndim == 1 \
            and budgets.flags.c_contiguous else door.budgets(budgets, len(batch.ids))
        b.curve = door.curve(curve)
        b.rows = rows
        b.appended = b.counts = None
        b.states = b.has_state = None
        self._set_states(b, states, state_rows, len(batch.ids))
        if batch.generation != self._generation:  # a request started or stopped since: its handles are read again
            with self._lock:
                self._check_open()
                b.handles = self._handles(batch.ids)
                batch.generation = self._generation
        made = self._draft(b, start, batch.ids)
        return StepResult(made.followed, made if made.drafted else None)

    # -- an engine's batch, by request id ---------------------------------------------------------------------------

    def engine_batch(self, *, vocab_size: int | None = None, chain: bool = True,
                     min_score: float | None = None) -> EngineBatch:
        """An engine's batch stepped by request id (:class:`drafting.EngineBatch`), with the settings of every step.

        Args:
            vocab_size: the engine model's vocabulary: its rows' ids must be below it (``None``: this drafter's).
            chain / min_score: as :meth:`step` takes them.

        Raises:
            TypeError / ValueError: for a setting :meth:`step` refuses, naming it.
        """
        return EngineBatch(self, vocab_size=self.vocab_size if vocab_size is None else door.engine_vocab(vocab_size),
                           chain=door.chain(chain), min_score=self.min_score if min_score is None else
                           door.min_score(min_score))

    # -- the native calls of a step ---------------------------------------------------------------------------------

    def _handles(self, ids: list[RequestId]) -> np.ndarray:
        """Under the lock: ``[len(ids)]`` int64, each request's handle (read only)."""
        requests = self._requests
        try:
            handles = np.array([requests[r] for r in ids], np.int64)
        except KeyError as exc:
            raise KeyError(f"request {exc.args[0]!r} is not active; start_request it first") from None
        handles.setflags(write=False)
        return handles

    def _draft(self, b: crest_native.Batch, start: float, ids: Sequence[RequestId] = ()) -> crest_native.Step:
        """The native calls of a step begun at ``start``: follow and draft from the replicas, or follow and plan,
        fetch, draft; the step counted in :attr:`stats` when it drafted.

        The round trip fetches outside the lock; a row whose request another thread followed meanwhile is not drafted
        from trees looked up for its earlier context: the native step plans again, and the rows are fetched again (the
        last of :data:`STALE_ROUNDS` rounds under the lock, so that a step always ends)."""
        stores = self.retrieval.stores()
        at = time.perf_counter()
        made = self._call(b, stores, start)
        if made.followed is None:
            raise self._bad_id(ids, made)
        if made.drafted:
            self.retrieval.drafted(made, time.perf_counter() - at, stores)
            return made
        if not all(made.followed):
            return made
        b.rows = b.appended = b.counts = None  # followed: the calls that follow draft only
        if stores is not None:
            self.retrieval.drafted(made, time.perf_counter() - at, stores)  # a replica was damaged: counted, dropped
            made = self._call(b, None, None)  # the round trip drafts the step
        return self._round_trip(b, made, start)

    def _round_trip(self, b: crest_native.Batch, plan: crest_native.Step, start: float) -> crest_native.Step:
        """Fetch what ``plan`` asks for and draft ``b`` from it (again while other threads follow its rows)."""
        made = plan
        for _ in range(STALE_ROUNDS - 1):
            trees = self.retrieval.fetch(made)
            at = time.perf_counter()
            made = self._call(b, trees, start)
            if made.drafted:
                self.retrieval.drafted_given(made, time.perf_counter() - at)
                return made
        with self._lock:  # another thread keeps following a row of this batch: one round with the table held
            self._check_open()
            b.key_limit = self.key_vocab
            made = self._core.step(b, None)
            trees = self.retrieval.fetch(made)
            at = time.perf_counter()
            made = self._core.step(b, trees)
            self._count(len(b.handles), made, start)
        self.retrieval.drafted_given(made, time.perf_counter() - at)
        return made

    def _call(self, b: crest_native.Batch, source, start: float | None) -> crest_native.Step:
        """One native step under the lock; one that drafted is counted in :attr:`stats` (with the seconds since
        ``start``; ``None``: not counted, the step is not over)."""
        with self._lock:
            if self._closed:
                self._check_open()
            b.key_limit = self.key_vocab
            made = self._core.step(b, source)
            if made.drafted and start is not None:
                self._count(len(b.handles), made, start)
            return made

    def _count(self, rows: int, made: crest_native.Step, start: float) -> None:
        """Under the lock: count a step of ``rows`` begun at ``start`` that drafted, in :attr:`stats`."""
        spent = time.perf_counter() - start
        st = self.stats
        st.steps += 1
        st.drafts += rows
        st.nodes += made.nodes
        st.step_s += spent
        st.step_times.append(spent)

    def _bad_id(self, ids: Sequence[RequestId], made: crest_native.Step) -> InvalidContext:
        """The error for request ``made.bad``'s new id outside the vocabulary (nothing was followed)."""
        who = f"request {ids[made.bad]!r}" if made.bad < len(ids) else f"row {made.bad}"
        return InvalidContext(f"the row of {who} holds token id {made.bad_id} after its tokens, outside the "
                              "vocabulary; pass the engine's ids (and its model's vocab_size); nothing was followed")

    # -- the target's state -----------------------------------------------------------------------------------------

    def set_model(self, lm_head: np.ndarray, calibration: Calibration,
                  head: crest_native.Head | None = None) -> None:
        """From now on a row given a state (:meth:`step`'s ``states``) has its depth-1 tokens read against
        ``lm_head`` ``[vocab, hidden_size]`` (float32, C order; read in place, kept alive by the drafter) and is
        scored with ``calibration``, a with-model one of the drafter's prior (a :class:`drafting.DraftHead`'s;
        ``csrc/scores.hpp``). Rows without a state are scored as before.

        Args:
            lm_head: the target's LM head. calibration: the with-model calibration.
            head: the draft head the core reads each state through, in the step (:meth:`drafting.DraftHead.native`;
                ``csrc/head.hpp``); ``None``: a state given is the next-state estimate itself.

        Raises:
            TypeError / ValueError: for an LM head not float32 C order, or empty; a calibration without the model
                features or with another prior; a head of another width. ClosedError: after :meth:`close`.
        """
        door.model(lm_head, calibration)
        term = calibration.token_bias
        with self._lock:
            self._check_open()
            self._model_calibration = calibration
            self._core.set_model(lm_head, calibration.coef, calibration.intercept, calibration.prior,
                                 *((None, None) if term is None else (term.tokens, term.bias)), head)

    def set_head(self, head: DraftHead, embedding: np.ndarray, lm_head: np.ndarray, tokenizer: str) -> None:
        """From now on a row given a state is read through ``head``: :meth:`set_model` with ``head``'s calibration for
        the tokenizer whose fingerprint is ``tokenizer`` (:func:`toolkit.tokenizer.tokenizer_fingerprint`; a token
        term fitted for another tokenizer is dropped, :meth:`drafting.Calibration.for_tokenizer`) and its native form
        over ``embedding``.

        Args:
            head: a head trained for this target (check :meth:`drafting.DraftHead.fits` first).
            embedding / lm_head: the target's ``[vocab, d]`` float32 C-ordered rows, read in place
                (:func:`drafting.head.target_rows`; one array where the model ties them).

        Raises:
            TypeError / ValueError: as :meth:`set_model` and :meth:`drafting.DraftHead.native` raise.
        """
        self.set_model(lm_head, head.calibration.for_tokenizer(tokenizer), head.native(embedding))

    def learn_outputs(self, outputs: Sequence[TokenIds]) -> int:
        """Put outputs finished elsewhere in this process's output index, as if its own requests had generated them:
        another process's of the fleet, or an earlier run's (:class:`live.OutputFeed` feeds the live layer's).
        SuffixDecoding's global tree of earlier responses (https://arxiv.org/abs/2411.04975, §3), fed by the fleet.
        They are not handed to the live layer's writer: they are not this process's.

        Args:
            outputs: each a list, tuple or 1-D integer array of token ids (the generated tokens, not the prompt); an
                empty one is skipped.

        Returns:
            The tokens added.

        Raises:
            datastore.errors.InvalidContext: naming ``outputs[i]`` and the id, for an output that is not a sequence
                of token ids of the vocabulary (none of the outputs is added).
            TypeError: when ``outputs`` is not a sequence. datastore.errors.ClosedError: after :meth:`close`.
        """
        if isinstance(outputs, (str, bytes)) or not isinstance(outputs, Sequence):
            raise TypeError(f"outputs is a {type(outputs).__name__}; pass a list of token id sequences")
        checked = [door.token_ids(o, self.vocab_size, f"outputs[{i}]") for i, o in enumerate(outputs)]
        tokens = np.concatenate(checked) if checked else np.zeros(0, np.uint32)
        lengths = np.fromiter((len(o) for o in checked), np.int64, len(checked))
        with self._lock:
            self._check_open()
            self._core.add_outputs(tokens, lengths)
        return len(tokens)

    # -- the calibration fitted online, shared by the fleet ----------------------------------------------------------

    def fits(self) -> list[FitKey]:
        """The online fits a fleet may share (``csrc/online.hpp``): one per datastore set that drafts for a named
        datastore, without the model features, and with them too once :meth:`set_model` gave a model. None while online
        learning is off (``online_strength`` 0).

        Raises:
            datastore.errors.ClosedError: after :meth:`close`."""
        with self._lock:
            self._check_open()
            model = self._model_calibration
        if self.options.online_strength == 0:
            return []
        kinds = [(False, self.calibration.digest())] + ([(True, model.digest())] if model is not None else [])
        return [FitKey(set_id, m.name, prior, with_model) for set_id, m in sorted(self.catalog.sets().items())
                if m.name is not None for with_model, prior in kinds]

    def fold_fit(self, key: FitKey, fleet: bytes | None) -> bytes:
        """Fold fit ``key``'s outcomes since its last fold into the fleet's learner ``fleet`` (its state, as stored:
        ``None``: none yet) and go on drafting from the result, returned (the state to store back). Between folds
        the set keeps learning on its own, from there.

        Raises:
            ValueError: for a ``fleet`` that is not a state of this fit (another calibration's or damaged: naming
                which), or while online learning is off. KeyError: when the set no longer drafts for ``key.name``
                (retired meanwhile: ask :meth:`fits` again). datastore.errors.ClosedError: after :meth:`close`.
        """
        with self._lock:
            self._check_open()
            if self.catalog.members(key.set_id).name != key.name:  # retired meanwhile: nothing of it to fold
                raise KeyError(f"datastore set {key.set_id} no longer drafts for {key.name!r}; ask fits() again")
            return self._core.fold(key.set_id, key.with_model, fleet)

    def fit(self, set_id: int = 0, with_model: bool = False) -> tuple[np.ndarray, float, int]:
        """Datastore set ``set_id``'s calibration now: its weights (``[len(FEATURES)]`` float64, or with the model
        features), its intercept and the verdicts it learnt from (0 while online learning is off: the calibration as
        given).

        Raises:
            ValueError: for a negative ``set_id``. datastore.errors.ClosedError: after :meth:`close`."""
        with self._lock:
            self._check_open()
            coef, intercept, outcomes = self._core.fit(set_id, with_model)
        return coef, intercept, outcomes

    def tokens(self, req_id: RequestId) -> np.ndarray:
        """The tokens the drafter holds for ``req_id`` (its prompt and all followed since): ``[N]`` uint32, a copy.

        Raises:
            KeyError: when ``req_id`` is not active. datastore.errors.ClosedError: after :meth:`close`.
        """
        key = door.request_id(req_id)
        with self._lock:
            self._check_open()
            return self._core.tokens(self._handle(key), 0)

    def node_tables(self, req_id: RequestId, candidates: Sequence[Match], live: Match | None,
                    state: np.ndarray | None = None) -> list[NodeTable]:
        """The merged node table of each datastore candidate (or of none) of active request ``req_id``, with its
        features (``[N, len(FEATURES)]`` float64) and scores exactly as a step merges them: what fitting the
        calibration reads (``python -m evaluation calibrate``; CREST, the calibrated acceptance probability).
        Given ``state`` (``[hidden_size]`` float32, read as :meth:`step` reads a row's; :meth:`set_model` first),
        the model features follow (``[N, len(FEATURES) + len(MODEL_FEATURES)]``), scored as a step with that state
        scores.

        Raises:
            KeyError: when ``req_id`` is not active. ValueError / TypeError: for a state without a model, or of
                another width or dtype. datastore.errors.ClosedError: after :meth:`close`.
        """
        key = door.request_id(req_id)
        trees = crest_native.Trees([[native_tree(m) for m in candidates]], [native_tree(live)], [None])
        if state is not None:
            state = door.states(state[None] if type(state) is np.ndarray and state.ndim == 1 else state, None, 1,
                                self._core.model_width)[0][0]
        with self._lock:
            self._check_open()
            return self._core.tables(self._handle(key), trees, state)

    @property
    def active_requests(self) -> frozenset:
        """The ids of the requests started and not stopped.

        Raises:
            datastore.errors.ClosedError: after :meth:`close`."""
        with self._lock:
            self._check_open()
            return frozenset(self._requests)

    def outputs_info(self) -> dict:
        """This process's output index: ``outputs`` held, ``bytes`` (its size model, what ``outputs_bytes`` bounds),
        ``allocated`` (what its arrays hold allocated), ``max_bytes``, ``evictions``.

        Raises:
            datastore.errors.ClosedError: after :meth:`close`."""
        with self._lock:
            self._check_open()
            info = self._core.outputs_info()
        return {k: getattr(info, k) for k in ("outputs", "bytes", "allocated", "max_bytes", "evictions")}

    def step_seconds(self) -> dict[str, float]:
        """Seconds spent so far, by part of the step (:meth:`drafting.retrieval.DatastoreTrees.step_seconds`).

        Raises:
            datastore.errors.ClosedError: after :meth:`close`."""
        with self._lock:
            self._check_open()
        return self.retrieval.step_seconds()

    def config(self) -> dict:
        """Everything that changes the drafts: the scorer, the sources and the core's settings, the cut and what the
        lookups serve.

        Raises:
            datastore.errors.ClosedError: after :meth:`close` (nothing is reopened)."""
        with self._lock:
            self._check_open()
        core = {k: getattr(self.options, k) for k in DEFAULTS if k != "sources"}
        return {"name": self.name, "calibration": self.calibration.digest(), "sources": list(self.sources),
                "core": core, "min_score": self.min_score, "source": self.retrieval.identity()}

    def close(self) -> None:
        """Release what the drafter opened (its datastores, its writer, their threads), within about a second; final:
        any later call raises :class:`datastore.errors.ClosedError` (a second ``close`` does nothing)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.retrieval.close()
        if self.live_writer is not None:
            self.live_writer.close()

    def _check_open(self) -> None:
        """Under the lock: raise when the drafter was closed."""
        if self._closed:
            raise ClosedError(f"this {self.name} drafter was closed (close() or the end of its with block); open a new "
                              "one")

    def _handle(self, key: RequestId) -> int:
        try:
            return self._requests[key]
        except KeyError:
            raise KeyError(f"request {key!r} is not active; start_request it first") from None

    def _hold(self) -> None:
        """Before a fork: wait for a call in flight on another thread, so the child inherits a consistent table."""
        self._lock.acquire()

    def _release(self) -> None:
        """After a fork, in the parent and in the child (the thread that forked holds the lock in both)."""
        self._lock.release()

    def __enter__(self) -> DraftingService:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
