"""The drafting service: many requests, one shared datastore, one round trip per proposal step.

Shaped after ArcticInference's suffix decoding (a request-keyed lifecycle,
https://github.com/snowflakedb/ArcticInference, ``arctic_inference/suffix_decoding``)
and vLLM's batch-first proposers (``vllm/v1/spec_decode``):

- :meth:`DraftingService.start_request` builds the request's prompt n-gram trie
  (N-Gram-Trie, https://openreview.net/forum?id=MVfpYw1pxX);
- :meth:`DraftingService.propose` drafts for a whole batch of requests, each under its
  own budget: one batched datastore lookup for every request of the batch (the cache
  of :class:`datastore.shared.SharedDatastore` answers the hot n-grams without a round
  trip), then per request the same merge as :class:`decoder.MergedDrafter` (shared
  prefixes merged, weighted noisy-OR of smoothed count ratios; or, given a
  :class:`decoder.calibration.Calibration`, calibrated acceptance probabilities and the
  back-off choice among all stored suffixes, plus the live layer of earlier outputs), as a
  tree or, for chain verifiers such as vLLM's, as the merged tree's most probable path;
- :meth:`DraftingService.add_tokens` and :meth:`DraftingService.stop_request`.

Every datastore fault falls back to trie-only drafts (:class:`decoder.drafters.DatastoreSource`),
so the output never changes. The service is thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Hashable, Sequence

from datastore.live import LiveWriter
from datastore.tree import TokenTree

from .calibration import Calibration, draft_from_candidates
from .draft import Draft, best_chain, merge_drafts
from .drafters.retrieval import TAIL_TOKENS
from .drafters.source import DatastoreSource
from .ngram_trie import NGramTrie

__all__ = ["DraftingService", "ServiceStats"]


STEP_TIMES_KEPT = 10_000
TRIE_NODES = 64  # the trie's match under calibrated scoring: the calibration was fitted on matches this size


@dataclass
class ServiceStats:
    """Cumulative figures of a service (seconds are wall-clock, summed over calls).

    Attributes:
        steps: :meth:`DraftingService.propose` calls. drafts: drafts returned. nodes: draft nodes returned.
        lookup_s: datastore lookups (one batched call a step). trie_s: trie matches. merge_s: merges.
        step_s: whole ``propose`` calls. step_times: the last ``STEP_TIMES_KEPT`` calls' seconds, one each
        (bounded: a service lives as long as its server).
        backed_off: calibrated drafts whose chosen datastore n-gram was shorter than the longest stored one.
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
    output: list = field(default_factory=list)  # committed tokens since start_request (for the live layer)


