"""The merged drafter with the S4C heads as one more source: each step the heads' candidate tree of every row, with its
probabilities, joins the union of the retrieval sources' trees in the native core, and the calibration fitted with
the heads (:data:`drafting.calibration.HEADS_PATH`) scores every node; the cut keeps what is worth verifying, whichever
source proposed it.
"""

from __future__ import annotations

from collections.abc import Sequence

from datastore.context import TokenIds
from drafting.calibration import HEADS_PATH, RETRIEVAL_SOURCES, Calibration
from drafting.draft import Draft, ScoreKind
from drafting.heads import HeadTree
from drafting.lifecycle import RequestId, check_rows
from drafting.service import DraftingService
from drafting.source import DatastoreSource

from .drafter import S4CDrafter

__all__ = ["MergedS4CDrafter", "merged_service"]


def merged_service(lookups: DatastoreSource | None, *, vocab_size: int, **kwargs) -> DraftingService:
    """The merged drafter that drafts from the heads too: every retrieval source plus ``heads``, under the calibration
    fitted with the heads (:data:`drafting.calibration.HEADS_PATH`). ``kwargs`` are :class:`DraftingService`'s
    others (``outputs_bytes``, ``min_score``, ``back_off_min_budget``, ``live_writer``).

    Raises:
        FileNotFoundError: when the heads' calibration is missing (fit it: ``benchmarks/calibrate.py --heads``).
        ValueError: as :class:`DraftingService`.
    """
    return DraftingService(lookups, vocab_size=vocab_size, calibration=Calibration.load(HEADS_PATH),
                           sources=(*RETRIEVAL_SOURCES, "heads"), **kwargs)


class MergedS4CDrafter:
    """Merged + S4C: a :class:`drafting.DraftingService` that drafts from the ``heads`` source, fed by an
    :class:`s4c.S4CDrafter`'s trees. Request-keyed like every drafter, and it reads hidden states
    (:class:`drafting.lifecycle.ReadsHiddenStates`).

    Args:
        service: the merged drafter, constructed with ``"heads"`` among its sources and the heads' calibration.
        heads: the S4C drafter whose request states and trees feed it.

    Raises:
        ValueError: when the service does not draft from the ``heads`` source.
    """

    name = "merged+s4c"
    score_kind = ScoreKind.PROBABILITY

    def __init__(self, service: DraftingService, heads: S4CDrafter) -> None:
        if "heads" not in service.sources:
            raise ValueError(f"the service drafts from {service.sources}; construct it with 'heads' among its "
                             "sources and Calibration.load(drafting.calibration.HEADS_PATH)")
        self.service, self.heads = service, heads

    def start_request(self, req_id: RequestId, prompt_ids: TokenIds) -> None:
        """Start ``req_id`` in both (as :meth:`DraftingService.start_request`)."""
        self.service.start_request(req_id, prompt_ids)
        try:
            self.heads.start_request(req_id, prompt_ids)
        except BaseException:
            self.service.stop_request(req_id)
            raise

    def add_tokens(self, req_id: RequestId, tokens: TokenIds) -> None:
        """Append committed tokens to both (as :meth:`DraftingService.add_tokens`)."""
        self.service.add_tokens(req_id, tokens)
        self.heads.add_tokens(req_id, tokens)

    def add_hidden_states(self, req_id: RequestId, hidden) -> None:
        """Append the target's hidden states (as :meth:`S4CDrafter.add_hidden_states`)."""
        self.heads.add_hidden_states(req_id, hidden)

    def stop_request(self, req_id: RequestId) -> None:
        """Stop ``req_id`` in both."""
        self.service.stop_request(req_id)
        self.heads.stop_request(req_id)

    def propose(self, batch: Sequence[tuple[RequestId, TokenIds, int]], *, chain: bool = False,
                min_score: float | None = None) -> list[Draft]:
        """One draft per row, as :meth:`DraftingService.propose`, with each row's heads tree among the sources.

        Raises:
            as :meth:`DraftingService.propose`.
        """
        ids, _, budgets = check_rows(batch, self.service.vocab_size, 0)
        rows = [i for i, b in enumerate(budgets) if b > 0]
        trees: list[HeadTree | None] = [None] * len(budgets)
        for i, tree in zip(rows, self.heads.trees(self.heads.states([ids[i] for i in rows]))):
            trees[i] = tree
        return self.service.propose(batch, chain=chain, min_score=min_score, heads=trees)

    def step_seconds(self) -> dict[str, float]:
        """Seconds spent so far, by part of the step: ``lookup``, ``merge`` (the service's) and ``heads``."""
        return {**self.service.step_seconds(), **self.heads.step_seconds()}

    def config(self) -> dict:
        """Everything that changes the drafts: the service's and the heads'."""
        return {"name": self.name, "service": self.service.config(), "heads": self.heads.config()}

    def close(self) -> None:
        """Close the service's lookups."""
        self.service.close()
