"""The lookup client: longest stored suffix n-gram of a context, in one round trip.

CREST §3: the drafter takes the last ``max_n`` .. 1 tokens of the sequence and
uses the tree of the longest of those suffixes that the datastore holds. All
candidate keys go to Postgres in one prepared statement as separate parameters:
a ``UNION ALL`` of single-key hash-index probes, longest n-gram first, under
``LIMIT 1``, so the executor stops at the first (longest) hit and only that tree
crosses the wire.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import psycopg
from psycopg import sql

from .codec import decode_tree
from .connection import DatabaseUnavailable, connect, resolve_database_url
from .keys import decode_key, encode_key
from .migrate import ensure_schema
from .tokenizer import tokenizer_fingerprint
from .tree import TokenTree

__all__ = ["Datastore", "DatastoreInfo", "Match", "DatastoreNotFound", "TokenizerMismatch"]


class DatastoreNotFound(LookupError):
    """Raised when no ready datastore has the requested name."""


class TokenizerMismatch(ValueError):
    """Raised when the caller's tokenizer differs from the one the datastore was built with."""


@dataclass(frozen=True)
class DatastoreInfo:
    """What a client needs to know about a ready build."""

    id: int
    name: str
    table: str
    key_width: int
    max_n: int
    tokenizer: str
    tokenizer_fingerprint: str
    params: dict


@dataclass(frozen=True)
class Match:
    """A lookup hit: the matched context n-gram and its continuation tree."""

    ngram: tuple[int, ...]
    tree: TokenTree


def _resolve(conn: psycopg.Connection, name: str) -> DatastoreInfo:
    row = conn.execute(
        "SELECT id, trees_table, key_width, params, tokenizer, tokenizer_fingerprint FROM datastores "
        "WHERE name = %s AND state = 'ready'", [name]).fetchone()
    if row is None:
        names = [r[0] for r in conn.execute("SELECT name FROM datastores WHERE state = 'ready' ORDER BY name")]
        raise DatastoreNotFound(
            f"no ready datastore named {name!r} (ready: {', '.join(names) or 'none'}); "
            f"build it with `python -m ingest build --name {name}`")
    ds_id, table, width, params, tok, fp = row
    return DatastoreInfo(ds_id, name, table, width, int(params.get("max_n", 5)), tok, fp, params)


class Datastore:
    """A connection to one ready datastore.

    Use :meth:`open`; the instance holds one psycopg connection (not thread-safe:
    one client per thread).
    """

    def __init__(self, conn: psycopg.Connection, info: DatastoreInfo, fingerprint: str) -> None:
        self._conn = conn
        self.info = info
        self._fingerprint = fingerprint
        self._queries: dict[int, str] = {}  # by number of keys (0: batch); composing SQL costs ~0.1 ms a call

    @classmethod
    def open(cls, name: str, *, tokenizer=None, fingerprint: str | None = None,
             database_url: str | None = None) -> "Datastore":
        """Connect to the ready datastore ``name``.

        Args:
            name: the datastore name given at build time.
            tokenizer: the caller's tokenizer; its fingerprint must match the build's.
            fingerprint: the caller's tokenizer fingerprint, instead of ``tokenizer``.
            database_url: libpq URL; default ``DATABASE_URL`` or the embedded server.

        Raises:
            ValueError: when neither ``tokenizer`` nor ``fingerprint`` is given.
            DatastoreNotFound: when ``name`` has no ready build.
            TokenizerMismatch: when the fingerprints differ.
            DatabaseUnavailable: when Postgres cannot be reached.
        """
        if fingerprint is None:
            if tokenizer is None:
                raise ValueError("Datastore.open needs the caller's tokenizer (or its fingerprint) to check it")
            fingerprint = tokenizer_fingerprint(tokenizer)
        url = resolve_database_url(database_url)
        ensure_schema(url)
        conn = connect(url, autocommit=True)
        try:
            info = _resolve(conn, name)
            cls._check(info, fingerprint)
        except BaseException:
            conn.close()
            raise
        return cls(conn, info, fingerprint)

    @staticmethod
    def _check(info: DatastoreInfo, fingerprint: str) -> None:
        if info.tokenizer_fingerprint != fingerprint:
            raise TokenizerMismatch(
                f"datastore {info.name!r} was built with tokenizer {info.tokenizer!r} "
                f"(fingerprint {info.tokenizer_fingerprint[:12]}), the caller's tokenizer has fingerprint "
                f"{fingerprint[:12]}; rebuild the datastore with this tokenizer (--tokenizer) or use the matching one")

    def _query(self, k: int) -> str:
        q = self._queries.get(k)
        if q is None:
            probe = sql.SQL("(SELECT key, tree FROM {} WHERE key = {})").format(
                sql.Identifier(self.info.table), sql.Placeholder())
            q = sql.SQL("{} LIMIT 1").format(sql.SQL(" UNION ALL ").join([probe] * k)).as_string(self._conn)
            self._queries[k] = q
        return q

    def _batch_query(self) -> str:
        q = self._queries.get(0)
        if q is None:
            q = sql.SQL("SELECT key, tree FROM {} WHERE key = ANY(%s)").format(
                sql.Identifier(self.info.table)).as_string(self._conn)
            self._queries[0] = q
        return q

    def _execute(self, query: str, params):
        try:
            return self._conn.execute(query, params, prepare=True, binary=True).fetchall()
        except psycopg.errors.UndefinedTable:
            # the datastore was rebuilt under us: follow it to the new build, once
            info = _resolve(self._conn, self.info.name)
            self._check(info, self._fingerprint)
            self.info, self._queries = info, {}
            return None
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(f"datastore {self.info.name!r} is unreachable: {exc}") from exc

    def lookup(self, context_tokens: Sequence[int]) -> Match | None:
        """The tree of the longest suffix of ``context_tokens`` (n = max_n..1) that is stored.

        Args:
            context_tokens: the sequence so far (prompt + generated), token ids.

        Returns:
            The :class:`Match`, or ``None`` when no suffix is stored.

        Raises:
            DatabaseUnavailable: when the server cannot be reached.
            datastore.codec.CodecError: when a stored tree is corrupt.
        """
        tail = list(context_tokens[-self.info.max_n:])
        keys = [encode_key(tail[len(tail) - n:], self.info.key_width) for n in range(len(tail), 0, -1)]
        if not keys:
            return None
        rows = self._execute(self._query(len(keys)), keys)
        if rows is None:
            return self.lookup(context_tokens)
        if not rows:
            return None
        key, blob = rows[0]
        return Match(decode_key(key, self.info.key_width), decode_tree(blob))

    def lookup_batch(self, contexts: Sequence[Sequence[int]]) -> list[Match | None]:
        """:meth:`lookup` for many sequences in one round trip (``key = ANY(...)``)."""
        width, max_n = self.info.key_width, self.info.max_n
        wanted: list[list[bytes]] = []
        for ctx in contexts:
            tail = list(ctx[-max_n:])
            wanted.append([encode_key(tail[len(tail) - n:], width) for n in range(len(tail), 0, -1)])
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
            out.append(None if hit is None else Match(decode_key(hit, width), decode_tree(found[hit])))
        return out

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def __enter__(self) -> "Datastore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