class DraftingService:
    """Request-keyed, batched drafting from one datastore and a prompt trie per request.

    Args:
        source: the shared datastore lookups (``None``: trie-only drafts).
        window / max_prefix: the prompt tries' sliding window ``n`` and longest matched context ``Lp``
            (default: the settings ``calibration`` was fitted with, else 13 and 3, the paper's).
        datastore_weight / trie_weight: each source's weight in the noisy-OR, in (0, 1].
        prior: additive smoothing of count ratios, >= 0.
        min_score: chains stop before the first node scoring below this (0: never); trees keep
            only nodes scoring at least this. Not drafting when unsure is what keeps batched
            verification from costing more than it saves. With ``calibration`` the scores are
            acceptance probabilities, so this is one node's verification cost in accepted tokens:
            the draft stops where the next node's expected gain falls below it.
        calibration: score nodes by this fitted model (:class:`decoder.calibration.Calibration`, e.g.
            ``Calibration.load()``) instead of the weighted noisy-OR, and (for trees of at least
            ``back_off_min_budget`` nodes) choose among ALL stored suffixes of the context the n-gram
            whose draft has the largest expected accepted length (back-off lookup, still one round
            trip); ``None``: the noisy-OR of the longest match.
        back_off_min_budget: the back-off choice applies to trees of at least this many nodes; chains and
            smaller trees take the longest match. Chosen on the calibration's fit half: backing off gains
            for large trees (budget 64: +0.09 / +0.12 accept length, chat / code) and loses a little for
            chains and small trees (picking the largest of several noisy estimates overrates the winner).
        live: the live layer's lookups (``DatastoreSource`` over the datastore ``<name>.live``, see
            :mod:`datastore.live`): the longest match among the model's earlier outputs, merged into every
            calibrated draft with its own features (one more round trip a step; needs ``calibration``).
        live_writer: a :class:`datastore.live.LiveWriter`: each request's committed tokens are handed to it
            at :meth:`stop_request` (enqueued only; written on its own thread).

    Raises:
        ValueError: when an argument is out of range.
    """

    def __init__(self, source: DatastoreSource | None, *, window: int | None = None, max_prefix: int | None = None,
                 datastore_weight: float = 0.3, trie_weight: float = 1.0, prior: float = 1.0,
                 min_score: float = 0.0, calibration: Calibration | None = None,
                 live: DatastoreSource | None = None, live_writer: LiveWriter | None = None,
                 back_off_min_budget: int = 32) -> None:
        for label, w in (("datastore_weight", datastore_weight), ("trie_weight", trie_weight)):
            if not 0.0 < w <= 1.0:
                raise ValueError(f"{label}={w}: must be in (0, 1]")
        if live is not None and calibration is None:
            raise ValueError("live layer lookups need calibrated scores: pass calibration=Calibration.load()")
        if prior < 0 or not 0.0 <= min_score <= 1.0 or back_off_min_budget < 0:
            raise ValueError(f"prior={prior} and back_off_min_budget={back_off_min_budget} must be >= 0, "
                             f"min_score={min_score} in [0, 1]")
        fitted = (calibration.meta.get("trie") or {}) if calibration is not None else {}
        window = window if window is not None else int(fitted.get("window", 13))
        max_prefix = max_prefix if max_prefix is not None else int(fitted.get("max_prefix", 3))
        NGramTrie(window, max_prefix)  # validates them now
        self.source = source
        self.window, self.max_prefix = window, max_prefix
        self.weights = (datastore_weight, trie_weight)
        self.prior, self.min_score = prior, min_score
        self.calibration = calibration
        self.back_off_min_budget = back_off_min_budget
        self.live, self.live_writer = live, live_writer
        self.stats = ServiceStats()
        self._requests: dict[Hashable, _Request] = {}
        self._scored: OrderedDict[int, tuple[TokenTree, Draft]] = OrderedDict()  # id(tree) -> scored draft
        self._lock = threading.Lock()

    _SCORED_ENTRIES = 8192  # hot datastore trees whose scored draft (and its children maps) is kept

    def _columns(self, tree: TokenTree):
        """A datastore tree's calibration columns, computed once while the tree stays hot."""
        entry = self._scored.get(id(tree))
        if entry is not None and entry[0] is tree:
            self._scored.move_to_end(id(tree))
            return entry[1]
        cols = self.calibration.columns(tree)
        self._scored[id(tree)] = (tree, cols)
        if len(self._scored) > self._SCORED_ENTRIES:
            self._scored.popitem(last=False)
        return cols

    def _score_stored(self, tree: TokenTree) -> Draft:
        """The scored draft of a datastore tree, computed once while the tree stays hot: the shared
        datastore's cache hands back the same tree object for the same n-gram."""
        entry = self._scored.get(id(tree))
        if entry is not None and entry[0] is tree:
            self._scored.move_to_end(id(tree))
            return entry[1]
        draft = Draft.from_tree(tree, self.prior)
        self._scored[id(tree)] = (tree, draft)
        if len(self._scored) > self._SCORED_ENTRIES:
            self._scored.popitem(last=False)
        return draft

    # -- request lifecycle -----------------------------------------------------------------------------------

    def start_request(self, req_id: Hashable, prompt_ids: Sequence[int]) -> None:
        """Start drafting for ``req_id``: build its trie over ``prompt_ids`` (and any output already generated).

        Raises:
            ValueError: when ``req_id`` is already active.
        """
        trie = NGramTrie(self.window, self.max_prefix)
        trie.extend(prompt_ids)
        tail = deque((int(t) for t in prompt_ids[-TAIL_TOKENS:]), maxlen=TAIL_TOKENS)
        with self._lock:
            if req_id in self._requests:
                raise ValueError(f"request {req_id!r} is already active; stop_request it first")
            self._requests[req_id] = _Request(trie, tail)

    def add_tokens(self, req_id: Hashable, tokens: Sequence[int]) -> None:
        """Append the tokens the target committed for ``req_id``.

        Raises:
            KeyError: when ``req_id`` is not active (start_request it first).
        """
        with self._lock:
            req = self._get(req_id)
            req.trie.extend(tokens)
            req.tail.extend(int(t) for t in tokens)
            if self.live_writer is not None:
                req.output.extend(int(t) for t in tokens)

    def stop_request(self, req_id: Hashable) -> None:
        """Forget ``req_id`` (a request not active is ignored); hand its output to the live writer, if any."""
        with self._lock:
            req = self._requests.pop(req_id, None)
        if req is not None and self.live_writer is not None and req.output:
            self.live_writer.append(req.output)

    @property
    def active_requests(self) -> frozenset:
        """The ids of the requests started and not stopped."""
        with self._lock:
            return frozenset(self._requests)

    def _get(self, req_id: Hashable) -> _Request:
        try:
            return self._requests[req_id]
        except KeyError:
            raise KeyError(f"request {req_id!r} is not active; start_request it first") from None

    # -- drafting -----------------------------------------------------------------------------------------

    def propose(self, batch: Sequence[tuple[Hashable, int]], *, chain: bool = False,
                min_score: float | None = None) -> list[Draft]:
        """One draft per ``(req_id, budget)`` of the batch, each of at most ``budget`` nodes (0: none).

        Args:
            batch: the requests to draft for and each one's budget (draft nodes, >= 0).
            chain: return the merged tree's most probable path (at most ``budget`` tokens, each
                scoring at least ``min_score``) instead of the tree.
            min_score: this step's cut instead of the service's (e.g. a break-even score that
                depends on the batch, :class:`serving.cost.StepCostModel`), in [0, 1].

        Returns:
            ``[len(batch)]`` drafts, best first; each carries the step's lookup time and its own trie
            and merge times.

        Raises:
            KeyError: when a request is not active.
            ValueError: when a budget is negative.
        """
        start = time.perf_counter()
        with self._lock:
            reqs = [self._get(rid) for rid, _ in batch]
            contexts = [list(r.tail) for r, (_, b) in zip(reqs, batch) if b > 0]
        if any(b < 0 for _, b in batch):
            raise ValueError(f"budgets must be >= 0, got {[b for _, b in batch]}")
        cut = self.min_score if min_score is None else min_score
        if not 0.0 <= cut <= 1.0:
            raise ValueError(f"min_score={min_score}: must be in [0, 1]")
        t0 = time.perf_counter()
        calibrated = self.calibration is not None
        if self.source is None or not contexts:
            found = iter([[] if calibrated else None for _ in contexts])
        else:
            found = iter(self.source.candidates_batch(contexts) if calibrated else self.source.lookup_batch(contexts))
        lives = iter(self.live.lookup_batch(contexts) if self.live is not None and contexts else
                     [None] * len(contexts))
        lookup_s = time.perf_counter() - t0
        drafts: list[Draft] = []
        trie_s = merge_s = 0.0
        with self._lock:
            for req, (_, budget) in zip(reqs, batch):
                if budget < 1:
                    drafts.append(Draft.empty())
                    continue
                stored, live = next(found), next(lives)
                t1 = time.perf_counter()
                if calibrated:
                    matched = req.trie.match(max(budget, TRIE_NODES))
                    t2 = time.perf_counter()
                    backs_off = not chain and budget >= self.back_off_min_budget
                    draft, chosen = draft_from_candidates(self.calibration, stored if backs_off else stored[:1],
                                                          matched, budget, chain=chain, min_score=cut,
                                                          columns=self._columns, live=live)
                    t3 = time.perf_counter()
                    self.stats.backed_off += chosen > 0
                    trie_s += t2 - t1
                    merge_s += t3 - t2
                    drafts.append(draft.with_timing(lookup_s=lookup_s, trie_s=t2 - t1, merge_s=t3 - t2))
                    continue
                matched = req.trie.match(budget)
                t2 = time.perf_counter()
                sources = []
                if stored is not None:
                    sources.append((self._score_stored(stored.tree), self.weights[0]))
                if matched is not None:
                    sources.append((Draft.from_tree(matched.tree, self.prior), self.weights[1]))
                if chain:
                    draft = best_chain(sources, budget, cut)
                else:
                    draft = _at_least(merge_drafts(sources, budget), cut)
                t3 = time.perf_counter()
                trie_s += t2 - t1
                merge_s += t3 - t2
                drafts.append(draft.with_timing(lookup_s=lookup_s, trie_s=t2 - t1, merge_s=t3 - t2))
        step_s = time.perf_counter() - start
        with self._lock:
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


def _at_least(draft: Draft, min_score: float) -> Draft:
    """The best-first draft cut before its first node scoring below ``min_score`` (still prefix-closed)."""
    if min_score <= 0.0 or not len(draft) or draft.scores[-1] >= min_score:
        return draft
    keep = int((draft.scores >= min_score).sum())
    return Draft(draft.token_ids[:keep], draft.parents[:keep], draft.scores[:keep])
