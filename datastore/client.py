"""The lookup client: longest stored suffix n-gram of a context, in one round trip.

CREST §3 (Ho et al., https://arxiv.org/abs/2408.04678): the drafter takes the
last ``max_n`` .. 1 tokens of the sequence and uses the tree of the longest of
those suffixes that the datastore holds. All candidate keys go to Postgres in one prepared statement as separate
parameters: a ``UNION ALL`` of single-key hash-index probes, longest n-gram
first, under ``LIMIT 1``, so the executor stops at the first (longest) hit and
only that tree crosses the wire. Only the n-gram lengths the build holds
(``params.ns`` in the registry) are probed.

A client only reads (``SELECT``): it checks the registry's schema revision
instead of migrating, so a least-privilege role (``python -m datastore
grant-reader``) can use it. Every failure is a :class:`datastore.errors.DatastoreError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import psycopg
from psycopg import sql

from .codec import decode_tree
from .connection import connect, resolve_database_url
from .errors import CodecError, DatabaseUnavailable, DatastoreNotFound, LookupFailed, TokenizerMismatch
from .keys import decode_key, encode_key
from .schema import require_schema
from .tokenizer import tokenizer_fingerprint
from .tree import Match

__all__ = ["Datastore", "DatastoreInfo", "resolve_build", "check_tokenizer", "suffix_keys", "decode_match",
           "longest_match_sql", "server_error"]


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


def server_error(name: str, exc: psycopg.Error) -> Exception:
    """The :class:`~datastore.errors.DatastoreError` for a server-side failure of a query on datastore ``name``."""
    if isinstance(exc, psycopg.OperationalError):
        return DatabaseUnavailable(f"datastore {name!r} is unreachable: {exc}")
    if isinstance(exc, psycopg.errors.InsufficientPrivilege):
        return LookupFailed(f"this role may not read datastore {name!r} ({exc}); grant it with "
                            f"`python -m datastore grant-reader ROLE --name {name}`")
    return LookupFailed(f"lookup in datastore {name!r} failed: {type(exc).__name__}: {exc}")


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


def suffix_keys(context: Sequence[int], info: DatastoreInfo) -> list[bytes]:
    """Keys of the context's suffixes of the lengths the build holds, longest first."""
    tail = [int(t) for t in context[-info.max_n:]] if info.max_n else []
    return [encode_key(tail[len(tail) - n:], info.key_width) for n in reversed(info.ns) if n <= len(tail)]


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
                         f"{exc}; rebuild it") from exc


