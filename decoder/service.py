"""The merged drafter as a service: many requests, one shared datastore, one round trip per proposal step.

Shaped after ArcticInference's suffix decoding (a request-keyed lifecycle,
https://github.com/snowflakedb/ArcticInference, ``arctic_inference/suffix_decoding``)
and vLLM's batch-first proposers (``vllm/v1/spec_decode``):

- :meth:`DraftingService.start_request` builds the request's prompt n-gram trie
  (N-Gram-Trie, https://openreview.net/forum?id=MVfpYw1pxX);
- :meth:`DraftingService.propose` drafts for a whole batch of requests, each under its own budget: one
  batched datastore lookup for every request of the batch (the cache of
  :class:`datastore.shared.SharedDatastore` answers the hot n-grams without a round trip), then per
  request the union of the datastore's tree, the live layer's (earlier outputs of the model) and the
  trie's, every node scored by its calibrated acceptance probability (:mod:`decoder.calibration`), as a
  tree under the budget or, for chain verifiers such as vLLM's, as the path with the largest expected
  accepted length; for large trees the datastore n-gram is chosen among all stored suffixes (back-off);
- :meth:`DraftingService.add_tokens` and :meth:`DraftingService.stop_request`.

The same object drafts for the HF decoding loop (:func:`decoder.speculative_generate`), the replay
simulator, the benchmarks and the vLLM proposer. Every datastore fault falls back to trie-only drafts
(:class:`decoder.drafters.DatastoreSource`), so the output never changes. The service is thread-safe.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from datastore.context import TokenIds
from datastore.tree import Match, TokenTree

from .calibration import Calibration, TreeColumns, draft_from_candidates
from .draft import Draft, ScoreKind
from .drafters.base import RequestDrafter
from .drafters.retrieval import TAIL_TOKENS
from .drafters.source import DatastoreSource
from .ngram_trie import NGramTrie

if TYPE_CHECKING:
    from datastore.live import LiveWriter

__all__ = ["DraftingService", "ServiceStats", "STEP_TIMES_KEPT", "TRIE_NODES"]


STEP_TIMES_KEPT = 10_000
TRIE_NODES = 64  # the trie's match under calibrated scoring: the calibration was fitted on matches this size
_COLUMNS_KEPT = 8192  # hot datastore trees whose calibration columns (and children maps) are kept


@dataclass
class ServiceStats:
    """Cumulative figures of a service (seconds are wall-clock, summed over calls).

    Attributes:
        steps: :meth:`DraftingService.propose` calls. drafts: drafts returned. nodes: draft nodes returned.
        lookup_s: datastore lookups (one batched call a step). trie_s: trie matches. merge_s: merges.
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


@dataclass
class _Request:
    trie: NGramTrie
    tail: deque
    output: list = field(default_factory=list)  # committed tokens since start_request (for the live writer)


