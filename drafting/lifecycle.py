"""The drafter interface: one request-keyed, batch-first lifecycle for every drafter (after ArcticInference's suffix
decoding, ``start_request`` / ``speculate`` / ``stop_request``, and vLLM's batch-first proposers).

A drafter serves many requests at once and holds each one's tokens itself: ``start_request`` with the prompt, then per
verification step one ``step`` for a batch of requests, with the tokens each committed since (the accepted path and the
bonus token) and its budget, then ``stop_request``. ``config`` names everything that changes the drafts, ``close``
releases what it opened. The HF decoding loop, the replay simulator and the benchmarks drive drafters through these
calls: :class:`drafting.DraftingService` (the merged drafter) implements them over the native core, and
:class:`TokenDrafter` for a drafter written in Python (a peer's, a paper's baseline), which drafts from each request's
tokens.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from datastore.context import TokenIds

from . import door
from .door import RequestId
from .draft import Draft, Drafts, ScoreKind

__all__ = ["Drafter", "StepDrafts", "TokenDrafter"]


class StepDrafts(Protocol):
    """What a step returns: ``followed`` (``[rows]`` bools) and, when every request followed, ``drafts``."""

    followed: list[bool]

    @property
    def drafts(self) -> Sequence[Draft]:
        """``[rows]`` drafts."""


class Drafter(Protocol):
    """What the speculative decoder, the replay and the serving layer need from a drafter (see the module docstring)."""

    name: str

    def start_request(self, req_id: RequestId, prompt_ids: TokenIds) -> None:
        """Start drafting for ``req_id`` from its prompt token ids (``ValueError`` when already active)."""

    def step(self, requests: Sequence[RequestId], budgets: Sequence[int], *, tokens: Sequence[TokenIds] | None = None,
             chain: bool = False) -> StepDrafts:
        """Follow each request's new tokens, then one draft per request of at most ``budgets[i]`` nodes (a tree) or
        tokens (``chain``)."""

    def stop_request(self, req_id: RequestId) -> None:
        """Forget ``req_id`` (one not active is ignored)."""

    def config(self) -> dict:
        """JSON-ready description of everything that changes this drafter's drafts."""

    def close(self) -> None:
        """Release what the drafter opened (connections, writers)."""


class _Drafted:
    """A :class:`TokenDrafter` step's result: every request followed."""

    def __init__(self, drafts: Drafts) -> None:
        self.followed, self.drafts = [True] * len(drafts), drafts


class TokenDrafter(ABC):
    """The lifecycle of a drafter written in Python, which drafts from each request's tokens: a subclass implements
    :meth:`draft` (and may keep a state per request: :meth:`started`, :meth:`extended`, :meth:`stopped`).

    Args:
        vocab_size: token ids are checked to be below this where they enter, in ``1..2**32``.

    Raises:
        ValueError: for a ``vocab_size`` out of range.
    """

    name = "python"
    score_kind = ScoreKind.NONE

    def __init__(self, *, vocab_size: int) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 1 <= vocab_size <= 1 << 32:
            raise ValueError(f"vocab_size={vocab_size!r}: pass the tokenizer's vocabulary size, an int in 1..2**32")
        self.vocab_size = vocab_size
        self._tokens: dict[RequestId, list[int]] = {}
        self._states: dict[RequestId, object] = {}

    def start_request(self, req_id: RequestId, prompt_ids: TokenIds) -> None:
        """Start ``req_id`` from its prompt.

        Raises:
            ValueError: when already active. datastore.errors.InvalidContext: for ids outside the vocabulary.
        """
        key = door.request_id(req_id)
        prompt = door.token_ids(prompt_ids, self.vocab_size, "prompt_ids")
        if key in self._tokens:
            raise ValueError(f"request {key!r} is already active; stop_request it first")
        self._tokens[key] = prompt.tolist()
        self._states[key] = self.started(prompt)

    def step(self, requests: Sequence[RequestId], budgets: Sequence[int], *, tokens: Sequence[TokenIds] | None = None,
             chain: bool = False, min_score: float | None = None) -> _Drafted:
        """Append each request's new tokens, then :meth:`draft` each.

        Raises:
            KeyError: when a request is not active. TypeError / ValueError: for malformed arguments, naming them.
            datastore.errors.InvalidContext: for new ids outside the vocabulary.
        """
        ids = door.request_ids(requests)
        sizes = door.budgets(budgets, len(ids)).tolist()
        chained = door.chain(chain)
        if min_score:
            raise ValueError(f"min_score={min_score} is a probability; the {self.name} drafter's scores are "
                             f"{self.score_kind.value}")
        for rid in ids:
            if rid not in self._tokens:
                raise KeyError(f"request {rid!r} is not active; start_request it first")
        if tokens is not None:
            new, counts = door.token_lists(tokens, len(ids), self.vocab_size)
            at = 0
            for rid, n in zip(ids, counts.tolist()):
                if n:
                    self._tokens[rid].extend(new[at:at + n].tolist())
                    self.extended(self._states[rid], new[at:at + n])
                at += n
        out = [self.draft(self._states[rid], self._tokens[rid], b, chained) if b > 0 else Draft.empty(self.score_kind)
               for rid, b in zip(ids, sizes)]
        return _Drafted(Drafts.of(out, self.score_kind))

    def stop_request(self, req_id: RequestId) -> None:
        """Forget ``req_id`` (one not active is ignored)."""
        key = door.request_id(req_id)
        tokens = self._tokens.pop(key, None)
        if tokens is not None:
            self.stopped(self._states.pop(key), tokens)

    def tokens(self, req_id: RequestId) -> np.ndarray:
        """``req_id``'s tokens, ``[N]`` uint32 (a copy).

        Raises:
            KeyError: when ``req_id`` is not active.
        """
        return np.asarray(self._tokens[door.request_id(req_id)], np.uint32)

    # -- what a subclass implements -------------------------------------------------------------------------------

    def started(self, prompt: np.ndarray) -> object:
        """A new request's state from its ``[N]`` uint32 prompt (default: none)."""
        return None

    def extended(self, state: object, tokens: np.ndarray) -> None:
        """A request committed ``[n]`` uint32 tokens (default: nothing to do)."""
        return None

    def stopped(self, state: object, tokens: list[int]) -> None:
        """A request ended with ``tokens`` (its prompt and output; default: nothing to do)."""
        return None

    @abstractmethod
    def draft(self, state: object, tokens: list[int], budget: int, chain: bool) -> Draft:
        """One request's draft of at most ``budget`` (>= 1) nodes below its last token, from its ``tokens``."""

    def config(self) -> dict:
        """What changes the drafts (default: the name)."""
        return {"name": self.name}

    def close(self) -> None:
        """Nothing opened (default)."""
        return None
