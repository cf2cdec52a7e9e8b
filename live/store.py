"""The live layer's store: every decoder process's finished outputs, in the ``live_outputs`` table, as uint32
little-endian token ids (:func:`encode_output`), and read back (:class:`LiveOutputs`) for an output index to learn
from (:class:`live.OutputFeed`).

The compacted layer holds contexts of at most CREST's n tokens; the raw outputs, read back here, let each process
match a request's last 64 tokens against every process's outputs (SuffixDecoding's global tree of earlier responses,
https://arxiv.org/abs/2411.04975, §3, shared by the fleet and kept across restarts). Reading needs ``SELECT`` on
``live_outputs`` (``python -m datastore grant-reader`` grants it with a live layer).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
import psycopg

from datastore.connection import APPLICATION_NAME, connect, resolve_database_url
from toolkit.forks import at_fork

__all__ = ["LiveOutputs", "Output", "decode_output", "encode_output"]

READER_APPLICATION = f"{APPLICATION_NAME} output reader"
"""The ``application_name`` of the reader's connection (``pg_stat_activity``)."""


def encode_output(tokens: Sequence[int]) -> bytes:
    """``[n]`` token ids -> ``4 n`` bytes, uint32 little-endian.

    Raises:
        ValueError: when ``tokens`` is empty or an id is outside ``[0, 2**32)``.
    """
    arr = np.asarray(tokens, dtype=np.int64)
    if arr.ndim != 1 or len(arr) == 0:
        raise ValueError(f"an output must be a non-empty 1-D token sequence, got shape {arr.shape}")
    if arr.min() < 0 or arr.max() >= 1 << 32:
        raise ValueError("token ids must be in [0, 2**32)")
    return arr.astype("<u4").tobytes()


def decode_output(blob: bytes) -> np.ndarray:
    """``4 n`` bytes -> ``[n]`` uint32 token ids.

    Raises:
        ValueError: when the length is not a positive multiple of 4.
    """
    if len(blob) == 0 or len(blob) % 4:
        raise ValueError(f"a stored output is a positive multiple of 4 bytes, got {len(blob)}")
    return np.frombuffer(blob, dtype="<u4").astype(np.uint32)


class Output(NamedTuple):
    """One finished output: its row ``id`` in ``live_outputs`` (ascending in append order) and its ``[n]`` uint32
    ``tokens`` (the generated tokens, not the prompt)."""

    id: int
    tokens: np.ndarray


class LiveOutputs:
    """Reads the finished outputs of datastore ``name``'s live layer, on one connection of its own (not thread-safe:
    one reader per thread).

    Args:
        name: the datastore whose outputs are read (the name a :class:`live.LiveWriter`
            appends under).
        database_url: a role with ``SELECT`` on ``live_outputs`` (``None``: ``DATABASE_URL`` or the embedded server).

    Raises:
        datastore.errors.DatabaseUnavailable: from a method, when the server cannot be reached (the connection is
            opened at the first read and again after a fault).
        psycopg.Error: from a method, for a fault of the query (e.g. ``SELECT`` not granted).
    """

    def __init__(self, name: str, database_url: str | None = None) -> None:
        self.name = name
        self.url = resolve_database_url(database_url)
        self._conn: psycopg.Connection | None = None
        at_fork(self, after_in_child=LiveOutputs._forked)

    def _forked(self) -> None:
        """In a forked child: the parent's connection is the parent's (:mod:`datastore.connection` disowns it); the
        next read opens the child's own."""
        self._conn = None

    def newest(self, max_tokens: int, *, skip_origin: str = "") -> list[Output]:
        """The newest outputs whose tokens add up to at most ``max_tokens``, oldest first, but those appended with
        origin ``skip_origin`` (this process's own: its index has them already).

        Raises:
            ValueError: when ``max_tokens < 0``.
        """
        if max_tokens < 0:
            raise ValueError(f"max_tokens={max_tokens}: must be >= 0")
        rows = self._query(
            "SELECT id, tokens FROM (SELECT id, tokens, sum(num_tokens) OVER (ORDER BY id DESC) AS upto "
            "FROM live_outputs WHERE name = %s AND origin <> %s) o WHERE upto <= %s ORDER BY id",
            [self.name, skip_origin, max_tokens])
        return [Output(int(i), decode_output(bytes(t))) for i, t in rows]

    def last_id(self) -> int:
        """The id of the newest output of this name (0: none)."""
        return int(self._query("SELECT coalesce(max(id), 0) FROM live_outputs WHERE name = %s", [self.name])[0][0])

    def ids_after(self, after_id: int, *, skip_origin: str = "") -> list[int]:
        """The ids of the outputs appended after ``after_id`` (ascending), but those of origin ``skip_origin``: an
        index-only read, so a caller fetches only the outputs it has not seen (:meth:`fetch`)."""
        return [int(i) for (i,) in self._query(
            "SELECT id FROM live_outputs WHERE name = %s AND id > %s AND origin <> %s ORDER BY id",
            [self.name, after_id, skip_origin])]

    def fetch(self, ids: Iterable[int]) -> list[Output]:
        """The outputs of these ids (of this name; an id that is not one is left out), in id order."""
        wanted = sorted(ids)
        if not wanted:
            return []
        rows = self._query("SELECT id, tokens FROM live_outputs WHERE name = %s AND id = ANY(%s) ORDER BY id",
                           [self.name, wanted])
        return [Output(int(i), decode_output(bytes(t))) for i, t in rows]

    def close(self) -> None:
        """Close the connection (a later read opens another)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _query(self, query: str, params: list) -> list[tuple]:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.url, autocommit=True, application_name=READER_APPLICATION)
        try:
            return self._conn.execute(query, params).fetchall()
        except psycopg.Error:
            self.close()  # a broken or inherited connection: the next read opens a new one
            raise