class Datastore:
    """A read-only connection to one ready datastore.

    Use :meth:`open`. The instance holds one psycopg connection and is not
    thread-safe: use one client per thread. When the datastore is rebuilt under
    it, the next lookup follows the new build (after checking its tokenizer).
    """

    def __init__(self, conn: psycopg.Connection, info: DatastoreInfo, fingerprint: str) -> None:
        self._conn = conn
        self.info = info
        self._fingerprint = fingerprint
        self._queries: dict[int, str] = {}  # the batch query (key 0); composing SQL costs ~0.1 ms a call

    @classmethod
    def open(cls, name: str, *, tokenizer=None, fingerprint: str | None = None,
             database_url: str | None = None) -> "Datastore":
        """Connect to the ready datastore ``name``; never writes.

        Args:
            name: the datastore name given at build time.
            tokenizer: the caller's tokenizer; its fingerprint must match the build's.
            fingerprint: the caller's tokenizer fingerprint, instead of ``tokenizer``.
            database_url: libpq URL; default ``DATABASE_URL`` or the embedded server.

        Raises:
            ValueError: when neither ``tokenizer`` nor ``fingerprint`` is given.
            datastore.errors.DatabaseUnavailable: when Postgres cannot be reached.
            datastore.errors.SchemaMismatch: when the registry is not at the revision this client reads.
            datastore.errors.DatastoreNotFound: when ``name`` has no ready build.
            datastore.errors.TokenizerMismatch: when the fingerprints differ.
            datastore.errors.LookupFailed: when the role may not read the registry or the build.
        """
        if fingerprint is None:
            if tokenizer is None:
                raise ValueError("Datastore.open needs the caller's tokenizer (or its fingerprint) to check it")
            fingerprint = tokenizer_fingerprint(tokenizer)
        conn = connect(resolve_database_url(database_url), autocommit=True)
        try:
            require_schema(conn)
            info = resolve_build(conn, name)
            check_tokenizer(info, fingerprint)
        except BaseException:
            conn.close()
            raise
        return cls(conn, info, fingerprint)

    def identity(self) -> dict:
        """What this client serves: the datastore's name and build id (a rebuild changes it)."""
        return {"datastore": self.info.name, "build": self.info.id}

    def refresh(self) -> bool:
        """Re-read the registry and follow a rebuilt datastore; returns whether the build changed.

        Raises:
            datastore.errors.DatastoreNotFound, TokenizerMismatch, DatabaseUnavailable, LookupFailed:
            as :meth:`open`.
        """
        info = resolve_build(self._conn, self.info.name)
        check_tokenizer(info, self._fingerprint)
        changed = info.id != self.info.id
        if changed:
            self.info, self._queries = info, {}
        return changed

    def _batch_query(self) -> str:
        q = self._queries.get(0)
        if q is None:
            q = sql.SQL("SELECT key, tree FROM {} WHERE key = ANY(%b)").format(
                sql.Identifier(self.info.table)).as_string(self._conn)
            self._queries[0] = q
        return q

    def _execute(self, query: str, params) -> list | None:
        """Run a lookup query; ``None`` when the build was replaced under us (the caller retries once)."""
        try:
            return self._conn.execute(query, params, prepare=True, binary=True).fetchall()
        except psycopg.errors.UndefinedTable:
            old = self.info.id
            self.refresh()  # raises DatastoreNotFound when the datastore was dropped, not rebuilt
            if self.info.id == old:
                raise LookupFailed(f"the tree table of datastore {self.info.name!r} is missing although its "
                                   f"build {old} is ready; rebuild it") from None
            return None
        except psycopg.Error as exc:
            raise server_error(self.info.name, exc) from exc

    def lookup(self, context_tokens: Sequence[int]) -> Match | None:
        """The tree of the longest suffix of ``context_tokens`` (n in ``info.ns``, longest first) that is stored.

        Args:
            context_tokens: the sequence so far (prompt + generated), token ids.

        Returns:
            The :class:`~datastore.tree.Match`, or ``None`` when no suffix is stored.

        Raises:
            datastore.errors.DatabaseUnavailable: when the server cannot be reached.
            datastore.errors.DatastoreNotFound: when the datastore was dropped under the client.
            datastore.errors.TokenizerMismatch: when it was rebuilt with another tokenizer.
            datastore.errors.CodecError: when the stored tree is corrupt.
            datastore.errors.LookupFailed: for any other server-side refusal.
        """
        keys = suffix_keys(context_tokens, self.info)
        if not keys:
            return None
        rows = self._execute(longest_match_sql(self.info.table, len(keys)), keys)
        if rows is None:
            return self.lookup(context_tokens)
        return decode_match(self.info, *rows[0]) if rows else None

    def lookup_batch(self, contexts: Sequence[Sequence[int]]) -> list[Match | None]:
        """:meth:`lookup` for many sequences in one round trip (``key = ANY(...)``); raises as :meth:`lookup`."""
        wanted = [suffix_keys(ctx, self.info) for ctx in contexts]
        distinct = sorted({k for ks in wanted for k in ks})
        if not distinct:
            return [None] * len(contexts)
        rows = self._execute(self._batch_query(), [distinct])
        if rows is None:
            return self.lookup_batch(contexts)
        found = {bytes(k): blob for k, blob in rows}
        out: list[Match | None] = []
        for ks in wanted:
            hit = next((k for k in ks if k in found), None)
            out.append(None if hit is None else decode_match(self.info, hit, found[hit]))
        return out

    def candidates_batch(self, contexts: Sequence[Sequence[int]]) -> list[list[Match]]:
        """For each context, the trees of all its stored suffixes, longest first (the back-off lookup's
        candidates), in one round trip; raises as :meth:`lookup`."""
        wanted = [suffix_keys(ctx, self.info) for ctx in contexts]
        distinct = sorted({k for ks in wanted for k in ks})
        if not distinct:
            return [[] for _ in contexts]
        rows = self._execute(self._batch_query(), [distinct])
        if rows is None:
            return self.candidates_batch(contexts)
        found = {bytes(k): decode_match(self.info, bytes(k), blob) for k, blob in rows}
        return [[found[k] for k in ks if k in found] for ks in wanted]

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def __enter__(self) -> "Datastore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
