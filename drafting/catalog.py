"""The datastores a drafter's requests draft from (:class:`DatastoreCatalog`): the shared one, and those a request
names (vLLM's per-request ``extra_args``, :mod:`serving.options`; the library's ``start_request(..., datastore=...)``),
each opened by name the first time a request names it, at most ``max_open`` at once (the least recently used with no
request drafting from it is closed), each a fault-tolerant :class:`drafting.DatastoreSource` with its host-local
replicas and its live layer.

A request drafts from a datastore *set*, fixed when it starts: the datastore it names and the shared one (unless it
turns the shared one off). Each datastore's candidate trees compete in its draft (the core keeps the candidate whose
draft has the largest expected accepted length, as it does among one datastore's stored suffixes, CREST's back-off),
beside the live layer of the first and the other sources. A name outside the operator's list (``allowed``), one that
is not built, or one that cannot be opened drafts from the shared datastore alone, logged once per name; a name still
opening (its first open runs on a short-lived thread of its own) drafts from the shared datastore meanwhile. A request
never waits for a datastore, and never fails for one.

Isolation: drafts never change output, but a step's speed can tell a caller whether a datastore holds a text. The
operator's list, or a gateway that sets the option per tenant, is what keeps tenants apart.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from crest_native import StoreSets

from .source import DatastoreSource, Retriever

__all__ = ["DEFAULT_SET", "MAX_OPEN", "DatastoreCatalog", "DatastoreSet"]

log = logging.getLogger(__name__)

DEFAULT_SET = 0
"""The set of a request that names no datastore: the shared one alone."""
MAX_OPEN = 8
"""Datastores a process keeps open besides the shared one, by default."""


@dataclass(frozen=True)
class DatastoreSet:
    """A request's datastores: ``first`` (its live layer is the request's), then ``second`` (``None``: none), and the
    name its finished outputs are appended under (``None``: no datastore)."""

    first: DatastoreSource | None
    second: DatastoreSource | None
    name: str | None


class DatastoreCatalog:
    """The datastores of a drafter (see the module docstring). Thread-safe.

    Args:
        shared: the shared datastore's lookups (``None``: none; requests draft from the other sources, and from the
            datastores they name).
        shared_name: its name (where the outputs of requests that name no datastore are appended).
        connect: opens a datastore by name, raising :class:`datastore.errors.DatastoreError` when it cannot (``None``:
            no request may name one).
        allowed: the names a request may give (the operator's list); any other is unknown.
        max_open: most datastores open besides the shared one, >= 1.

    Raises:
        ValueError: for ``max_open < 1``.
    """

    def __init__(self, shared: DatastoreSource | None, shared_name: str | None = None, *,
                 connect: Callable[[str], Retriever] | None = None, allowed: Sequence[str] = (),
                 max_open: int = MAX_OPEN) -> None:
        if isinstance(max_open, bool) or not isinstance(max_open, int) or max_open < 1:
            raise ValueError(f"max_open={max_open!r}: pass the most datastores open at once, an int >= 1")
        self.shared, self.shared_name = shared, shared_name
        self.allowed = frozenset(allowed) - {shared_name}
        self.max_open = max_open
        self._connect = connect
        self._open: OrderedDict[str, DatastoreSource] = OrderedDict()  # least recently named first
        self._opening: set[str] = set()
        self._told: set[str] = set()  # names already logged as drafting from the shared datastore
        self._sets: dict[tuple[str | None, bool], int] = {(None, True): DEFAULT_SET}
        self._members: dict[int, DatastoreSet] = {DEFAULT_SET: DatastoreSet(shared, None, shared_name)}
        self._users: Counter[int] = Counter()
        self._retired: set[int] = set()  # set ids retired since take_retired() last asked
        self._stores: tuple[list, StoreSets] | None = None  # the replicas last handed out, and what they were made of
        self._sources: tuple[dict, list] | None = None  # each set's sources, as of the members it was read from
        self._closed = False
        self._lock = threading.Lock()

    def resolve(self, name: str | None, shared: bool = True) -> int:
        """The set a request that names ``name`` (``None``: none) with the shared datastore on or off drafts from; a
        name not open yet starts opening, and drafts from the shared datastore meanwhile."""
        if name is None or name == self.shared_name:
            return DEFAULT_SET
        with self._lock:
            source = self._open.get(name)
            if source is None:
                self._begin(name)
                return DEFAULT_SET
            self._open.move_to_end(name)
            key = (name, shared)
            got = self._sets.get(key)
            if got is None:
                got = self._sets[key] = self._free_id()
                # copied on write: readers (a step's stores()) read it without the lock
                self._members = {**self._members, got: DatastoreSet(source, self.shared if shared else None, name)}
            return got

    def acquire(self, set_id: int) -> None:
        """A request started drafting from set ``set_id``: its datastores stay open."""
        with self._lock:
            self._users[set_id] += 1

    def release(self, set_id: int) -> None:
        """A request of set ``set_id`` stopped."""
        with self._lock:
            self._users[set_id] -= 1
            if self._users[set_id] <= 0:
                del self._users[set_id]

    def take_retired(self) -> set[int]:
        """The set ids retired (their datastore closed) since the last call: an id may be given to another datastore's
        set later, and what a drafter learnt for the old one (its online fit) is not the new one's."""
        if not self._retired:  # the common case, without the lock: a set retired meanwhile is taken next time
            return set()
        with self._lock:
            out, self._retired = self._retired, set()
        return out

    def members(self, set_id: int) -> DatastoreSet:
        """Set ``set_id``'s datastores (a retired set's: none)."""
        return self._members.get(set_id, DatastoreSet(None, None, None))

    def sets(self) -> dict[int, DatastoreSet]:
        """Every set, by id (a copy)."""
        with self._lock:
            return dict(self._members)

    def stores(self) -> StoreSets | None:
        """The host-local replicas of every set (:class:`crest_native.StoreSets`, by set id), or ``None`` while one of
        them is not mapped, or no set has a datastore (the step is drafted by the round trip). Costs no round trip;
        made again only when a set or a mapped build changed (a step's common case: one look at each source)."""
        sources = self._sources
        if sources is None or sources[0] is not self._members:
            members = self._members
            sources = self._sources = (members, [(None if m is None else m.first, None if m is None else m.second)
                                                 for m in map(members.get, range(max(members) + 1))])
        parts = []
        for first, second in sources[1]:
            a = None if first is None else first.stores()
            b = None if second is None else second.stores()
            if (a is None and first is not None) or (b is None and second is not None):
                return None
            parts.append((a, b))
        made = self._stores
        if made is not None and len(made[0]) == len(parts):
            for x, y in zip(made[0], parts):
                if x[0] is not y[0] or x[1] is not y[1]:
                    break
            else:
                return made[1]
        if all(a is None for a, _ in parts):
            return None
        sets = StoreSets([(None if f is None else f.datastore, None if s is None else s.datastore,
                           None if f is None else f.live, None if f is None else f.delta) for f, s in parts])
        self._stores = (parts, sets)
        return sets

    def replica_damaged(self, stores: StoreSets, index: int) -> None:
        """A step found store ``index`` of ``stores`` (``set * 4 + kind``) damaged: its datastore drops it and writes
        it again."""
        set_id, kind = divmod(index, 4)
        m = self._members.get(set_id)
        source = None if m is None else (m.second if kind == 1 else m.first)
        replica = stores[set_id][kind]
        if source is not None and replica is not None:
            source.replica_damaged(replica)

    def identity(self) -> dict | None:
        """What the shared datastore serves (``None``: none), and the datastores open."""
        if self.shared is None and not self._open:
            return None
        out = {} if self.shared is None else dict(self.shared.identity())
        with self._lock:
            named = sorted(self._open)
        if named:
            out["named"] = named
        return out

    def close(self) -> None:
        """Close every datastore; final (a later open is not made)."""
        with self._lock:
            self._closed = True
            opened = list(self._open.values())
            self._open.clear()
        for source in opened:
            source.close()
        if self.shared is not None:
            self.shared.close()

    # -- opening by name -----------------------------------------------------------------------------------------

    def _begin(self, name: str) -> None:
        """Under the lock: start opening ``name`` on a thread of its own, unless it is unknown, opening, or the
        catalog is closed."""
        if self._closed or name in self._opening or name in self._told:
            return
        if self._connect is None or name not in self.allowed:
            self._tell(name, "it is not among the datastores this server allows (the operator's list)")
            return
        self._opening.add(name)
        threading.Thread(target=self._open_one, args=(name, self._connect), name="crest-open-datastore",
                         daemon=True).start()

    def _tell(self, name: str, why: str) -> None:
        """Under the lock: log once that requests naming ``name`` draft from the shared datastore."""
        if name not in self._told:
            self._told.add(name)
            log.warning("requests naming datastore %r draft from the shared one (%r): %s", name, self.shared_name, why)

    def _open_one(self, name: str, connect: Callable[[str], Retriever]) -> None:
        from datastore.errors import DatastoreError

        try:
            first = [connect(name)]
        except DatastoreError as exc:
            with self._lock:
                self._opening.discard(name)
                self._tell(name, str(exc))
            return
        source = DatastoreSource(lambda: first.pop() if first else connect(name), reopen_in_background=True)
        evicted: list[DatastoreSource] = []
        with self._lock:
            self._opening.discard(name)
            if self._closed:
                evicted.append(source)
            else:
                self._open[name] = source
                evicted = self._evict(keep=name)
        for old in evicted:
            old.close()

    def _evict(self, keep: str) -> list[DatastoreSource]:
        """Under the lock: close the least recently named datastores no request drafts from (but ``keep``, opened for
        a request just now), down to ``max_open``; their sets are retired."""
        out = []
        for name in list(self._open):
            if len(self._open) <= self.max_open:
                break
            if name == keep:
                continue
            source = self._open[name]
            ids = [i for i, m in self._members.items() if i != DEFAULT_SET and source in (m.first, m.second)]
            if any(self._users[i] > 0 for i in ids):
                continue
            del self._open[name]
            for key, i in list(self._sets.items()):
                if i in ids:
                    del self._sets[key]
            self._members = {i: m for i, m in self._members.items() if i not in ids}  # copied on write
            self._retired.update(ids)
            out.append(source)
        return out

    def _free_id(self) -> int:
        """Under the lock: the lowest set id not in use."""
        got = 1
        while got in self._members:
            got += 1
        return got
