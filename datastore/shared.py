"""One datastore shared by every decoder of a process: pooled connections, cached trees, one round trip a batch.

:class:`SharedDatastore` answers the same longest-match lookups as
:class:`datastore.Datastore` (CREST §3, https://arxiv.org/abs/2408.04678), for many
threads at once:

- a :class:`datastore.cache.TreeCache` holds decoded trees and absent keys, keyed by
  build and n-gram and bounded in bytes; a lookup the cache can answer costs no
  round trip;
- ``lookup_batch`` sends the suffix keys the cache cannot answer, for every context of
  a batch, in **one** query on a connection from a ``psycopg_pool`` pool; the server
  returns each context's longest stored key only (``DISTINCT ON``), so one tree per
  context crosses the wire and is decoded, and the longer keys are learned as absent;
- a build swap is pushed, not polled: every build (and every drop) sends
  ``NOTIFY crest_datastores, '<name>'`` in the transaction that swaps it in, and a
  listener thread follows the new build at once and drops the old build's cache
  entries. A datastore dropped, or rebuilt with another tokenizer, makes lookups
  raise until it is back, so that :class:`decoder.drafters.DatastoreSource` falls back.

Only ``SELECT`` and ``LISTEN`` are used: a reader role (``python -m datastore
grant-reader``) is enough.
"""

from __future__ import annotations

import logging
import threading
from typing import Sequence

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

from .cache import TreeCache
from .client import (DatastoreInfo, check_tokenizer, decode_match, longest_match_sql, resolve_build, server_error,
                     suffix_keys)
from .connection import connect, resolve_database_url
from .errors import CodecError, DatabaseUnavailable, DatastoreError, DatastoreNotFound, TokenizerMismatch
from .keys import decode_key
from .models import SWAP_CHANNEL
from .schema import require_schema
from .tokenizer import tokenizer_fingerprint
from .tree import Match, TokenTree

__all__ = ["SharedDatastore"]

log = logging.getLogger(__name__)


