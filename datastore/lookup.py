"""The lookup core under both clients: the longest stored suffix n-gram of a context, or all of them, in one
round trip for a whole batch of contexts.

CREST §3 (Ho et al., https://arxiv.org/abs/2408.04678): the drafter takes the last ``max_n`` .. 1 tokens of
the sequence and uses the tree of the longest of those suffixes that the datastore holds. Only the n-gram
lengths the build holds (``params.ns`` in the registry) are probed. Keys go to Postgres as binary ``bytea``
parameters of prepared statements:

- one context: a ``UNION ALL`` of single-key hash-index probes, longest first, under ``LIMIT 1``: the
  executor stops at the first (longest) hit and only that tree crosses the wire;
- many contexts, and the back-off lookup's candidates (every stored suffix): one ``key = ANY(...)`` query
  of every key the cache cannot answer; the client keeps each context's longest stored key (and decodes only
  that tree). For 32 contexts this takes half the time of a ``DISTINCT ON`` query that would return only the
  longest keys (1.5 vs 2.9 ms p50 here: the server's join and sort cost more than the extra rows).

A :class:`~datastore.cache.TreeCache` answers what it can first (decoded trees and absent keys, keyed by
build), so a lookup it answers costs no round trip. A corrupt tree is served as absent (counted, one
warning per client). A build replaced under a query is followed once (bounded retry) and the query re-run.

:class:`LookupClient` implements all of this once; :class:`datastore.Datastore` (one connection) and
:class:`datastore.shared.SharedDatastore` (a pool, a listener) only say how a query runs.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeVar

import numpy as np
import psycopg
from psycopg import sql

from .cache import TreeCache
from .codec import decode_tree
from .context import TokenIds, check_batch, check_context
from .errors import (
    CodecError,
    DatabaseUnavailable,
    DatastoreError,
    DatastoreNotFound,
    LookupFailed,
    TokenizerMismatch,
    clause,
)
from .keys import decode_key, encode_key
from .tree import Match, TokenTree

__all__ = ["DatastoreInfo", "LookupClient", "LOOKUP_TIMEOUT_S", "READER_APPLICATION", "configure_reader",
           "resolve_build", "check_tokenizer", "suffix_keys", "decode_match", "longest_match_sql", "server_error"]

log = logging.getLogger(__name__)
T = TypeVar("T")

LOOKUP_TIMEOUT_S = 2.0
"""``statement_timeout`` of a lookup connection: a lookup never waits longer (a timeout is a fault: the
caller drafts without the datastore). Lookups take about a millisecond; DDL never makes them queue
(:mod:`datastore.ddl`)."""
READER_APPLICATION = "crest-spec reader"
"""The ``application_name`` of lookup connections (``pg_stat_activity``)."""


def configure_reader(conn: psycopg.Connection, statement_timeout_s: float = LOOKUP_TIMEOUT_S) -> None:
    """Set a lookup connection's ``statement_timeout`` (seconds, > 0)."""
    conn.execute(sql.SQL("SET statement_timeout = {}").format(sql.Literal(f"{statement_timeout_s * 1000:.0f}ms")))


@dataclass(frozen=True)
class DatastoreInfo:
    """What a client needs to know about a ready build.

    Attributes:
        id: the build's registry id (changes with every rebuild).
        name: the datastore name. table: its tree table. key_width: bytes per token id in keys.
        ns: the n-gram lengths it holds, ascending (``params.ns``).
        tokenizer / tokenizer_fingerprint: what it was built with.
        params: the build parameters as recorded.
    """

    id: int
    name: str
    table: str
    key_width: int
    ns: tuple[int, ...]
    tokenizer: str
    tokenizer_fingerprint: str
    params: dict

    @property
    def max_n(self) -> int:
        """The longest n-gram stored (0 for an empty build)."""
        return max(self.ns, default=0)

    @property
    def vocab_size(self) -> int:
        """Token ids are below this: the build's tokenizer's vocabulary (``params.vocab_size``; builds made before
        it was recorded: what the key width can hold)."""
        return int(self.params.get("vocab_size") or 1 << (8 * self.key_width))