class DraftingService(RequestDrafter[_Request]):
    """The merged drafter: request-keyed, batched drafting from one datastore, a live layer and a prompt
    trie per request, every node scored by its calibrated acceptance probability.

    Args:
        source: the shared datastore lookups (``None``: trie-only drafts).
        calibration: the node scorer (default: the parameters shipped with the package, ``Calibration.load()``).
        window / max_prefix: the prompt tries' sliding window ``n`` and longest matched context ``Lp``
            (default: the settings ``calibration`` was fitted with, else 13 and 3, the paper's).
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
            :mod:`datastore.live`): the longest match among the model's earlier outputs, merged into every
            draft with its own features (one more round trip a step).
        live_writer: a :class:`datastore.live.LiveWriter`: each request's committed tokens are handed to it
            at :meth:`stop_request` (enqueued only; written on its own thread).

    Raises:
        ValueError: when an argument is out of range.
    """

    name = "merged"
    score_kind = ScoreKind.PROBABILITY

    def __init__(self, source: DatastoreSource | None, *, calibration: Calibration | None = None,
                 window: int | None = None, max_prefix: int | None = None, min_score: float = 0.0,
                 back_off_min_budget: int = 32, live: DatastoreSource | None = None,
                 live_writer: LiveWriter | None = None) -> None:
        super().__init__()
        if not 0.0 <= min_score <= 1.0:
            raise ValueError(f"min_score={min_score}: must be a probability in [0, 1]")
        if back_off_min_budget < 0:
            raise ValueError(f"back_off_min_budget={back_off_min_budget}: must be >= 0")
        self.calibration = calibration if calibration is not None else Calibration.load()
        fitted = self.calibration.meta.get("trie") or {}
        self.window = window if window is not None else int(fitted.get("window", 13))
        self.max_prefix = max_prefix if max_prefix is not None else int(fitted.get("max_prefix", 3))
        NGramTrie(self.window, self.max_prefix)  # validates them now
        self.source, self.live, self.live_writer = source, live, live_writer
        self.min_score, self.back_off_min_budget = min_score, back_off_min_budget
        self.stats = ServiceStats()
        self._columns_kept: OrderedDict[int, tuple[TokenTree, TreeColumns]] = OrderedDict()  # id(tree) -> columns

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

    # -- request lifecycle (RequestDrafter) -----------------------------------------------------------------

    def _start(self, prompt_ids: TokenIds) -> _Request:
        trie = NGramTrie(self.window, self.max_prefix)
        trie.extend(prompt_ids)
        return _Request(trie, deque((int(t) for t in prompt_ids[-TAIL_TOKENS:]), maxlen=TAIL_TOKENS))

    def _extend(self, state: _Request, tokens: Sequence[int]) -> None:
        state.trie.extend(tokens)
        state.tail.extend(int(t) for t in tokens)
        if self.live_writer is not None:
            state.output.extend(int(t) for t in tokens)

    def _stop(self, state: _Request) -> None:
        if self.live_writer is not None and state.output:
            self.live_writer.append(state.output)

    # -- drafting -----------------------------------------------------------------------------------------

    def _propose(self, states: list[_Request], budgets: list[int], chain: bool,
                 min_score: float | None) -> list[Draft]:
        start = time.perf_counter()
        cut = self.min_score if min_score is None else min_score
        with self._lock:
            contexts = [list(r.tail) for r, b in zip(states, budgets) if b > 0]
        backs_off = [not chain and b >= self.back_off_min_budget for b in budgets if b > 0]
        found: list[list[Match]]
        if self.source is None or not contexts:
            found = [[] for _ in contexts]
        elif any(backs_off):
            found = self.source.candidates_batch(contexts)
        else:  # the longest match only: less crosses the wire
            found = [[m] if m is not None else [] for m in self.source.lookup_batch(contexts)]
        lives = self.live.lookup_batch(contexts) if self.live is not None and contexts else [None] * len(contexts)
        lookup_s = time.perf_counter() - start
        drafts: list[Draft] = []
        trie_s = merge_s = 0.0
        per = iter(zip(found, lives, backs_off))
        with self._lock:
            for req, budget in zip(states, budgets):
                if budget < 1:
                    drafts.append(Draft.empty(self.score_kind))
                    continue
                stored, live, back_off = next(per)
                t1 = time.perf_counter()
                matched = req.trie.match(max(budget, TRIE_NODES))
                t2 = time.perf_counter()
                draft, chosen = draft_from_candidates(self.calibration, stored if back_off else stored[:1],
                                                      {"live": live, "trie": matched}, budget, chain=chain,
                                                      min_score=cut, columns=self._columns)
                t3 = time.perf_counter()
                self.stats.backed_off += chosen > 0
                trie_s += t2 - t1
                merge_s += t3 - t2
                drafts.append(draft.with_timing(lookup_s=lookup_s, trie_s=t2 - t1, merge_s=t3 - t2))
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
        """Everything that changes the drafts: the trie's shape, the scorer, the cut, the back-off, the sources."""
        return {"name": self.name, "window": self.window, "max_prefix": self.max_prefix,
                "calibration": self.calibration.digest(), "min_score": self.min_score,
                "back_off_min_budget": self.back_off_min_budget,
                "source": None if self.source is None else self.source.identity(),
                "live": None if self.live is None else self.live.identity()}