class SharedDatastore:
    """Thread-safe, pooled, cached lookups in one ready datastore. Use :meth:`open`.

    Attributes:
        info: the build being served (replaced when another is swapped in).
        cache: the tree cache.
        lookups: contexts looked up. answered_from_cache: those answered without a round trip.
        round_trips: queries sent. swaps: builds followed since opening.
        corrupt: stored trees that failed to decode (served as absent).
    """

    def __init__(self, url: str, info: DatastoreInfo, fingerprint: str, *, pool_size: int, cache_bytes: int,
                 listen: bool, connect_timeout_s: float) -> None:
        self._url = url
        self.info = info
        self._fingerprint = fingerprint
        self.cache = TreeCache(cache_bytes)
        self.lookups = self.answered_from_cache = self.round_trips = self.swaps = self.corrupt = 0
        self._fault: DatastoreError | None = None
        self._refresh_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._timeout = connect_timeout_s
        self._queries: dict = {}  # table -> the batch query
        self._pool = ConnectionPool(url, min_size=1, max_size=pool_size, kwargs={"autocommit": True},
                                    name=f"crest-{info.name}", open=True)
        self._closing = threading.Event()
        self._listening = threading.Event()
        self._listener = None
        if listen:
            self._listener = threading.Thread(target=self._listen, name=f"crest-listen-{info.name}", daemon=True)
            self._listener.start()

    @classmethod
    def open(cls, name: str, *, tokenizer=None, fingerprint: str | None = None, database_url: str | None = None,
             pool_size: int = 4, cache_bytes: int = 64 << 20, listen: bool = True,
             connect_timeout_s: float = 2.0) -> "SharedDatastore":
        """Check and open the ready datastore ``name``; never writes.

        Args:
            name: the datastore name.
            tokenizer / fingerprint: the caller's tokenizer (or its fingerprint); must match the build's.
            database_url: libpq URL; default ``DATABASE_URL`` or the embedded server.
            pool_size: most pooled connections (>= 1): threads looking up at the same time.
            cache_bytes: the tree cache's bound, bytes (default 64 MiB; 0 disables it).
            listen: follow build swaps as they are notified (a thread and one more connection).
            connect_timeout_s: seconds a lookup waits for a pooled connection before the server
                counts as unreachable.

        Raises:
            ValueError: when neither ``tokenizer`` nor ``fingerprint`` is given, or ``pool_size < 1``.
            datastore.errors.DatastoreError: as :meth:`datastore.Datastore.open`.
        """
        if fingerprint is None:
            if tokenizer is None:
                raise ValueError("SharedDatastore.open needs the caller's tokenizer (or its fingerprint) to check it")
            fingerprint = tokenizer_fingerprint(tokenizer)
        if pool_size < 1:
            raise ValueError(f"pool_size={pool_size}: must be >= 1")
        url = resolve_database_url(database_url)
        with connect(url, autocommit=True) as conn:  # fails fast, with the fix in the message
            require_schema(conn)
            info = resolve_build(conn, name)
        check_tokenizer(info, fingerprint)
        return cls(url, info, fingerprint, pool_size=pool_size, cache_bytes=cache_bytes, listen=listen,
                   connect_timeout_s=connect_timeout_s)

    # -- build swaps ------------------------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Re-read the registry and follow a swapped-in build; returns whether the build changed.

        Raises:
            datastore.errors.DatastoreNotFound, TokenizerMismatch, DatabaseUnavailable, LookupFailed.
        """
        with self._refresh_lock:
            try:
                with self._pool.connection(timeout=self._timeout) as conn:
                    info = resolve_build(conn, self.info.name)
            except PoolTimeout as exc:
                raise DatabaseUnavailable(f"datastore {self.info.name!r} is unreachable: {exc}") from exc
            check_tokenizer(info, self._fingerprint)
            old = self.info
            if info.id == old.id:
                return False
            self.info = info
            self.cache.drop_build(old.id)
            self.swaps += 1
            log.info("datastore %r: now serving build %d (was %d)", info.name, info.id, old.id)
            return True

    def _on_notice(self) -> None:
        try:
            self.refresh()
            self._fault = None
        except (DatastoreNotFound, TokenizerMismatch) as exc:
            self._fault = exc  # lookups raise it: the caller falls back until it is fixed
        except DatastoreError:
            pass  # the server itself is the problem; lookups will say so

    def _listen(self) -> None:
        while not self._closing.is_set():
            try:
                with psycopg.connect(self._url, autocommit=True) as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(SWAP_CHANNEL)))
                    self._on_notice()  # catch up with anything missed while not listening
                    self._listening.set()
                    while not self._closing.is_set():
                        for note in conn.notifies(timeout=0.5):
                            if note.payload == self.info.name:
                                self._on_notice()
            except psycopg.Error:
                self._listening.clear()
                self._closing.wait(1.0)  # the server is down or restarting: try again

    def wait_listening(self, timeout: float = 5.0) -> bool:
        """Block until the listener is subscribed (tests and benchmarks); returns whether it is."""
        return self._listening.wait(timeout)

    # -- lookups ------------------------------------------------------------------------------------------------

    def _batch_sql(self, table: str) -> str:
        q = self._queries.get(table)
        if q is None:
            q = self._queries[table] = sql.SQL(
                "SELECT DISTINCT ON (w.ctx) w.ctx, t.key, t.tree "
                "FROM unnest(%b::bytea[], %b::int4[]) AS w(key, ctx) JOIN {} t ON t.key = w.key "
                "ORDER BY w.ctx, length(t.key) DESC").format(sql.Identifier(table)).as_string()
        return q

    def _fetch(self, info: DatastoreInfo, keys: list[bytes], owners: list[int]) -> list | None:
        """One round trip: for each context in ``owners``, its longest key among ``keys`` that the build
        holds, as ``(context, key, blob)`` rows; ``None`` when the build was replaced under us.

        One context's keys (longest first) are probed one by one until the first stored one (the
        plain client's query: it stops early); several contexts' keys go in one ``DISTINCT ON`` query."""
        if owners[0] == owners[-1]:
            rows = self._query(info, longest_match_sql(info.table, len(keys)), keys)
            return None if rows is None else [(owners[0], key, blob) for key, blob in rows]
        return self._query(info, self._batch_sql(info.table), [keys, owners])

    def _query(self, info: DatastoreInfo, query: str, params) -> list | None:
        """One round trip on a pooled connection; ``None`` when the build's table is gone (replaced under us).

        Raises:
            datastore.errors.DatabaseUnavailable / LookupFailed: as :meth:`lookup_batch`.
        """
        try:
            with self._pool.connection(timeout=self._timeout) as conn:
                rows = conn.execute(query, params, prepare=True, binary=True).fetchall()
        except psycopg.errors.UndefinedTable:
            return None
        except PoolTimeout as exc:
            raise DatabaseUnavailable(f"datastore {info.name!r} is unreachable: {exc}") from exc
        except psycopg.Error as exc:
            raise server_error(info.name, exc) from exc
        with self._stats_lock:
            self.round_trips += 1
        return rows

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

    def lookup_batch(self, contexts: Sequence[Sequence[int]]) -> list[Match | None]:
        """For each context, the tree of its longest stored suffix (n in ``info.ns``), or ``None``.

        The cache answers what it can; every key it cannot answer, for the whole batch, is
        fetched in one round trip.

        Raises:
            datastore.errors.DatabaseUnavailable: when the server cannot be reached.
            datastore.errors.DatastoreNotFound / TokenizerMismatch: while the datastore is dropped or
                rebuilt with another tokenizer.
            datastore.errors.LookupFailed: for any other server-side refusal.
        """
        for attempt in (0, 1):
            if self._fault is not None:
                raise self._fault
            info = self.info
            out: list[Match | None] = [None] * len(contexts)
            ask_keys: list[bytes] = []  # keys the cache cannot answer ...
            ask_ctx: list[int] = []     # ... and the context each belongs to
            for i, context in enumerate(contexts):
                keys = suffix_keys(context, info)
                for j, k in enumerate(keys):  # longest first
                    found, tree = self.cache.get(info.id, k)
                    if not found:  # ask for it and every shorter one
                        ask_keys += keys[j:]
                        ask_ctx += [i] * (len(keys) - j)
                        break
                    if tree is not None:
                        out[i] = Match(decode_key(k, info.key_width), tree)
                        break
            if ask_keys:
                rows = self._fetch(info, ask_keys, ask_ctx)
                if rows is None:  # replaced under us: follow it (raises when dropped), then once more
                    if attempt:
                        raise DatastoreNotFound(f"datastore {info.name!r} keeps being replaced; try again")
                    self.refresh()
                    continue
                longest = {ctx: (bytes(key), blob) for ctx, key, blob in rows}
                decoded: dict[bytes, Match | None] = {}  # each key decoded once a batch
                for k, i in zip(ask_keys, ask_ctx):
                    hit = longest.get(i)
                    if hit is None or len(k) > len(hit[0]):
                        self.cache.put(info.id, k, None)  # longer than the context's longest stored key
                    elif k == hit[0]:
                        if k not in decoded:
                            decoded[k] = self._decode(info, k, hit[1])
                            self.cache.put(info.id, k, None if decoded[k] is None else decoded[k].tree)
                        out[i] = decoded[k]
            with self._stats_lock:
                self.lookups += len(contexts)
                self.answered_from_cache += len(contexts) - len(set(ask_ctx))
            return out
        raise AssertionError("unreachable")  # pragma: no cover

    def _all_sql(self, table: str) -> str:
        q = self._queries.get(("all", table))
        if q is None:
            q = self._queries[("all", table)] = sql.SQL("SELECT t.key, t.tree FROM {} t WHERE t.key = ANY(%b)").format(
                sql.Identifier(table)).as_string()
        return q

    def candidates_batch(self, contexts: Sequence[Sequence[int]]) -> list[list[Match]]:
        """For each context, the trees of ALL its stored suffixes (n in ``info.ns``), longest first: the
        back-off lookup's candidates (:class:`decoder.drafters.DatastoreSource`). One round trip for every
        key of the batch the cache cannot answer (none when it answers all).

        Raises:
            the errors of :meth:`lookup_batch`.
        """
        for attempt in (0, 1):
            if self._fault is not None:
                raise self._fault
            info = self.info
            wanted = [suffix_keys(context, info) for context in contexts]
            known: dict[bytes, TokenTree | None] = {}
            ask: list[bytes] = []
            for keys in wanted:
                for k in keys:
                    if k in known:
                        continue
                    found, tree = self.cache.get(info.id, k)
                    if found:
                        known[k] = tree
                    elif k not in ask:
                        ask.append(k)
            if ask:
                rows = self._query(info, self._all_sql(info.table), [ask])
                if rows is None:  # replaced under us: follow it (raises when dropped), then once more
                    if attempt:
                        raise DatastoreNotFound(f"datastore {info.name!r} keeps being replaced; try again")
                    self.refresh()
                    continue
                blobs = {bytes(k): blob for k, blob in rows}
                for k in ask:
                    match = self._decode(info, k, blobs[k]) if k in blobs else None
                    known[k] = None if match is None else match.tree
                    self.cache.put(info.id, k, known[k])
            with self._stats_lock:
                self.lookups += len(contexts)
                self.answered_from_cache += sum(not any(k in ask for k in keys) for keys in wanted)
            return [[Match(decode_key(k, info.key_width), known[k]) for k in keys if known[k] is not None]
                    for keys in wanted]
        raise AssertionError("unreachable")  # pragma: no cover

    def lookup(self, context: Sequence[int]) -> Match | None:
        """:meth:`lookup_batch` for one context."""
        return self.lookup_batch([context])[0]

    # -- the rest -----------------------------------------------------------------------------------------------

    def identity(self) -> dict:
        """What this client serves: the datastore's name and build id."""
        return {"datastore": self.info.name, "build": self.info.id}

    def stats(self) -> dict:
        """Lookups, the share answered from the cache, round trips, swaps followed and the cache's own figures."""
        with self._stats_lock:
            return {"lookups": self.lookups, "cache_hit_rate": self.answered_from_cache / max(self.lookups, 1),
                    "round_trips": self.round_trips, "swaps": self.swaps, "corrupt": self.corrupt,
                    "cache_entries": len(self.cache), "cache_bytes": self.cache.bytes,
                    "cache_evictions": self.cache.evictions}

    def close(self) -> None:
        """Stop the listener and close the pool."""
        self._closing.set()
        if self._listener is not None:
            self._listener.join(timeout=2.0)
        self._pool.close()

    def __enter__(self) -> "SharedDatastore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