def server_error(name: str, exc: psycopg.Error) -> DatastoreError:
    """The :class:`~datastore.errors.DatastoreError` for a server-side failure of a query on datastore ``name``."""
    if isinstance(exc, psycopg.OperationalError):
        return DatabaseUnavailable(f"datastore {name!r} is unreachable: {clause(exc)}")
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return LookupFailed(f"this role may not read datastore {name!r} ({clause(exc)}); grant it with "
                            f"`python -m datastore grant-reader ROLE --name {name}`")
    return LookupFailed(f"lookup in datastore {name!r} failed: {type(exc).__name__}: {clause(exc)}")


def resolve_build(conn: psycopg.Connection, name: str) -> DatastoreInfo:
    """The ready build of datastore ``name`` (one registry query).

    Raises:
        datastore.errors.DatastoreNotFound: when ``name`` has no ready build (the message lists the ready ones).
        datastore.errors.LookupFailed: when the registry row records no n-gram lengths, or the role may not read it.
        datastore.errors.DatabaseUnavailable: when the server cannot be reached.
    """
    try:
        row = conn.execute(
            "SELECT id, trees_table, key_width, params, tokenizer, tokenizer_fingerprint FROM datastores "
            "WHERE name = %s AND state = 'ready'", [name]).fetchone()
        if row is None:
            names = [r[0] for r in conn.execute("SELECT name FROM datastores WHERE state = 'ready' ORDER BY name")]
    except psycopg.Error as exc:
        raise server_error(name, exc) from exc
    if row is None:
        raise DatastoreNotFound(
            f"no ready datastore named {name!r} (ready: {', '.join(names) or 'none'}); "
            f"build it with `python -m ingest build --name {name}`")
    ds_id, table, width, params, tok, fp = row
    if "ns" not in params:
        raise LookupFailed(f"build {ds_id} of datastore {name!r} records no n-gram lengths (params.ns); "
                           "run `python -m datastore migrate`, or rebuild it")
    return DatastoreInfo(ds_id, name, table, width, tuple(sorted(int(n) for n in params["ns"])), tok, fp, params)


def check_tokenizer(info: DatastoreInfo, fingerprint: str) -> None:
    """Refuse a caller whose tokenizer differs from the build's.

    Raises:
        datastore.errors.TokenizerMismatch: naming both tokenizers and the fix.
    """
    if info.tokenizer_fingerprint != fingerprint:
        raise TokenizerMismatch(
            f"datastore {info.name!r} was built with tokenizer {info.tokenizer!r} "
            f"(fingerprint {info.tokenizer_fingerprint[:12]}), the caller's tokenizer has fingerprint "
            f"{fingerprint[:12]}; rebuild the datastore with this tokenizer (--tokenizer) or use the matching one")


def suffix_keys(tail: Sequence[int], info: DatastoreInfo) -> list[bytes]:
    """Keys of the suffixes of ``tail`` (checked token ids, :func:`datastore.context.check_context`) of the
    lengths the build holds, longest first: slices of the longest one's key (keys are fixed-width tokens)."""
    longest = encode_key(tail[max(len(tail) - info.max_n, 0):], info.key_width)
    w = info.key_width
    return [longest[len(longest) - n * w:] for n in reversed(info.ns) if n * w <= len(longest)]


def decode_match(info: DatastoreInfo, key: bytes, blob: bytes) -> Match:
    """The :class:`~datastore.tree.Match` of one stored row.

    Raises:
        datastore.errors.CodecError: naming the datastore, its build and the n-gram whose tree is corrupt.
    """
    ngram = decode_key(key, info.key_width)
    try:
        return Match(ngram, decode_tree(blob))
    except CodecError as exc:
        raise CodecError(f"datastore {info.name!r} (build {info.id}) holds a corrupt tree for n-gram {ngram}: "
                         f"{clause(exc)}; rebuild it") from exc


