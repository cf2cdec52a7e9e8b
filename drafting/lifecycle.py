"""The drafter interface: one request-keyed, batch-first lifecycle for every drafter (after ArcticInference's
suffix decoding, ``start_request`` / ``speculate(req_id, context, ...)`` / ``stop_request``, and vLLM's batch-first
proposers), and the checks every entry point makes at the door.

A drafter serves many requests at once. ``start_request`` with the prompt, then per verification step
``propose`` a draft for each row of a batch, ``(req_id, context, budget)``: the request, the token ids the caller
holds for it (its prompt and output so far; a drafter reads only the trailing ones it needs) and its budget; then
``add_tokens`` with the tokens the target committed (bonus token included), and ``stop_request``. The HF decoding
loop, the replay simulator, the benchmarks and the vLLM proposer all drive drafters through these four calls.
``config`` names everything that changes the drafts (the budget cache keys on it).

Request ids are ``int`` (64-bit) or ``str``, as engines key requests. Budgets are ``int`` in ``0..MAX_BUDGET``.

:class:`RequestDrafter` implements the lifecycle once for the papers' drafters (a request table under a lock, the
checks, the errors); the merged drafter (:class:`drafting.service.DraftingService`) keeps its requests in the
native core instead.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from numbers import Integral
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np

from datastore.context import TokenIds, check_array, check_context

from .draft import Draft, ScoreKind

__all__ = ["Drafter", "ReadsHiddenStates", "RequestDrafter", "StatelessDrafter"]

RequestId = int | str
"""How a request is keyed: an ``int`` in the 64-bit range or a ``str``."""
MAX_BUDGET = 1024
"""The largest budget (draft nodes of one request in one step) a drafter takes."""
_ANY_ID = 1 << 32  # the papers' drafters have no vocabulary of their own: ids are checked to be in [0, 2**32)


class Drafter(Protocol):
    """What the speculative decoder, the replay and the serving layer need from a drafter."""

    name: str

    def start_request(self, req_id: RequestId, prompt_ids: TokenIds) -> None:
        """Start drafting for ``req_id`` from its prompt token ids (``ValueError`` when already active)."""

    def propose(self, batch: Sequence[tuple[RequestId, TokenIds, int]], *, chain: bool = False,
                min_score: float | None = None) -> list[Draft]:
        """One draft per row ``(req_id, context, budget)``: at most ``budget`` nodes (a tree) or tokens
        (``chain``), each node's acceptance probability at least ``min_score`` (probability-scored drafters only)."""

    def add_tokens(self, req_id: RequestId, tokens: TokenIds) -> None:
        """Append the tokens the target committed for ``req_id``."""

    def stop_request(self, req_id: RequestId) -> None:
        """Forget ``req_id`` (one not active is ignored)."""

    def config(self) -> dict:
        """JSON-ready description of everything that changes this drafter's drafts."""


@runtime_checkable
class ReadsHiddenStates(Protocol):
    """A drafter that also reads the target's last hidden states (a draft model over them: S4C's heads, :mod:`s4c`).

    The decoding loop and the replay hand it, after ``start_request`` and after each ``add_tokens``, the target's
    final-normed last hidden state at every committed position whose state verification computed: all but the
    request's last token (whose state the next verification pass computes).
    """

    def add_hidden_states(self, req_id: RequestId, hidden: Any) -> None:
        """Append ``hidden``, ``[n, hidden_size]`` float (a ``torch.Tensor`` or numpy array), the states of the
        request's next ``n`` positions."""


def check_request_id(req_id: object, what: str = "req_id") -> RequestId:
    """``req_id`` when it is a request id: an ``int`` in ``[-2**63, 2**63)`` (not a ``bool``) or a ``str``.

    Raises:
        TypeError: for another type. ValueError: for an int outside the 64-bit range.
    """
    if isinstance(req_id, str):
        return req_id
    if isinstance(req_id, bool) or not isinstance(req_id, int):
        raise TypeError(f"{what} {req_id!r} is a {type(req_id).__name__}; key requests by an int or a str")
    if not -(1 << 63) <= req_id < 1 << 63:
        raise ValueError(f"{what} {req_id} is outside the 64-bit integers; key requests by a smaller int or a str")
    return req_id


def _check_budget(budget: object, what: str) -> int:
    if isinstance(budget, bool) or not isinstance(budget, Integral):
        raise TypeError(f"{what} {budget!r} is a {type(budget).__name__}; a budget is an int in 0..{MAX_BUDGET} "
                        "(draft nodes)")
    value = int(budget)
    if not 0 <= value <= MAX_BUDGET:
        raise ValueError(f"{what} {value} is outside 0..{MAX_BUDGET}; pass the draft nodes to verify (0: none)")
    return value


