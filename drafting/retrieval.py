"""Where a step's datastore trees come from, chosen each step (the native core's ``Retrieval`` strategy), for each row
from the datastore set its request drafts from (:mod:`drafting.catalog`):

- the host-local replicas (:mod:`datastore.replica`) once every set's are mapped: the native step probes them itself
  with each request's own last tokens, with the GIL released, and nothing crosses back to Python but the drafts;
- otherwise the round trip: the native step says what each row needs (its last tokens, whether it backs off), one
  query per datastore fetches it (:meth:`datastore.lookup.LookupClient.retrieve_batch`, most answered by the client's
  cache), and a second native call drafts from the trees given. A replica found damaged mid-step is dropped (one
  warning, written again in the background) and the step is drafted by the round trip: the two give the same drafts,
  bit for bit.

Every datastore fault drafts from the other sources (:class:`drafting.source.DatastoreSource`): output never changes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from crest_native import Step, StoreSets, Trees
from datastore.tree import Match
from toolkit.forks import at_fork

from .catalog import DatastoreCatalog

__all__ = ["DatastoreTrees", "RetrievalStats", "native_tree"]


def native_tree(m: Match | None) -> tuple | None:
    """A retrieved match as the native core reads a source tree: ``(ngram_len, token_ids uint32, parents int32,
    counts uint32, root_count)``."""
    if m is None:
        return None
    t = m.tree
    return (len(m.ngram), t.token_ids, t.parents, t.counts, t.root_count)


@dataclass
class RetrievalStats:
    """Cumulative figures of a drafter's steps (seconds are wall-clock).

    Attributes:
        replica_steps: steps drafted from the replicas (one native call). round_trip_steps: steps drafted by the round
            trip. damaged: replicas found damaged mid-step.
        lookup_s: the round trips' seconds (their queries, or their cache). core_s: the native calls'.
        backed_off: drafts whose chosen datastore n-gram was shorter than the longest stored.
        stopped_meanwhile: rows whose request was stopped while their lookups ran (an empty draft each).
    """

    replica_steps: int = 0
    round_trip_steps: int = 0
    damaged: int = 0
    lookup_s: float = 0.0
    core_s: float = 0.0
    backed_off: int = 0
    stopped_meanwhile: int = 0


class DatastoreTrees:
    """The datastores' side of a drafter's steps: the replicas to probe, or the round trip's trees, and the figures.

    Args:
        catalog: the drafter's datastores (:class:`drafting.catalog.DatastoreCatalog`; a set without a datastore
            drafts from the other sources only, a round trip that asks nothing).

    Attributes:
        stats: :class:`RetrievalStats`.
    """

    def __init__(self, catalog: DatastoreCatalog) -> None:
        self.catalog = catalog
        self.stats = RetrievalStats()
        self._lock = threading.Lock()
        at_fork(self, after_in_child=DatastoreTrees._forked)

    def _forked(self) -> None:
        """In a forked child: a fresh lock for the stats (another thread of the parent may have held it)."""
        self._lock = threading.Lock()

    def stores(self) -> StoreSets | None:
        """The replicas of every datastore set a step probes, or ``None`` while one is not mapped (the step plans a
        round trip instead). Costs no round trip."""
        return self.catalog.stores()

    def drafted(self, made: Step, seconds: float, stores: StoreSets) -> bool:
        """Count a native call that drafted from ``stores``; ``False`` when it found one damaged (dropped here: it is
        written again), and the step is to be drafted by the round trip."""
        with self._lock:
            self.stats.core_s += seconds
            if made.drafted:
                self.stats.replica_steps += 1
                self.stats.backed_off += made.backed_off
            else:
                self.stats.damaged += 1
        if made.drafted:
            return True
        self.catalog.replica_damaged(stores, made.damaged)
        return False

    def fetch(self, plan: Step) -> Trees:
        """The trees a planned step asks for (``plan.tails``, ``plan.back_off``), one query per datastore of the rows'
        sets, as the native core reads them (a row's candidates: its first datastore's, then its second's; its live
        layer: its first's), each row checked against the context it was planned for (``plan.counts``); no trees for
        a row that asks nothing or after a fault."""
        start = time.perf_counter()
        tails: Sequence[list[int]] = plan.tails
        rows = len(tails)
        stored: list[list] = [[] for _ in range(rows)]
        live: list = [None] * rows
        delta: list = [None] * rows
        by_set: dict[int, list[int]] = {}
        for i, (tail, set_id) in enumerate(zip(tails, plan.sets.tolist())):
            if tail:
                by_set.setdefault(set_id, []).append(i)
        back_off = plan.back_off
        for set_id, asked in by_set.items():
            members = self.catalog.members(set_id)
            flags = [bool(back_off[i]) for i in asked]
            contexts = [tails[i] for i in asked]
            for k, source in enumerate((members.first, members.second)):
                if source is None:
                    continue
                for i, got in zip(asked, source.retrieve_batch(contexts, flags)):
                    stored[i].extend(native_tree(m) for m in got.candidates)
                    if k == 0:
                        live[i], delta[i] = native_tree(got.live), native_tree(got.delta)
        trees = Trees(stored, live, delta, plan.counts)
        with self._lock:
            self.stats.lookup_s += time.perf_counter() - start
        return trees

    def drafted_given(self, made: Step, seconds: float) -> None:
        """Count a round trip's native call."""
        with self._lock:
            st = self.stats
            st.round_trip_steps += 1
            st.stopped_meanwhile += made.inactive
            st.core_s += seconds
            st.backed_off += made.backed_off

    def step_seconds(self) -> dict[str, float]:
        """Seconds spent so far, by part of the step: ``lookup`` (the round trips) and ``merge`` (the native calls,
        the replicas' probes included)."""
        with self._lock:
            return {"lookup": self.stats.lookup_s, "merge": self.stats.core_s}

    def identity(self) -> dict | None:
        """What the datastores serve (``None``: no datastore)."""
        return self.catalog.identity()

    def close(self) -> None:
        """Close the datastores."""
        self.catalog.close()