@lru_cache(maxsize=1024)
def longest_match_sql(table: str, k: int) -> str:
    """The one-context longest-match query: ``k`` key probes of ``table``, longest key first, joined by
    ``UNION ALL`` under ``LIMIT 1``, so the server stops at the first stored key. Parameters: the ``k`` keys
    (``bytea``), sent in binary (``%b``: psycopg escapes text-format ``bytea`` with a regular expression).

    Args:
        table: the build's tree table. k: how many keys the query probes, >= 1.

    Returns:
        The SQL; it returns at most one row ``(key, tree)``.
    """
    probe = sql.SQL("(SELECT key, tree FROM {} WHERE key = {})").format(sql.Identifier(table),
                                                                        sql.Placeholder(format="b"))
    return sql.SQL("{} LIMIT 1").format(sql.SQL(" UNION ALL ").join([probe] * k)).as_string(None)


@lru_cache(maxsize=256)
def _all_keys_sql(table: str) -> str:
    """Every stored key among the given ones: rows ``(key, tree)``."""
    return sql.SQL("SELECT key, tree FROM {} WHERE key = ANY(%b)").format(sql.Identifier(table)).as_string(None)


class LookupClient(ABC):
    """Longest-match and candidate lookups in one ready datastore, with a tree cache: the core of both clients.

    Subclasses say how a query runs (:meth:`_execute`) and how the registry is read (:meth:`_read_registry`).

    Args:
        info: the ready build. fingerprint: the caller's tokenizer fingerprint (checked on every refresh).
        cache_bytes: the tree cache's bound, bytes (0: no cache).

    Attributes:
        info: the build being served (replaced when another is swapped in). cache: the tree cache.
        lookups: contexts looked up. answered_from_cache: those answered without a round trip.
        round_trips: queries sent. query_s: seconds spent in them (sending, the server, receiving).
        swaps: builds followed. corrupt: stored trees that failed to decode.
    """

    def __init__(self, info: DatastoreInfo, fingerprint: str, cache_bytes: int) -> None:
        self.info = info
        self._fingerprint = fingerprint
        self.cache = TreeCache(cache_bytes)
        self.lookups = self.answered_from_cache = self.round_trips = self.swaps = self.corrupt = 0
        self.query_s = 0.0
        self._stats_lock = threading.Lock()
        self._refresh_lock = threading.Lock()

    @abstractmethod
    def _execute(self, query: str, params: Sequence) -> list:
        """Run one read query (binary parameters, prepared) and return its rows.

        Raises:
            psycopg.Error: as the driver raises it (mapped by the caller).
            datastore.errors.DatabaseUnavailable: when no connection can be had.
        """

    @abstractmethod
    def _read_registry(self) -> DatastoreInfo:
        """The datastore's ready build now (:func:`resolve_build`)."""

    def _raise_fault(self) -> None:  # noqa: B027 - a hook: most clients know of no fault before a query
        """Raise a fault the client already knows of (a listener saw the datastore dropped), before querying."""

    def identity(self) -> dict:
        """What this client serves: the datastore's name and build id (a rebuild changes it)."""
        return {"datastore": self.info.name, "build": self.info.id}

    def refresh(self) -> bool:
        """Re-read the registry and follow a swapped-in build; returns whether the build changed.

        Raises:
            datastore.errors.DatastoreNotFound, TokenizerMismatch, DatabaseUnavailable, LookupFailed.
        """
        with self._refresh_lock:
            info = self._read_registry()
            check_tokenizer(info, self._fingerprint)
            old = self.info
            if info.id == old.id:
                return False
            self.info = info
            self.cache.drop_build(old.id)
            self.swaps += 1
            log.info("datastore %r: now serving build %d (was %d)", info.name, info.id, old.id)
            return True

    def _query(self, info: DatastoreInfo, query: str, params: Sequence) -> list | None:
        """One round trip; ``None`` when the build's table is gone (replaced or dropped under us).

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
        """Run ``op`` on the current build; if its table is gone, follow the registry once and run it again."""
        for attempt in (0, 1):
            self._raise_fault()
            info = self.info
            out = op(info)
            if out is not None:
                return out
            if attempt == 0 and self.info.id == info.id and not self.refresh():  # raises when it was dropped
                raise LookupFailed(f"the tree table of datastore {info.name!r} is missing although its build "
                                   f"{info.id} is ready; rebuild it")
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

    def lookup(self, context: TokenIds) -> Match | None:
        """:meth:`lookup_batch` for one context.

        Raises:
            datastore.errors.InvalidContext: when ``context`` is not a sequence of token ids in the vocabulary.
            the errors of :meth:`lookup_batch`.
        """
        info = self.info
        return self._retrying(lambda i: self._longest(i, [check_context(context, info.vocab_size, info.max_n)]))[0]

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
        info = self.info
        tails = check_batch(contexts, info.vocab_size, max(info.max_n, 8))
        return self._retrying(lambda i: self._longest(i, tails))

    def _longest(self, info: DatastoreInfo, contexts: Sequence[Sequence[int]]) -> list[Match | None] | None:
        out: list[Match | None] = [None] * len(contexts)
        ask_keys: list[bytes] = []  # keys the cache cannot answer ...
        ask_ctx: list[int] = []     # ... and the context each belongs to
        wanted = [suffix_keys(context, info) for context in contexts]
        cached = iter(self.cache.get_many(info.id, [k for keys in wanted for k in keys]))  # one lock for the batch
        for i, keys in enumerate(wanted):
            answers = [next(cached) for _ in keys]
            for j, k in enumerate(keys):  # longest first
                found, tree = answers[j]
                if not found:  # ask for it and every shorter one
                    ask_keys += keys[j:]
                    ask_ctx += [i] * (len(keys) - j)
                    break
                if tree is not None:
                    out[i] = Match(decode_key(k, info.key_width), tree)
                    break
        if ask_keys:
            if ask_ctx[0] == ask_ctx[-1]:  # one context: probe its keys one by one, stop at the first stored
                rows = self._query(info, longest_match_sql(info.table, len(ask_keys)), ask_keys)
            else:  # every stored one among the asked keys
                rows = self._query(info, _all_keys_sql(info.table), [list(dict.fromkeys(ask_keys))])
            if rows is None:
                return None
            stored = {bytes(key): blob for key, blob in rows}
            decoded: dict[bytes, Match | None] = {}  # each key decoded once a batch
            done = -1  # the context whose longest stored key was found (its shorter keys are not needed)
            for k, i in zip(ask_keys, ask_ctx):  # each context's keys, longest first
                if i == done:
                    continue
                blob = stored.get(k)
                if blob is None:
                    self.cache.put(info.id, k, None)  # longer than the context's longest stored key
                    continue
                if k not in decoded:
                    match = decoded[k] = self._decode(info, k, blob)
                    self.cache.put(info.id, k, None if match is None else match.tree)
                out[i], done = decoded[k], i
        self._counted(len(contexts), len(contexts) - len(set(ask_ctx)))
        return out

    def candidates_batch(self, contexts: Sequence[TokenIds] | np.ndarray) -> list[list[Match]]:
        """For each context, the trees of ALL its stored suffixes (n in ``info.ns``), longest first: the
        back-off lookup's candidates. One round trip for every key of the batch the cache cannot answer.

        Raises:
            the errors of :meth:`lookup_batch`.
        """
        info = self.info
        tails = check_batch(contexts, info.vocab_size, max(info.max_n, 8))
        return self._retrying(lambda i: self._all(i, tails))

    def _all(self, info: DatastoreInfo, contexts: Sequence[Sequence[int]]) -> list[list[Match]] | None:
        wanted = [suffix_keys(context, info) for context in contexts]
        known: dict[bytes, TokenTree | None] = {}
        ask: list[bytes] = []
        distinct = list(dict.fromkeys(k for keys in wanted for k in keys))
        for k, (found, tree) in zip(distinct, self.cache.get_many(info.id, distinct)):  # one lock for the batch
            if found:
                known[k] = tree
            else:
                ask.append(k)
        if ask:
            rows = self._query(info, _all_keys_sql(info.table), [ask])
            if rows is None:
                return None
            blobs = {bytes(k): blob for k, blob in rows}
            for k in ask:
                match = self._decode(info, k, blobs[k]) if k in blobs else None
                known[k] = None if match is None else match.tree
                self.cache.put(info.id, k, known[k])
        asked = set(ask)
        self._counted(len(contexts), sum(not any(k in asked for k in keys) for keys in wanted))
        return [[Match(decode_key(k, info.key_width), tree) for k in keys if (tree := known[k]) is not None]
                for keys in wanted]

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
