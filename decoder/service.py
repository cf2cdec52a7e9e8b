"""The merged drafter as a service: many requests, one shared datastore, one round trip per proposal step.

Shaped after ArcticInference's suffix decoding (a request-keyed lifecycle,
https://github.com/snowflakedb/ArcticInference, ``arctic_inference/suffix_decoding``)
and vLLM's batch-first proposers (``vllm/v1/spec_decode``):

- :meth:`DraftingService.start_request` indexes the request's own tokens (by default a suffix automaton that
  matches contexts of any length, :mod:`decoder.local`; the N-Gram-Trie paper's trie is the other strategy);
- :meth:`DraftingService.propose` drafts for a whole batch of requests, each under its own budget: one
  batched datastore lookup for every request of the batch (the cache of
  :class:`datastore.shared.SharedDatastore` answers the hot n-grams without a round trip), then per
  request the union of the datastore's tree, the live layer's (every process's earlier outputs), the
  request's own match and the match in this process's finished outputs (:mod:`decoder.output_index`),
  every node scored by its calibrated acceptance probability (:mod:`decoder.calibration`), as a
  tree under the budget or, for chain verifiers such as vLLM's, as the path with the largest expected
  accepted length; for large trees the datastore n-gram is chosen among all stored suffixes (back-off);
- :meth:`DraftingService.add_tokens` and :meth:`DraftingService.stop_request`.

The same object drafts for the HF decoding loop (:func:`decoder.speculative_generate`), the replay
simulator, the benchmarks and the vLLM proposer. Every datastore fault falls back to drafts from the other sources
(:class:`decoder.drafters.DatastoreSource`), so the output never changes. The service is thread-safe.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from datastore.context import TokenIds
from datastore.tree import Match

from .core import DraftCore, default_core
from .draft import Draft, ScoreKind
from .drafters.base import RequestDrafter
from .drafters.source import DatastoreSource

if TYPE_CHECKING:
    from datastore.live import LiveWriter

__all__ = ["DraftingService", "ServiceStats", "STEP_TIMES_KEPT"]


STEP_TIMES_KEPT = 10_000


@dataclass
class ServiceStats:
    """Cumulative figures of a service (seconds are wall-clock, summed over calls).

    Attributes:
        steps: :meth:`DraftingService.propose` calls. drafts: drafts returned. nodes: draft nodes returned.
        lookup_s: datastore lookups (one batched call a step). trie_s: local and output-index matches.
        merge_s: merges.
        step_s: whole ``propose`` calls. step_times: the last ``STEP_TIMES_KEPT`` calls' seconds, one each
        (bounded: a service lives as long as its server).
        backed_off: drafts whose chosen datastore n-gram was shorter than the longest stored one.
    """

    steps: int = 0
    drafts: int = 0
    nodes: int = 0
    lookup_s: float = 0.0
    trie_s: float = 0.0
    merge_s: float = 0.0
    step_s: float = 0.0
    backed_off: int = 0
    step_times: deque = field(default_factory=lambda: deque(maxlen=STEP_TIMES_KEPT), repr=False)


class DraftingService(RequestDrafter[Hashable]):
    """The merged drafter: request-keyed, batched drafting from one datastore, a live layer, each request's
    own tokens and this process's finished outputs, every node scored by its calibrated acceptance probability.

    Args:
        source: the shared datastore lookups (``None``: drafts from the other sources only).
        core: the drafting core (:mod:`decoder.core`): the calibration, how each request's own tokens are
            indexed, and this process's index of finished outputs (each request's output is added at
            :meth:`stop_request` and drafted from by the next requests). Default: :func:`decoder.core.default_core`,
            the native core with the shipped calibration and a 64 MiB output index.
        min_score: a probability in [0, 1]: one node's verification cost in accepted tokens. Trees keep
            only nodes whose acceptance probability is at least this and chains stop before the first node
            below it (0: fill the budget). Not drafting when unsure is what keeps batched verification
            from costing more than it saves.
        back_off_min_budget: trees of at least this many nodes choose the datastore n-gram among ALL stored
            suffixes of the context (the one whose draft has the largest expected accepted length, still one
            round trip); chains and smaller trees take the longest match. Chosen on the calibration's fit
            half: backing off gains for large trees (budget 64: +0.09 / +0.12 accept length, chat / code)
            and loses a little for chains and small trees (the largest of several uncertain estimates is
            overrated).
        live: the live layer's lookups (``DatastoreSource`` over the datastore ``<name>.live``, see
            :mod:`datastore.live`): the longest match among every process's earlier outputs, merged into every
            draft with its own features (one more round trip a step).
        live_writer: a :class:`datastore.live.LiveWriter`: each request's output is handed to it at
            :meth:`stop_request` (enqueued only; written on its own thread).

    Raises:
        ValueError: when an argument is out of range.
    """

    name = "merged"
    score_kind = ScoreKind.PROBABILITY

    def __init__(self, source: DatastoreSource | None, *, core: DraftCore[Any] | None = None, min_score: float = 0.0,
                 back_off_min_budget: int = 32, live: DatastoreSource | None = None,
                 live_writer: LiveWriter | None = None) -> None:
        super().__init__()
        if not 0.0 <= min_score <= 1.0:
            raise ValueError(f"min_score={min_score}: must be a probability in [0, 1]")
        if back_off_min_budget < 0:
            raise ValueError(f"back_off_min_budget={back_off_min_budget}: must be >= 0")
        self.core = core if core is not None else default_core()
        self.calibration = self.core.calibration
        self.source, self.live, self.live_writer = source, live, live_writer
        self.min_score, self.back_off_min_budget = min_score, back_off_min_budget
        self.stats = ServiceStats()

    # -- request lifecycle (RequestDrafter) -----------------------------------------------------------------

    def _start(self, prompt_ids: TokenIds) -> Hashable:
        return self.core.start([int(t) for t in prompt_ids])

    def _extend(self, state: Hashable, tokens: Sequence[int]) -> None:
        self.core.extend(state, [int(t) for t in tokens])

    def _stop(self, state: Hashable) -> None:
        with self._lock:
            output = self.core.stop(state)
        if output and self.live_writer is not None:
            self.live_writer.append(output)

    # -- drafting -----------------------------------------------------------------------------------------

    def _propose(self, states: list[Hashable], budgets: list[int], chain: bool,
                 min_score: float | None) -> list[Draft]:
        start = time.perf_counter()
        cut = self.min_score if min_score is None else min_score
        with self._lock:
            contexts = [self.core.context(r) for r, b in zip(states, budgets) if b > 0]
        backs_off = [not chain and b >= self.back_off_min_budget for b in budgets if b > 0]
        found: list[list[Match]]
        if self.source is None or not contexts:
            found = [[] for _ in contexts]
        elif any(backs_off):
            found = self.source.candidates_batch(contexts)
            found = [cands if back_off else cands[:1] for cands, back_off in zip(found, backs_off)]
        else:  # the longest match only: less crosses the wire
            found = [[m] if m is not None else [] for m in self.source.lookup_batch(contexts)]
        lives = self.live.lookup_batch(contexts) if self.live is not None and contexts else [None] * len(contexts)
        lookup_s = time.perf_counter() - start
        drafting = [(r, b) for r, b in zip(states, budgets) if b > 0]
        with self._lock:
            made = iter(self.core.draft([r for r, _ in drafting], [b for _, b in drafting], found, lives, chain, cut,
                                        lookup_s) if drafting else [])
            drafts: list[Draft] = []
            trie_s = merge_s = 0.0
            for budget in budgets:
                if budget < 1:
                    drafts.append(Draft.empty(self.score_kind))
                    continue
                draft, chosen = next(made)
                self.stats.backed_off += chosen > 0
                trie_s += draft.trie_s
                merge_s += draft.merge_s
                drafts.append(draft)
            step_s = time.perf_counter() - start
            st = self.stats
            st.steps += 1
            st.drafts += len(drafts)
            st.nodes += sum(len(d) for d in drafts)
            st.lookup_s += lookup_s
            st.trie_s += trie_s
            st.merge_s += merge_s
            st.step_s += step_s
            st.step_times.append(step_s)
        return drafts

    def config(self) -> dict:
        """Everything that changes the drafts: the core (local source, scorer, output index), the cut, the
        back-off and the sources."""
        return {"name": self.name, **self.core.config(), "min_score": self.min_score,
                "back_off_min_budget": self.back_off_min_budget,
                "source": None if self.source is None else self.source.identity(),
                "live": None if self.live is None else self.live.identity()}
