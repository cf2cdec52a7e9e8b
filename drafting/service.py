"""The drafting service: the one request-keyed, batch-first lifecycle every drafter shares, and the one request table.

Shaped after ArcticInference's suffix decoding (a request-keyed lifecycle over a native core that owns the data,
https://github.com/snowflakedb/ArcticInference, ``arctic_inference/suffix_decoding``) and vLLM's batch-first
proposers (``vllm/v1/spec_decode``):

- :meth:`DraftingService.start_request` puts the request's prompt in the native core (its tokens and their suffix
  automaton; the method's own state, if it keeps one, beside the handle);
- :meth:`DraftingService.propose` drafts for a batch of rows ``(req_id, budget)``: the service holds every request's
  tokens, so a caller passes only which requests and how many nodes; the method (:mod:`drafting.method`) drafts the
  batch, the merged drafter (:class:`drafting.merged.MergedMethod`) in one native call;
- :meth:`DraftingService.add_tokens` appends the tokens the target committed (bonus token included), or, for an engine
  that passes each row's whole sequence and no request id, :meth:`DraftingService.follow_rows` appends only the new
  ones (:class:`serving.RowTracker`);
- :meth:`DraftingService.stop_request` forgets it: its output joins this process's output index (and the method's
  :meth:`~drafting.method.DraftMethod.stopped`, the live layer's writer for the merged drafter);
  :meth:`DraftingService.learn_outputs` adds outputs finished elsewhere (the fleet's, :class:`drafting.OutputFeed`).

Every argument is checked once, at this door (:mod:`drafting.door`). The same object drafts for the HF decoding loop
(:func:`decoder.speculative_generate`), the replay simulator, the benchmarks and the vLLM proposer.

Thread-safe: one lock guards the table and every call on the native core (a step's native work runs with the GIL
released; the merged drafter's round trip runs outside the lock). A request stopped while another thread drafts for it
gets an empty draft for its row.

Fork-safe: ``os.fork`` waits for a call in flight on another thread (the lock is taken around the fork), so a child
inherits a consistent table and a free lock, and drafts on its own (the method opens its own connections there:
:class:`drafting.source.DatastoreSource`). :meth:`DraftingService.close` is final: any later call raises
:class:`datastore.errors.ClosedError`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

import numpy as np

from datastore.context import TokenIds
from datastore.errors import ClosedError, InvalidContext
from toolkit.forks import at_fork

from . import door
from .door import RequestId
from .draft import ChainDrafts, CostCurve, Drafts, ScoreKind
from .method import DraftMethod, Follow, FollowedStep, Step

__all__ = ["DraftingService", "STEP_TIMES_KEPT", "ServiceStats", "SteadyBatch"]

STEP_TIMES_KEPT = 10_000
"""Steps whose seconds :class:`ServiceStats` keeps one by one."""

T = TypeVar("T")


@dataclass
class ServiceStats:
    """Cumulative figures of a service (seconds are wall-clock, summed over calls).

    Attributes:
        steps: :meth:`DraftingService.propose` calls. drafts: drafts returned. nodes: draft nodes returned.
        step_s: whole ``propose`` calls. step_times: the last :data:`STEP_TIMES_KEPT` calls' seconds, one each
            (bounded: a service lives as long as its server).
    """

    steps: int = 0
    drafts: int = 0
    nodes: int = 0
    step_s: float = 0.0
    step_times: deque = field(default_factory=lambda: deque(maxlen=STEP_TIMES_KEPT), repr=False)


@dataclass
class _Request:
    handle: int  # the request in the native core
    state: Any   # the method's own state (None: none)


class DraftingService:
    """A drafter: a request table and a drafting method (:class:`drafting.Drafter`).

    Args:
        method: how it drafts (:class:`drafting.merged.MergedMethod`, the merged drafter:
            :meth:`~drafting.merged.MergedMethod.open` composes it for a datastore name; or a paper's drafter,
            :mod:`drafting.drafters`; or S4C's heads, :mod:`s4c`).
        vocab_size: token ids are checked to be below this where they enter (``len(tokenizer)``; an engine's model's
            vocabulary when it is larger), >= 1.

    Attributes:
        name / score_kind / hidden_states: the method's. stats: :class:`ServiceStats`.

    Raises:
        ValueError: when ``vocab_size < 1``; as the method's core settings.
    """

    def __init__(self, method: DraftMethod, *, vocab_size: int) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 1 <= vocab_size <= 1 << 32:
            raise ValueError(f"vocab_size={vocab_size!r}: pass the tokenizer's vocabulary size (len(tokenizer)), an "
                             "int in 1..2**32")
        self.method = method
        self.name, self.score_kind, self.hidden_states = method.name, method.score_kind, method.hidden_states
        self.vocab_size = vocab_size
        self._core = method.core_settings().core()
        self._requests: dict[RequestId, _Request] = {}
        self._stateful = 0  # active requests whose method state is not None (they learn followed tokens)
        self._steady: tuple[list, np.ndarray] | None = None  # the last steady step's requests and their handles
        self._lock = threading.Lock()
        self._closed = False
        self.stats = ServiceStats()
        at_fork(self, before=DraftingService._hold, after_in_parent=DraftingService._release,
                after_in_child=DraftingService._release)

    # -- the request table --------------------------------------------------------------------------------------

    def start_request(self, req_id: RequestId, prompt_ids: TokenIds) -> None:
        """Start drafting for ``req_id`` from ``prompt_ids`` (the prompt, and any output already generated).

        Args:
            req_id: an ``int`` (64-bit) or ``str``. prompt_ids: a list, tuple or 1-D integer array of token ids.

        Raises:
            ValueError: when ``req_id`` is already active. TypeError: for a ``req_id`` that is no request id.
            datastore.errors.InvalidContext: when ``prompt_ids`` is not a sequence of token ids of the vocabulary.
        """
        key, prompt = door.request_id(req_id), door.token_ids(prompt_ids, self.vocab_size, "prompt_ids")
        with self._lock:
            self._check_open()
            if key in self._requests:
                raise ValueError(f"request {key!r} is already active; stop_request it first")
            state = self.method.start(prompt)
            self._requests[key] = _Request(self._core.start(prompt), state)
            self._steady = None
            self._stateful += state is not None

    def add_tokens(self, req_id: RequestId, tokens: TokenIds) -> None:
        """Append the tokens the target committed for ``req_id`` (bonus token included).

        Raises:
            KeyError: when ``req_id`` is not active (start_request it first).
            datastore.errors.InvalidContext: when ``tokens`` is not a sequence of token ids of the vocabulary.
        """
        key, checked = door.request_id(req_id), door.token_ids(tokens, self.vocab_size, "tokens")
        with self._lock:
            self._check_open()
            r = self._get(key)
            self._core.extend(r.handle, checked)
            self.method.extend(r.state, checked)

    def follow_rows(self, req_ids: Sequence[RequestId | None], tokens: np.ndarray, lengths: np.ndarray,
                    index: Sequence[int], *, vocab_size: int | None = None) -> list[bool]:
        """An engine's rows, each a request's whole sequence so far: where request ``req_ids[i]``'s tokens are the
        first of row ``index[i]`` (``tokens[index[i], :lengths[index[i]]]``), the rest are appended to it; else it is
        left as it was. Pairs are tried in order, and one whose row or request an earlier pair of the call followed is
        skipped: each row holds one request and each request one row, so a request that may have moved can be tried
        against several rows (and several requests against one row) in one call. One native call for the batch: a
        compare of each request's known tokens with its row, a check of the new ids and a copy of them. What an engine
        that passes no request ids keys its rows by (:class:`serving.RowTracker`). New ids are checked against the
        engine model's vocabulary (``vocab_size``; a model's may be larger than its tokenizer's), else below 2**31.

        Args:
            req_ids: the request of each pair (``None`` or a request not active: it follows nothing), as
                :meth:`start_request` takes ids.
            tokens: ``[rows, max_len]`` int32 or int64. lengths: ``[>= rows]``, the same dtype: each row's count.
            index: the row of each pair (ints).
            vocab_size: the engine model's vocabulary size (``None``: ids below 2**31).

        Returns:
            ``[len(req_ids)]``: whether each pair's request followed its row.

        Raises:
            datastore.errors.InvalidContext: for arrays of another shape or dtype, lengths outside a row, rows outside
                the arrays, or a new id outside ``[0, vocab_size)`` (naming the row and the id; nothing is followed).
            TypeError / ValueError: for ``req_ids`` that are not a sequence of request ids (or ``None``), one per row
                of ``index``, or a ``vocab_size`` that is not an int in ``1..2**32``.
            datastore.errors.ClosedError: after :meth:`close`.
        """
        rows, counts, at = door.engine_rows(tokens, lengths, index)
        req_ids = door.engine_request_ids(req_ids, len(at))
        limit = door.engine_vocab(vocab_size)
        return self._follow(req_ids, rows, at, counts, limit)

    def _follow(self, req_ids: Sequence[RequestId | None], rows: np.ndarray, at: np.ndarray, counts: np.ndarray,
                limit: int) -> list[bool]:
        """:meth:`follow_rows` with its arguments checked."""
        with self._lock:
            self._check_open()
            requests = self._requests
            entries = [None if r is None else requests.get(r) for r in req_ids]  # None: none, or not active
            handles = np.array([-1 if e is None else e.handle for e in entries], np.int64)
            stateful = [e for e in entries if e is not None and e.state is not None] if self._stateful else []
            before = {id(e): self._core.count(e.handle) for e in stateful}
            followed, bad, bad_id = self._core.follow_rows(handles, rows, at, counts, limit)
            if followed is None:
                raise _bad_new_id(req_ids, at, limit, bad, bad_id)
            for e in stateful:  # a method with its own state learns the new tokens
                if self._core.count(e.handle) != before[id(e)]:
                    self.method.extend(e.state, self._core.tokens(e.handle, before[id(e)]))
        return followed

    def follow_and_propose(self, req_ids: Sequence[RequestId | None], tokens: np.ndarray, lengths: np.ndarray,
                           index: Sequence[int] | None, budgets: np.ndarray | Sequence[int], *,
                           min_score: float | None = None, vocab_size: int | None = None,
                           curve: CostCurve | None = None) -> tuple[list[bool], ChainDrafts | None]:
        """An engine's steady step: :meth:`follow_rows`, then, when every pair followed, each pair's request's chain
        (:meth:`propose` with ``chain=True``), ``budgets[i]`` tokens for pair ``i``, as an engine takes them. One
        native call where the method can (the merged drafter once its replicas are mapped:
        ``Core.follow_draft_stored``, which checks the rows, counts and budgets itself before anything changes; the
        checks here run only when it refuses them, to name the fault), else a call each.

        Args:
            req_ids / tokens / lengths / vocab_size: as :meth:`follow_rows`.
            index: as :meth:`follow_rows`, or ``None``: pair ``i`` on row ``i`` (every row of an engine's batch).
            budgets: ``[len(req_ids)]`` ints (an int64 array is passed as it is; any other integer array or sequence
                is converted), each in ``0..MAX_BUDGET``.
            min_score / curve: as :meth:`propose`.

        Returns:
            ``(followed, chains)``: as :meth:`follow_rows`, and the pairs' chains (a
            :class:`drafting.draft.ChainDrafts`, in pair order), or ``None`` when a pair did not follow (nothing
            drafted: start or move its request, then :meth:`propose`).

        Raises:
            As :meth:`follow_rows` and :meth:`propose` (a request not active follows nothing; it raises no
            ``KeyError``). ValueError: for a malformed ``curve``.
        """
        start = time.perf_counter()
        limit = door.engine_vocab(vocab_size)
        cut = self._cut(min_score)
        curve = door.curve(curve, True)
        if type(budgets) is not np.ndarray or budgets.dtype != np.int64:
            budgets = door.budgets(budgets, len(req_ids))
        pairs = range(len(req_ids)) if index is None else index  # each pair's row
        with self._lock:
            self._check_open()
            handles = self._steady_handles(req_ids)
        if handles is not None:
            at = None if index is None else door.engine_rows(tokens, lengths, index)[2]  # a part of the batch
            step = Step(self._core, self._lock, handles, (), budgets, True, cut, curve)
            try:
                made = self._draft_following(step, Follow(tokens, at, lengths, limit), start)
            except (TypeError, ValueError):  # refused by the native call: name the fault as the door does, or retry
                rows, counts, at = door.engine_rows(tokens, lengths, pairs)
                door.budgets(budgets, len(at))
                made = self._draft_following(step, Follow(rows, at, counts, limit), start)
            if made is not None:
                followed, bad, bad_id, chains = made
                if followed is None:
                    raise _bad_new_id(req_ids, np.asarray(pairs), limit, bad, bad_id)
                return followed, chains
        rows, counts, at = door.engine_rows(tokens, lengths, pairs)
        req_ids = door.engine_request_ids(req_ids, len(at))
        door.budgets(budgets, len(at))
        followed = self._follow(req_ids, rows, at, counts, limit)
        if not all(followed):
            return followed, None
        ids = cast("list[RequestId]", list(req_ids))  # every pair followed: none is None
        return followed, self.propose(list(zip(ids, budgets.tolist())), chain=True, min_score=min_score,
                                      curve=curve).chains()

    def steady_batch(self, req_ids: Sequence[RequestId], *, min_score: float | None = None,
                     vocab_size: int | None = None) -> SteadyBatch | None:
        """An engine's whole batch, pair ``i`` on row ``i``, prepared for its steady steps
        (:meth:`SteadyBatch.draft`: :meth:`follow_and_propose` with ``index=None``, its per-batch work done once here);
        ``None`` when the batch cannot be drafted in one native call (a request not active, or one that keeps a method
        state). vLLM's persistent batch is the model: what holds from step to step is checked once.

        Args:
            req_ids: ``[rows]`` the request on each row, every one active.
            min_score / vocab_size: as :meth:`follow_and_propose`, fixed for the batch.

        Raises:
            As :meth:`follow_and_propose` for ``req_ids``, ``min_score`` and ``vocab_size``.
            datastore.errors.ClosedError: after :meth:`close`.
        """
        limit = door.engine_vocab(vocab_size)
        cut = self._cut(min_score)
        with self._lock:
            self._check_open()
            handles = self._steady_handles(req_ids)
            key = self._steady
        if handles is None or key is None:
            return None
        return SteadyBatch(self, key, Step(self._core, self._lock, handles, (), _NO_BUDGETS, True, cut),
                           Follow(_NO_ROWS, None, _NO_BUDGETS, limit))

    def _steady_handles(self, req_ids: Sequence[RequestId | None]) -> np.ndarray | None:
        """``[len(req_ids)]`` int64: each request's handle in the core, when every one is active and no request keeps
        a method state (a steady step may then follow and draft in one call); else ``None``. Kept between two calls
        while the requests are the same and none was started or stopped meanwhile (call under the lock)."""
        if self._stateful:
            return None
        if self._steady is not None and self._steady[0] == req_ids:
            return self._steady[1]
        ids = door.engine_request_ids(req_ids, len(req_ids))
        entries = [None if r is None else self._requests.get(r) for r in ids]
        if None in entries:
            return None
        handles = np.array([e.handle for e in entries], np.int64)  # type: ignore[union-attr]
        handles.setflags(write=False)
        self._steady = (list(ids), handles)
        return handles

    def _draft_following(self, step: Step, follow: Follow, start: float) -> FollowedStep | None:
        """The method's one call for a steady step (:meth:`drafting.method.DraftMethod.draft_following`), counted (for
        :meth:`follow_and_propose` and :meth:`SteadyBatch.draft`)."""
        made = self.method.draft_following(step, follow)
        if made is not None and made[3] is not None:
            self._count(len(step.handles), made[3].nodes, start)
        return made

    def add_hidden_states(self, req_id: RequestId, hidden: Any) -> None:
        """Append the target's hidden states of ``req_id``'s next positions, for a method that reads them (S4C's heads;
        see :class:`drafting.lifecycle.Drafter`).

        Raises:
            TypeError: when the method reads none. KeyError: when ``req_id`` is not active.
            TypeError / ValueError: for anything but a ``[n, hidden_size]`` float tensor or array (the method's check).
        """
        if not self.hidden_states:
            raise TypeError(f"the {self.name} drafter reads no hidden states")
        key = door.request_id(req_id)
        with self._lock:
            self._check_open()
            self.method.add_hidden_states(self._get(key).state, hidden)

    def stop_request(self, req_id: RequestId) -> None:
        """Forget ``req_id`` (one not active is ignored); its output joins this process's output index, and the method
        is told (the merged drafter hands it to the live layer's writer)."""
        key = door.request_id(req_id)
        with self._lock:
            self._check_open()
            r = self._requests.pop(key, None)
            self._steady = None
            if r is None:
                return
            output = self._core.stop(r.handle)
            self._stateful -= r.state is not None
        self.method.stopped(r.state, output)

    def learn_outputs(self, outputs: Sequence[TokenIds]) -> int:
        """Put outputs finished elsewhere in this process's output index, as if its own requests had generated them:
        another process's of the fleet, or an earlier run's (:class:`drafting.OutputFeed` feeds the live layer's).
        SuffixDecoding's global tree of earlier responses (https://arxiv.org/abs/2411.04975, §3), fed by the fleet.
        The method is not told: they are not this process's to hand on.

        Args:
            outputs: each a list, tuple or 1-D integer array of token ids (the generated tokens, not the prompt); an
                empty one is skipped.

        Returns:
            The tokens added.

        Raises:
            datastore.errors.InvalidContext: naming ``outputs[i]`` and the id, for an output that is not a sequence
                of token ids of the vocabulary (none of the outputs is added).
            TypeError: when ``outputs`` is not a sequence.
            datastore.errors.ClosedError: after :meth:`close`.
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

    def tokens(self, req_id: RequestId) -> np.ndarray:
        """The tokens the drafter holds for ``req_id`` (its prompt and everything committed since), as ``[N]`` uint32
        (a copy).

        Raises:
            KeyError: when ``req_id`` is not active.
        """
        key = door.request_id(req_id)
        with self._lock:
            self._check_open()
            return self._core.tokens(self._get(key).handle, 0)

    @property
    def active_requests(self) -> frozenset:
        """The ids of the requests started and not stopped."""
        with self._lock:
            return frozenset(self._requests)

    def _check_open(self) -> None:
        """Under the lock: raise when the service was closed."""
        if self._closed:
            raise ClosedError(f"this {self.name} drafter was closed (close() or the end of its with block); open a new "
                              "one")

    def _get(self, key: RequestId) -> _Request:
        try:
            return self._requests[key]
        except KeyError:
            raise KeyError(f"request {key!r} is not active; start_request it first") from None

    # -- drafting -----------------------------------------------------------------------------------------------

    def propose(self, batch: Sequence[tuple[RequestId, int]], *, chain: bool = False,
                min_score: float | None = None, curve: CostCurve | None = None) -> Drafts:
        """One draft per row ``(req_id, budget)`` of the batch, each of at most ``budget`` nodes (0: none).

        Args:
            batch: the rows: an active request and its budget, an int in ``0..MAX_BUDGET``
                (:data:`crest_native.MAX_BUDGET`).
            chain: each row's best path (at most ``budget`` tokens) instead of a tree: a ``bool`` (or ``numpy.bool_``).
            min_score: this step's cut, a probability in [0, 1]: nodes whose acceptance probability is below it are
                not drafted (``None``: the method's own setting). Only methods whose scores are probabilities
                (``score_kind``) take a positive cut.
            curve: an engine's step-cost curve: the chains are cut to the batch's draft tokens that maximise its
                expected tokens per second (SmartSpec's goodput, :func:`crest_native.goodput_keep`), each request's
                scores discounted by what the engine accepted of its earlier drafts where the method keeps that (the
                merged drafter: ``csrc/feedback.hpp``); ``None``: not cut. Chains only.

        Returns:
            ``[len(batch)]`` drafts (a :class:`drafting.draft.Drafts`: a sequence of :class:`Draft`, and the token
            ids of all at once), best first; empty for a row whose request was stopped meanwhile.

        Raises:
            KeyError: when a request is not active when the call starts.
            TypeError / ValueError: for a malformed row (naming it), a budget that is not an int in
                ``0..MAX_BUDGET``, a ``chain`` that is not a bool, a ``min_score`` outside [0, 1], or a positive
                ``min_score`` given to a method whose scores are not probabilities, or a ``curve`` with
                ``chain=False`` or malformed.
            datastore.errors.ClosedError: after :meth:`close` (every method raises it then).
        """
        start = time.perf_counter()
        ids, budgets = door.rows(batch)
        chain = door.chain(chain)
        cut = self._cut(min_score)
        curve = door.curve(curve, chain)
        with self._lock:
            self._check_open()
            requests = self._requests
            try:
                entries = [requests[rid] for rid in ids]
            except KeyError as exc:
                raise KeyError(f"request {exc.args[0]!r} is not active; start_request it first") from None
        handles = np.array([e.handle for e in entries], np.int64)
        made = self.method.draft(Step(self._core, self._lock, handles, [e.state for e in entries], budgets, chain,
                                      cut, curve))
        drafts = made if isinstance(made, Drafts) else Drafts.of(made, self.score_kind)
        if curve is not None and not self.method.cuts_to_curve:
            drafts = drafts.goodput(curve, len(drafts))
        self._count(len(drafts), drafts.nodes, start)
        return drafts

    def _cut(self, min_score: object) -> float | None:
        """A step's cut, checked: ``None`` (the method's own) or a probability this method's scores can take."""
        cut = None if min_score is None else door.min_score(min_score)
        if cut and self.score_kind is not ScoreKind.PROBABILITY:
            raise ValueError(f"min_score={cut} is a probability; the {self.name} drafter's scores are "
                             f"{self.score_kind.value}")
        return cut

    def _count(self, drafts: int, nodes: int, start: float) -> None:
        """Add a step's ``drafts`` drafts of ``nodes`` nodes in all, begun at ``start`` (``time.perf_counter``), to
        :attr:`stats`."""
        spent = time.perf_counter() - start
        with self._lock:
            st = self.stats
            st.steps += 1
            st.drafts += drafts
            st.nodes += nodes
            st.step_s += spent
            st.step_times.append(spent)

    def read_request(self, req_id: RequestId, read: Callable[[Any, int], T]) -> T:
        """``read(core, handle)`` for active request ``req_id`` under the service's lock: what a method reads of a
        request's state in the native core (``crest_native.Core``; ``handle`` its request), as
        :meth:`drafting.merged.MergedMethod.node_tables` does. ``read`` must not keep either past the call.

        Raises:
            KeyError: when ``req_id`` is not active. datastore.errors.ClosedError: after :meth:`close`.
        """
        key = door.request_id(req_id)
        with self._lock:
            self._check_open()
            return read(self._core, self._get(key).handle)

    def outputs_info(self) -> dict:
        """This process's output index: ``outputs`` held, ``bytes`` (its size model, what ``max_bytes`` bounds),
        ``allocated`` (what its arrays hold allocated), ``max_bytes``, ``evictions``."""
        with self._lock:
            return dict(self._core.outputs_info())

    def step_seconds(self) -> dict[str, float]:
        """Seconds spent so far, by part of the step (the method's parts)."""
        return self.method.step_seconds()

    def config(self) -> dict:
        """Everything that changes the drafts (the method's description)."""
        return self.method.config()

    def close(self) -> None:
        """Release what the method opened (its lookups, its writer, their threads), within about a second; final:
        any later call raises :class:`datastore.errors.ClosedError` (a second ``close`` does nothing)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._steady = None  # every SteadyBatch goes stale: its next step takes the checked path, which raises
        self.method.close()

    # -- os.fork ----------------------------------------------------------------------------------------------

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



_NO_BUDGETS = np.zeros(0, np.int64)
_NO_ROWS = np.zeros((0, 0), np.int32)


class SteadyBatch:
    """An engine's batch (pair ``i`` on row ``i``) whose rows hold the requests they held when it was prepared
    (:meth:`DraftingService.steady_batch`), drafted a step at a time in one native call with nothing re-checked that
    held since: the requests' handles, the cut and the id limit are fixed; the step's budgets and curve are checked when
    they change (an engine passes the same objects from step to step), and the rows, counts and budgets by the native
    call itself. It goes stale, and :meth:`draft` answers ``None``, once the service starts or stops a request, prepares
    another batch, or is closed.

    Not thread-safe: one engine thread steps one batch (the service's lock guards the core, as for every call).

    Attributes:
        ids: ``[rows]`` the request on each row (read only).
    """

    __slots__ = ("_follow", "_key", "_service", "_step", "ids")

    def __init__(self, service: DraftingService, key: tuple[list, np.ndarray], step: Step, follow: Follow) -> None:
        self._service, self._key, self._step, self._follow = service, key, step, follow
        self.ids: Sequence[RequestId] = key[0]

    def draft(self, tokens: np.ndarray, lengths: np.ndarray,
              budgets: np.ndarray | Sequence[int],
              curve: CostCurve | None = None) -> tuple[list[bool], ChainDrafts | None] | None:
        """:meth:`DraftingService.follow_and_propose` of this batch (``index=None``), or ``None`` when the batch is
        stale, the method cannot draft the step in one native call now (replicas not mapped), or the native call
        refused the arrays (the checked path then names the fault): call :meth:`DraftingService.follow_and_propose`.

        Args:
            tokens / lengths / budgets / curve: as :meth:`DraftingService.follow_and_propose`, one row per request.

        Returns:
            ``(followed, chains)``, as :meth:`DraftingService.follow_and_propose`, or ``None``.

        Raises:
            datastore.errors.InvalidContext: for a new id outside ``[0, vocab_size)`` (nothing is followed).
            TypeError / ValueError: for a malformed ``budgets`` or ``curve``.
        """
        service = self._service
        if service._steady is not self._key:
            return None
        step, follow = self._step, self._follow
        if budgets is not step.budgets or curve is not step.curve:
            if type(budgets) is not np.ndarray or budgets.dtype != np.int64:
                budgets = door.budgets(budgets, len(self.ids))
            step = self._step = replace(step, budgets=budgets, curve=door.curve(curve, True))
        if tokens is not follow.rows or lengths is not follow.lengths:
            follow = self._follow = follow._replace(rows=tokens, lengths=lengths)
        try:
            made = service._draft_following(step, follow, time.perf_counter())
        except (TypeError, ValueError):
            return None
        if made is None:
            return None
        followed, bad, bad_id, chains = made
        if followed is None:
            raise _bad_new_id(self.ids, np.arange(len(self.ids)), follow.limit, bad, bad_id)
        return followed, chains


def _bad_new_id(req_ids: Sequence[RequestId | None], at: np.ndarray, limit: int, bad: int,
                bad_id: int) -> InvalidContext:
    """The error for pair ``bad``'s new id ``bad_id`` outside ``[0, limit)`` (nothing was followed)."""
    return InvalidContext(f"row {int(at[bad])} holds token id {bad_id} (outside 0..{limit - 1}) after request "
                          f"{req_ids[bad]!r}'s tokens; pass the engine's ids (and its model's vocab_size); nothing was "
                          "followed")