def check_min_score(min_score: object, what: str = "min_score") -> float:
    """``min_score`` as a float when it is a probability in [0, 1] (a real number, not a ``bool``).

    Raises:
        TypeError: for another type. ValueError: outside [0, 1] (NaN included).
    """
    if isinstance(min_score, bool) or not isinstance(min_score, (int, float, np.floating, np.integer)):
        raise TypeError(f"{what} {min_score!r} is a {type(min_score).__name__}; pass a probability in [0, 1]")
    value = float(min_score)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{what}={value}: must be a probability in [0, 1]")
    return value


def check_rows(batch: object, vocab_size: int, tail: int | None) -> tuple[list[RequestId], list[list[int]], list[int]]:
    """A ``propose`` batch checked at the door: ``(req ids, contexts, budgets)``.

    Args:
        batch: a sequence of rows ``(req_id, context, budget)``.
        vocab_size: token ids of the contexts must be below this.
        tail: how many trailing ids of each context the drafter reads (checked and returned; ``None``: all).

    Raises:
        TypeError / ValueError: naming the row (``batch[i]``), what is wrong and the fix; nothing is drafted.
        datastore.errors.InvalidContext: for a context that is not a sequence of token ids in the vocabulary.
    """
    if isinstance(batch, (str, bytes)) or not isinstance(batch, Sequence):
        raise TypeError(f"batch is a {type(batch).__name__}; pass a list of rows (req_id, context, budget)")
    ids, contexts, budgets = [], [], []
    for i, row in enumerate(batch):
        if not isinstance(row, tuple) or len(row) != 3:
            raise TypeError(f"batch[{i}] is {row!r}; each row is a tuple (req_id, context, budget)")
        req_id, context, budget = row
        ids.append(check_request_id(req_id, f"batch[{i}] req_id"))
        n = len(context) if tail is None and hasattr(context, "__len__") else (tail or 0)
        contexts.append(check_context(context, vocab_size, n, f"batch[{i}] context"))
        budgets.append(_check_budget(budget, f"batch[{i}] budget"))
    return ids, contexts, budgets


def token_ids(ids: object, what: str, vocab_size: int = _ANY_ID) -> np.ndarray:
    """Token ids checked (nothing coerced) as a ``[N]`` int64 array.

    Raises:
        datastore.errors.InvalidContext: naming ``what``, for anything but a sequence or 1-D integer array of ids in
            ``[0, vocab_size)``.
    """
    if isinstance(ids, np.ndarray):
        arr = check_array(ids, what)
        if len(arr) and int(arr.max()) >= vocab_size:
            check_context(arr, vocab_size, len(arr), what)  # raises, naming the id
        return arr.astype(np.int64, copy=False)
    n = len(ids) if hasattr(ids, "__len__") else 0
    return np.asarray(check_context(ids, vocab_size, n, what), dtype=np.int64)


S = TypeVar("S")


