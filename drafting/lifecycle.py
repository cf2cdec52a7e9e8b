"""The drafter interface: one request-keyed, batch-first lifecycle for every drafter (after ArcticInference's suffix
decoding, ``start_request`` / ``speculate`` / ``stop_request``, and vLLM's batch-first proposers).

A drafter serves many requests at once and holds each one's tokens itself. ``start_request`` with the prompt, then per
verification step ``propose`` a draft for each row of a batch, ``(req_id, budget)``; then ``add_tokens`` with the
tokens the target committed (bonus token included), and ``stop_request``. A drafter that reads the target's hidden
states (``hidden_states``: S4C's heads) is also handed, after ``start_request`` and after each ``add_tokens``, the
target's final-normed last hidden state at every committed position whose state verification computed: all but the
request's last token (whose state the next verification pass computes). ``config`` names everything that changes the
drafts (the budget cache keys on it), ``step_seconds`` what a step spent by part, ``close`` releases what it opened.

The HF decoding loop, the replay simulator, the benchmarks and the vLLM proposer drive drafters through these calls;
:class:`drafting.DraftingService` implements them once, for every method.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from datastore.context import TokenIds

from .door import RequestId
from .draft import Draft, ScoreKind

__all__ = ["Drafter"]


class Drafter(Protocol):
    """What the speculative decoder, the replay and the serving layer need from a drafter (see the module docstring)."""

    name: str
    score_kind: ScoreKind
    hidden_states: bool

    def start_request(self, req_id: RequestId, prompt_ids: TokenIds) -> None:
        """Start drafting for ``req_id`` from its prompt token ids (``ValueError`` when already active)."""

    def add_tokens(self, req_id: RequestId, tokens: TokenIds) -> None:
        """Append the tokens the target committed for ``req_id``."""

    def add_hidden_states(self, req_id: RequestId, hidden: Any) -> None:
        """Append ``hidden``, ``[n, hidden_size]`` float (a ``torch.Tensor`` or numpy array), the target's states of the
        request's next ``n`` positions (only when ``hidden_states``)."""

    def propose(self, batch: Sequence[tuple[RequestId, int]], *, chain: bool = False,
                min_score: float | None = None) -> Sequence[Draft]:
        """One draft per row ``(req_id, budget)``: at most ``budget`` nodes (a tree) or tokens (``chain``), each node's
        acceptance probability at least ``min_score`` (probability-scored drafters only)."""

    def stop_request(self, req_id: RequestId) -> None:
        """Forget ``req_id`` (one not active is ignored)."""

    def config(self) -> dict:
        """JSON-ready description of everything that changes this drafter's drafts."""

    def step_seconds(self) -> dict[str, float]:
        """Seconds spent so far drafting, by part of the step."""

    def close(self) -> None:
        """Release what the drafter opened (connections, writers)."""
