"""The lookup core under both clients: the longest stored suffix n-gram of a context, or all of them, in one round trip
for a whole batch of contexts, with the live layer's longest match in the same round trip.

CREST §3 (Ho et al., https://arxiv.org/abs/2408.04678): the drafter takes the last ``max_n`` .. 1 tokens of the sequence
and uses the tree of the longest of those suffixes that the datastore holds; only the lengths the build holds are
probed (the queries: :mod:`datastore.queries`). A :class:`~datastore.cache.TreeCache` answers what it can first. A
corrupt tree is served as absent (one warning per client); a build replaced under a query is followed once and the
query re-run. :class:`LookupClient` implements this; :class:`datastore.Datastore` (a connection) and
:class:`datastore.shared.SharedDatastore` (a pool) say how queries run.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, TypeVar

import numpy as np
import psycopg

from .cache import TreeCache
from .context import TokenIds, check_batch, check_context
from .errors import CodecError, DatastoreNotFound, LookupFailed, TokenizerMismatch
from .keys import decode_key
from .layers import delta_of, delta_serves
from .queries import any_keys_sql, decode_match, longest_match_sql, suffix_keys
from .registry import DatastoreInfo, check_tokenizer, server_error
from .tree import Match, TokenTree

if TYPE_CHECKING:
    from crest_native import Replica

    from .replica import Stores

__all__ = ["LookupClient", "Retrieval"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class Retrieval(NamedTuple):
    """What one drafting step retrieves for one context: ``candidates``, the datastore's trees of the context's
    stored suffixes, longest first (only the longest unless backing off; ``[]``: none), ``live``, the live
    layer's longest match (``None``: none, or no live layer), and ``delta``, its delta's (the outputs appended since
    the layer's main build, :func:`datastore.layers.delta_serves`; ``None``: none)."""

    candidates: list[Match]
    live: Match | None
    delta: Match | None = None


class _Longest:
    """One batch's longest-match plan on one build: what the cache answered and the keys to ask, each context's
    longest first; :meth:`finish` reads a query's rows."""

    def __init__(self, client: LookupClient, info: DatastoreInfo, contexts: Sequence[Sequence[int]]) -> None:
        self.client, self.info = client, info
        self.out: list[Match | None] = [None] * len(contexts)
        self.ask_keys: list[bytes] = []  # keys the cache cannot answer ...
        self.ask_ctx: list[int] = []     # ... and the context each belongs to
        wanted = [suffix_keys(context, info) for context in contexts]
        cached = iter(client.cache.get_many(info.id, [k for keys in wanted for k in keys]))  # one lock for the batch
        for i, keys in enumerate(wanted):
            answers = [next(cached) for _ in keys]
            for j, k in enumerate(keys):  # longest first
                found, tree = answers[j]
                if not found:  # ask for it and every shorter one
                    self.ask_keys += keys[j:]
                    self.ask_ctx += [i] * (len(keys) - j)
                    break
                if tree is not None:
                    self.out[i] = Match(decode_key(k, info.key_width), tree)
                    break

    def finish(self, stored: dict[bytes, bytes]) -> list[Match | None]:
        """Each context's longest stored match, given the stored rows among the asked keys."""
        info, cache = self.info, self.client.cache
        decoded: dict[bytes, Match | None] = {}  # each key decoded once a batch
        done = -1  # the context whose longest stored key was found (its shorter keys are not needed)
        for k, i in zip(self.ask_keys, self.ask_ctx):  # each context's keys, longest first
            if i == done:
                continue
            blob = stored.get(k)
            if blob is None:
                cache.put(info.id, k, None)  # longer than the context's longest stored key
                continue
            if k not in decoded:
                match = decoded[k] = self.client._decode(info, k, blob)
                cache.put(info.id, k, None if match is None else match.tree)
            self.out[i], done = decoded[k], i
        self.client._counted(len(self.out), len(self.out) - len(set(self.ask_ctx)))
        return self.out


class _All:
    """One batch's plan for every stored suffix on one build (the back-off lookup's candidates)."""

    def __init__(self, client: LookupClient, info: DatastoreInfo, contexts: Sequence[Sequence[int]]) -> None:
        self.client, self.info = client, info
        self.wanted = [suffix_keys(context, info) for context in contexts]
        self.known: dict[bytes, TokenTree | None] = {}
        self.ask_keys: list[bytes] = []
        distinct = list(dict.fromkeys(k for keys in self.wanted for k in keys))
        for k, (found, tree) in zip(distinct, client.cache.get_many(info.id, distinct)):  # one lock for the batch
            if found:
                self.known[k] = tree
            else:
                self.ask_keys.append(k)

    def finish(self, stored: dict[bytes, bytes]) -> list[list[Match]]:
        """Each context's stored suffixes, longest first, given the stored rows among the asked keys."""
        info, known = self.info, self.known
        for k in self.ask_keys:
            match = self.client._decode(info, k, stored[k]) if k in stored else None
            known[k] = None if match is None else match.tree
            self.client.cache.put(info.id, k, known[k])
        asked = set(self.ask_keys)
        self.client._counted(len(self.wanted), sum(not any(k in asked for k in keys) for keys in self.wanted))
        return [[Match(decode_key(k, info.key_width), tree) for k in keys if (tree := known[k]) is not None]
                for keys in self.wanted]


def _id(info: DatastoreInfo | None) -> int | None:
    """A build's id (``None`` for no build)."""
    return None if info is None else info.id


class LookupClient(ABC):
    """Longest-match and candidate lookups in one ready datastore and, optionally, its live layer, with a tree cache:
    the core of both clients.

    Subclasses say how a query runs (:meth:`_execute`) and how the registry is read (:meth:`_read_registry`).

    Args:
        info: the ready build. fingerprint: the caller's tokenizer fingerprint (checked on every refresh).
        cache_bytes: the tree cache's bound, bytes (0: no cache).
        live_name: the live layer's datastore (:func:`datastore.layers.live_name`), answered with the datastore in
            :meth:`retrieve_batch`, with its delta (:func:`datastore.layers.delta_of`); ``None``: no
            live layer. A layer not built yet is no fault: it is read from the registry at every :meth:`refresh`.

    Attributes:
        info: the build being served (replaced when another is swapped in). live: the live layer's build, or
        ``None`` while there is none. delta: its delta's build, while one built on ``live`` serves
        (:func:`datastore.layers.delta_serves`), else ``None``. cache: the tree cache.
        lookups: contexts looked up. answered_from_cache: those answered without a round trip.
        round_trips: queries sent. query_s: seconds spent in them (sending, the server, receiving).
        swaps: builds followed. corrupt: stored trees that failed to decode.
    """

    def __init__(self, info: DatastoreInfo, fingerprint: str, cache_bytes: int, live_name: str | None = None) -> None:
        self.info = info
        self.live_name = live_name
        self.delta_name = None if live_name is None else delta_of(live_name)
        self.live: DatastoreInfo | None = None
        self.delta: DatastoreInfo | None = None
        self._fingerprint = fingerprint
        self.cache = TreeCache(cache_bytes)
        self.lookups = self.answered_from_cache = self.round_trips = self.swaps = self.corrupt = 0
        self.query_s = 0.0
        self._stats_lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._refused: set[str] = set()  # layers built with another tokenizer (warned once)

    @abstractmethod
    def _execute(self, query: str, params: Sequence) -> list:
        """Run one read query (binary parameters, prepared) and return its rows.

        Raises:
            psycopg.Error: as the driver raises it (mapped by the caller).
            datastore.errors.DatabaseUnavailable: when no connection can be had.
        """

    @abstractmethod
    def _read_registry(self, name: str) -> DatastoreInfo:
        """Datastore ``name``'s ready build now (:func:`resolve_build`)."""

    def _raise_fault(self) -> None:  # noqa: B027 - a hook: most clients know of no fault before a query
        """Raise a fault the client already knows of (a listener saw the datastore dropped), before querying."""

    def identity(self) -> dict:
        """What this client serves: the datastore's name and build id (a rebuild changes it), and its live layer's
        and the layer's delta's."""
        out: dict = {"datastore": self.info.name, "build": self.info.id}
        if self.live_name is not None:
            out["live"] = {"datastore": self.live_name, "build": None if self.live is None else self.live.id}
            out["delta"] = {"datastore": self.delta_name, "build": None if self.delta is None else self.delta.id}
        return out

    def _read_layer(self, name: str | None) -> DatastoreInfo | None:
        """A live layer's ready build (``name``: the main build's or the delta's datastore), or ``None`` when it is not
        built (or was built with another tokenizer: logged once)."""
        if name is None:
            return None
        try:
            info = self._read_registry(name)
            check_tokenizer(info, self._fingerprint)
        except DatastoreNotFound:
            return None
        except TokenizerMismatch as exc:
            if name not in self._refused:
                log.warning("%s; drafting without it", exc)
                self._refused.add(name)
            return None
        return info

    def _read_live(self) -> tuple[DatastoreInfo | None, DatastoreInfo | None]:
        """The live layer's builds to serve: ``(main, delta)``, the delta only while it was built on that main build
        (:func:`datastore.layers.delta_serves`)."""
        live = self._read_layer(self.live_name)
        delta = self._read_layer(self.delta_name)
        return live, delta if delta_serves(live, delta) else None

    def _follow(self, old: DatastoreInfo | None, new: DatastoreInfo | None) -> bool:
        """Serve ``new`` instead of ``old`` (one layer); returns whether the build changed."""
        if (old and old.id) == (new and new.id):
            return False
        if old is not None:
            self.cache.drop_build(old.id)
        if new is not None:
            self.swaps += 1
            log.info("datastore %r: now serving build %d (was %s)", new.name, new.id, old and old.id)
        return True

    def refresh(self) -> bool:
        """Re-read the registry and follow a swapped-in build of the datastore or its live layer; returns whether
        either changed.

        Raises:
            datastore.errors.DatastoreNotFound, TokenizerMismatch, DatabaseUnavailable, LookupFailed: about the
            datastore (the live layer's absence is no fault).
        """
        with self._refresh_lock:
            info = self._read_registry(self.info.name)
            check_tokenizer(info, self._fingerprint)
            live, delta = self._read_live()
            changed = self._follow(self.info, info)
            self.info = info
            changed = self._follow(self.live, live) or changed
            changed = self._follow(self.delta, delta) or changed
            self.live, self.delta = live, delta
            self._serving()
            return changed

    def _serving(self) -> None:  # noqa: B027 - a hook: a client with replicas follows the builds served
        """The builds served (``info``, ``live``, ``delta``) were read from the registry."""

    def stores(self) -> Stores | None:
        """The host-local replicas of the builds served, when this client keeps them and they are ready
        (:mod:`datastore.replica`): a drafting step then reads them in the native core, with no round trip. ``None``
        here: every lookup is a round trip."""
        return None

    def replica_damaged(self, replica: Replica) -> None:  # noqa: B027 - only a client with replicas has any
        """A drafting step found ``replica`` (one of :meth:`stores`) damaged: it is dropped and written again."""

    def _query(self, info: DatastoreInfo, query: str, params: Sequence) -> list | None:
        """One round trip; ``None`` when a build's table is gone (replaced or dropped under us).

        Raises:
            datastore.errors.DatabaseUnavailable / LookupFailed: for a server-side failure.
        """
        start = time.perf_counter()
        try:
            rows = self._execute(query, params)
        except psycopg.errors.UndefinedTable:
            return None
        except psycopg.Error as exc:
            raise server_error(info.name, exc) from exc
        with self._stats_lock:
            self.round_trips += 1
            self.query_s += time.perf_counter() - start
        return rows

    def _retrying(self, op: Callable[[DatastoreInfo], T | None]) -> T:
        """Run ``op`` on the current builds; if a table is gone, follow the registry once and run it again (also when
        another thread, such as the swap listener, followed it between ``op`` reading the builds and this refresh)."""
        for attempt in (0, 1):
            self._raise_fault()
            info, live, delta = self.info, self.live, self.delta
            out = op(info)
            if out is not None:
                return out
            if attempt == 1:
                break
            followed = self.refresh() or \
                (self.info.id, _id(self.live), _id(self.delta)) != (info.id, _id(live), _id(delta))  # raises if dropped
            if not followed:
                read = ", ".join(f"{b.name!r} (build {b.id}, table {b.table})" for b in (info, live, delta) if b)
                raise LookupFailed(f"a tree table the lookup reads is missing although its build is ready: one of "
                                   f"{read}; rebuild that datastore")
        raise DatastoreNotFound(f"datastore {self.info.name!r} keeps being replaced; try again")

    def _decode(self, info: DatastoreInfo, key: bytes, blob: bytes) -> Match | None:
        try:
            return decode_match(info, key, blob)
        except CodecError as exc:
            with self._stats_lock:
                self.corrupt += 1
                first = self.corrupt == 1
            if first:
                log.warning("%s; drafting without the corrupt trees (output is unaffected)", exc)
            return None

    def _counted(self, contexts: int, answered: int) -> None:
        with self._stats_lock:
            self.lookups += contexts
            self.answered_from_cache += answered

    def _stored(self, info: DatastoreInfo, asks: Sequence[tuple[DatastoreInfo, _Longest | _All]]) -> list[dict] | None:
        """One round trip for every layer's asked keys: per layer, ``key -> tree blob`` of the stored ones; ``None``
        when a table is gone. No query when nothing is asked. One layer asking for one context's longest match
        probes its keys longest first, and the server stops at the first stored one."""
        asking = [i for i, (_, plan) in enumerate(asks) if plan.ask_keys]
        out: list[dict] = [{} for _ in asks]
        if not asking:
            return out
        if len(asking) == 1 and isinstance(plan := asks[asking[0]][1], _Longest) and len(set(plan.ask_ctx)) == 1:
            rows = self._query(info, longest_match_sql(asks[asking[0]][0].table, len(plan.ask_keys)), plan.ask_keys)
            rows = None if rows is None else [(0, key, blob) for key, blob in rows]
        else:
            rows = self._query(info, any_keys_sql(tuple(asks[i][0].table for i in asking)),
                               [list(dict.fromkeys(asks[i][1].ask_keys)) for i in asking])
        if rows is None:
            return None
        for at, key, blob in rows:
            out[asking[at]][bytes(key)] = blob
        return out

    def lookup(self, context: TokenIds) -> Match | None:
        """:meth:`lookup_batch` for one context.

        Raises:
            datastore.errors.InvalidContext: when ``context`` is not a sequence of token ids in the vocabulary.
            the errors of :meth:`lookup_batch`.
        """
        info = self.info
        return self._longest([check_context(context, info.vocab_size, info.max_n)])[0]

    def lookup_batch(self, contexts: Sequence[TokenIds] | np.ndarray) -> list[Match | None]:
        """For each context, the tree of its longest stored suffix (n in ``info.ns``), or ``None``; one round
        trip for every key of the batch the cache cannot answer (none when it answers all).

        Args:
            contexts: the sequences so far (each a list, tuple or 1-D integer array of token ids, or a 2-D integer
                array, one per row); their last ``max_n`` tokens are used.

        Raises:
            datastore.errors.InvalidContext: when ``contexts`` is not a sequence of contexts, or a context is not
                a sequence of token ids in the tokenizer's vocabulary (nothing is looked up).
            datastore.errors.DatabaseUnavailable: when the server cannot be reached.
            datastore.errors.DatastoreNotFound / TokenizerMismatch: while the datastore is dropped or rebuilt
                with another tokenizer.
            datastore.errors.LookupFailed: for any other server-side refusal.
        """
        return self._longest(self._tails(contexts))

    def _longest(self, tails: list[list[int]]) -> list[Match | None]:
        def op(info: DatastoreInfo) -> list[Match | None] | None:
            plan = _Longest(self, info, tails)
            stored = self._stored(info, [(info, plan)])
            return None if stored is None else plan.finish(stored[0])

        return self._retrying(op)

    def candidates_batch(self, contexts: Sequence[TokenIds] | np.ndarray) -> list[list[Match]]:
        """For each context, the trees of ALL its stored suffixes (n in ``info.ns``), longest first: the
        back-off lookup's candidates. One round trip for every key of the batch the cache cannot answer.

        Raises:
            the errors of :meth:`lookup_batch`.
        """
        tails = self._tails(contexts)

        def op(info: DatastoreInfo) -> list[list[Match]] | None:
            plan = _All(self, info, tails)
            stored = self._stored(info, [(info, plan)])
            return None if stored is None else plan.finish(stored[0])

        return self._retrying(op)

    def retrieve_batch(self, contexts: Sequence[TokenIds] | np.ndarray, back_off: Sequence[bool]) -> list[Retrieval]:
        """A drafting step's lookups in one round trip: per context, the datastore's candidates (every stored
        suffix, longest first, where its ``back_off`` is true; else the longest only) and the live layer's longest
        match, in its main build and in its delta.

        Args:
            contexts: as :meth:`lookup_batch`. back_off: ``[len(contexts)]`` bools, per context.

        Raises:
            ValueError: when ``back_off`` does not have one entry per context.
            the errors of :meth:`lookup_batch` (about the datastore: the live layer's absence is no fault).
        """
        tails = self._tails(contexts)
        if len(back_off) != len(tails):
            raise ValueError(f"back_off has {len(back_off)} entries for {len(tails)} contexts; give one per context")
        every = [i for i, b in enumerate(back_off) if b]
        longest = [i for i, b in enumerate(back_off) if not b]

        def op(info: DatastoreInfo) -> list[Retrieval] | None:
            live, delta = self.live, self.delta
            plans: list[tuple[DatastoreInfo, _All | _Longest]] = []
            if every:
                plans.append((info, _All(self, info, [tails[i] for i in every])))
            if longest:
                plans.append((info, _Longest(self, info, [tails[i] for i in longest])))
            for layer in (live, delta):
                if layer is not None:
                    plans.append((layer, _Longest(self, layer, tails)))
            stored = self._stored(info, plans)
            if stored is None:
                return None
            answers = iter([plan.finish(rows) for (_, plan), rows in zip(plans, stored)])
            cands: list[list[Match]] = [[] for _ in tails]
            for i, found in zip(every, next(answers) if every else []):
                cands[i] = found  # type: ignore[assignment]
            for i, match in zip(longest, next(answers) if longest else []):
                cands[i] = [] if match is None else [match]  # type: ignore[list-item]
            lives = next(answers) if live is not None else [None] * len(tails)
            deltas = next(answers) if delta is not None else [None] * len(tails)
            return [Retrieval(c, m, d) for c, m, d in zip(cands, lives, deltas)]  # type: ignore[arg-type]

        return self._retrying(op)

    def _tails(self, contexts: Sequence[TokenIds] | np.ndarray) -> list[list[int]]:
        info = self.info
        return check_batch(contexts, info.vocab_size, max(info.max_n, 8))

    def stats(self) -> dict:
        """Lookups, the share answered from the cache, round trips, swaps followed, corrupt trees and the
        cache's own figures."""
        with self._stats_lock:
            return {"lookups": self.lookups, "cache_hit_rate": self.answered_from_cache / max(self.lookups, 1),
                    "round_trips": self.round_trips, "query_s": self.query_s, "swaps": self.swaps,
                    "corrupt": self.corrupt,
                    "cache_entries": len(self.cache), "cache_bytes": self.cache.bytes,
                    "cache_evictions": self.cache.evictions}

    @abstractmethod
    def close(self) -> None:
        """Release the connection(s)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