class RequestDrafter(ABC, Generic[S]):
    """The lifecycle of :class:`Drafter`, implemented once over a per-request state ``S``. Thread-safe:
    the request table is guarded by ``self._lock``, which subclasses also hold while they touch a state.

    Subclasses implement :meth:`_start`, :meth:`_extend`, :meth:`_propose` and :meth:`config`, and say how much of
    each row's context they read (:attr:`context_tokens`).
    """

    name = "drafter"
    score_kind = ScoreKind.NONE
    """What this drafter's scores mean: only ``probability`` drafts take a ``min_score`` cut."""
    context_tokens: int | None = 0
    """Trailing token ids of each row's context the drafter reads (``None``: all of them)."""

    def __init__(self) -> None:
        self._requests: dict[RequestId, S] = {}
        self._lock = threading.RLock()

    @abstractmethod
    def _start(self, prompt_ids: np.ndarray) -> S:
        """A new request's state from its ``[N]`` int64 prompt."""

    @abstractmethod
    def _extend(self, state: S, tokens: np.ndarray) -> None:
        """Append ``[N]`` int64 committed tokens to a state."""

    @abstractmethod
    def _propose(self, states: list[S], contexts: list[list[int]], budgets: list[int], chain: bool,
                 min_score: float | None) -> list[Draft]:
        """One draft per state (called with checked contexts, budgets and cut, outside the lock)."""

    def _stop(self, state: S) -> None:  # noqa: B027 - most drafters keep nothing past a request
        """A request ended (its state is already out of the table)."""

    @abstractmethod
    def config(self) -> dict:
        """JSON-ready description of everything that changes the drafts."""

    def start_request(self, req_id: RequestId, prompt_ids: TokenIds) -> None:
        """Start drafting for ``req_id`` from ``prompt_ids`` (the prompt, and any output already generated).

        Args:
            req_id: an ``int`` or ``str``. prompt_ids: a list, tuple or 1-D integer array of token ids.

        Raises:
            ValueError: when ``req_id`` is already active. TypeError: for a ``req_id`` that is no request id.
            datastore.errors.InvalidContext: when ``prompt_ids`` is not a sequence of token ids (nothing coerced).
        """
        key = check_request_id(req_id)
        state = self._start(token_ids(prompt_ids, "prompt_ids"))
        with self._lock:
            if key in self._requests:
                raise ValueError(f"request {key!r} is already active; stop_request it first")
            self._requests[key] = state

    def add_tokens(self, req_id: RequestId, tokens: TokenIds) -> None:
        """Append the tokens the target committed for ``req_id``.

        Raises:
            KeyError: when ``req_id`` is not active (start_request it first).
            datastore.errors.InvalidContext: when ``tokens`` is not a sequence of token ids (nothing coerced).
        """
        checked = token_ids(tokens, "tokens")
        with self._lock:
            self._extend(self._get(req_id), checked)

    def stop_request(self, req_id: RequestId) -> None:
        """Forget ``req_id`` (a request not active is ignored)."""
        with self._lock:
            state = self._requests.pop(req_id, None)
        if state is not None:
            self._stop(state)

    def propose(self, batch: Sequence[tuple[RequestId, TokenIds, int]], *, chain: bool = False,
                min_score: float | None = None) -> list[Draft]:
        """One draft per row ``(req_id, context, budget)`` of the batch, each of at most ``budget`` nodes (0: none).

        Args:
            batch: the rows: the request, its token ids so far (the drafter reads :attr:`context_tokens` of them)
                and its budget (an int in ``0..MAX_BUDGET``).
            chain: return each request's best path (at most ``budget`` tokens) instead of a tree.
            min_score: this step's cut, a probability in [0, 1]: nodes whose acceptance probability is below
                it are not drafted (``None``: the drafter's own setting). Only drafters whose scores are
                probabilities (``score_kind``) take a positive cut.

        Returns:
            ``[len(batch)]`` drafts, best first.

        Raises:
            KeyError: when a request is not active.
            TypeError / ValueError: for a malformed row (naming it), a budget that is not an int in
                ``0..MAX_BUDGET``, a ``min_score`` outside [0, 1], or a positive ``min_score`` given to a drafter
                whose scores are not probabilities.
            datastore.errors.InvalidContext: for a context that is not a sequence of token ids.
        """
        ids, contexts, budgets = check_rows(batch, _ANY_ID, self.context_tokens)
        if min_score is not None:
            min_score = check_min_score(min_score)
            if min_score > 0 and self.score_kind is not ScoreKind.PROBABILITY:
                raise ValueError(f"min_score={min_score} is a probability; the {self.name} drafter's scores are "
                                 f"{self.score_kind.value}")
        with self._lock:
            states = [self._get(rid) for rid in ids]
        return self._propose(states, contexts, budgets, chain, min_score)

    @property
    def active_requests(self) -> frozenset:
        """The ids of the requests started and not stopped."""
        with self._lock:
            return frozenset(self._requests)

    def _get(self, req_id: RequestId) -> S:
        try:
            return self._requests[req_id]
        except KeyError:
            raise KeyError(f"request {req_id!r} is not active; start_request it first") from None


class StatelessDrafter(RequestDrafter[None]):
    """A drafter that keeps nothing per request: it drafts from each row's context alone."""

    def _start(self, prompt_ids: np.ndarray) -> None:
        return None

    def _extend(self, state: None, tokens: np.ndarray) -> None:
        return None


class NoDrafter(StatelessDrafter):
    """Drafts nothing: every step verifies zero nodes, i.e. plain decoding through the same loop."""

    name = "none"

    def _propose(self, states: list[None], contexts: list[list[int]], budgets: list[int], chain: bool,
                 min_score: float | None) -> list[Draft]:
        return [Draft.empty() for _ in states]

    def config(self) -> dict:
        """Nothing to configure."""
        return {"name": self.name}
