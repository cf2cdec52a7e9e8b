"""The read path's SQL and keys: a lookup connection's settings (:func:`configure_reader`), the keys of a context's
stored suffixes (:func:`suffix_keys`), the longest-match and many-keys queries, and one stored row decoded
(:func:`decode_match`). Keys go as binary ``bytea`` parameters: one context is a ``UNION ALL`` of single-key
hash-index probes, longest first, under ``LIMIT 1``; many contexts, one ``key = ANY(...)`` query per layer of every key
the cache cannot answer. :class:`datastore.lookup.LookupClient` plans a batch with them."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import psycopg
from psycopg import sql

from toolkit.console import clause

from .codec import decode_tree
from .connection import track
from .errors import CodecError
from .keys import decode_key, encode_key
from .registry import DatastoreInfo
from .tree import Match

__all__ = ["LOOKUP_TIMEOUT_S", "READER_APPLICATION", "any_keys_sql", "configure_reader", "decode_match",
           "longest_match_sql", "suffix_keys"]

LOOKUP_TIMEOUT_S = 2.0
"""``statement_timeout`` of a lookup connection: a lookup never waits longer (a timeout is a fault: the
caller drafts without the datastore). Lookups take about a millisecond; DDL never makes them queue
(:mod:`datastore.admin.ddl`)."""
READER_APPLICATION = "crest-spec reader"
"""The ``application_name`` of lookup connections (``pg_stat_activity``)."""


def configure_reader(conn: psycopg.Connection, statement_timeout_s: float = LOOKUP_TIMEOUT_S) -> None:
    """Set a lookup connection's ``statement_timeout`` (seconds, > 0), and track it (a forked child disowns it:
    :func:`datastore.connection.track`)."""
    track(conn)
    conn.execute(sql.SQL("SET statement_timeout = {}").format(sql.Literal(f"{statement_timeout_s * 1000:.0f}ms")))


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
def any_keys_sql(tables: tuple[str, ...]) -> str:
    """Every stored key among the given ones, in each of ``tables``: rows ``(layer, key, tree)``, ``layer`` the
    table's index; one parameter (a ``bytea[]``) per table."""
    probe = sql.SQL("SELECT {}::int2, key, tree FROM {} WHERE key = ANY(%b)")
    return sql.SQL(" UNION ALL ").join(
        probe.format(sql.Literal(i), sql.Identifier(t)) for i, t in enumerate(tables)).as_string(None)
