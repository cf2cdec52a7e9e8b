"""Write one datastore build (``DatastoreWriter``): a staged table, binary COPY, index after load, atomic swap.

1. ``begin`` (before the build reads its corpus): take a session advisory lock on the name, held to the swap, so a
   second build of the same name fails at once, naming this one; drop the tables of builds that no longer serve when
   free (:func:`datastore.admin.ddl.vacuum`); mark earlier ``building`` rows of the name ``failed`` (interrupted: nobody
   held the lock); insert a ``building`` row and create its empty ``token_trees_<id>`` table.
2. ``write``: binary COPY of (key, tree) rows (psycopg 3).
3. ``finish``: ANALYZE, ``CREATE INDEX ... USING hash (key)``, measure bytes on disk, and in one transaction grant
   ``SELECT`` to the name's readers (:mod:`datastore.admin.grants`), retire the previous ready build, mark this one
   ``ready`` and ``NOTIFY`` the swap (:data:`datastore.registry.SWAP_CHANNEL`). The retired build's table is dropped
   when no session holds it (:func:`datastore.admin.ddl.drop_when_free`), else left in :attr:`DatastoreWriter.pending`.

Until step 3 commits, readers see the previous build (or nothing). On an exception inside the ``with`` block the build
is marked ``failed`` and its table dropped (when free).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
from psycopg import sql

from ..connection import APPLICATION_NAME, connect, one_row
from ..errors import BuildConflict
from ..registry import SWAP_CHANNEL, TREE_TABLE_PREFIX, name_lock_key
from .ddl import PendingDrop, drop_when_free, vacuum
from .grants import grant_to_readers
from .migrate import upgrade

__all__ = ["DatastoreWriter"]


def _running(conn: psycopg.Connection, name: str) -> str:
    """The message for a build refused because another build of ``name`` holds its lock (which registers itself
    right after taking it: a moment is waited for its row)."""
    row = None
    for _ in range(40):
        row = conn.execute("SELECT id, created_at FROM datastores WHERE name = %s AND state = 'building' "
                           "ORDER BY id DESC LIMIT 1", [name]).fetchone()
        if row is not None:
            break
        time.sleep(0.05)
    running = "another build" if row is None else f"build {row[0]} (started {row[1]:%Y-%m-%d %H:%M:%S %Z})"
    return (f"{running} of datastore {name!r} is running: one build per name at a time; wait for it to finish, "
            "or build under another --name")


class DatastoreWriter:
    """One build in progress; use :meth:`begin` and the ``with`` statement.

    Attributes:
        build_id: the ``datastores.id`` of this build.
        table: the build's tree table name.
        rows: rows written so far.
        pending: tables that left the registry (earlier builds) but were still in use, so not dropped yet.
    """

    def __init__(self, conn: psycopg.Connection, name: str, build_id: int, table: str, url: str | None = None) -> None:
        self._conn = conn
        self._url = url
        self.name = name
        self.build_id = build_id
        self.table = table
        self.rows = 0
        self.pending: list[PendingDrop] = []
        self._done = False

    @classmethod
    def begin(
        cls,
        url: str,
        name: str,
        *,
        tokenizer: str,
        tokenizer_fingerprint: str,
        key_width: int,
        corpus: dict,
        params: dict,
    ) -> DatastoreWriter:
        """Start a build of ``name``, bringing the registry schema up to date first.

        Args:
            url: libpq URL of a role that may create tables.
            name: the datastore name (1..200 characters).
            tokenizer / tokenizer_fingerprint: the tokenizer spec and its fingerprint.
            key_width: bytes per token id in keys, 2 or 4.
            corpus / params: recorded with the build (JSON objects).

        Raises:
            datastore.errors.BuildConflict: when another build of ``name`` holds the lock.
            datastore.errors.DatabaseUnavailable: when the server cannot be reached.
            ValueError: for an empty name or a key width other than 2 or 4.
        """
        if not name or len(name) > 200:
            raise ValueError(f"datastore name must be 1..200 characters, got {name!r}")
        if key_width not in (2, 4):
            raise ValueError(f"key_width must be 2 or 4, got {key_width}")
        upgrade(url)
        conn = connect(url, autocommit=True, application_name=f"{APPLICATION_NAME} build {name}"[:63])
        try:
            got = one_row(conn, "SELECT pg_try_advisory_lock(%s)", [name_lock_key(name)])[0]
            if not got:
                raise BuildConflict(_running(conn, name))
            with conn.transaction():
                conn.execute("UPDATE datastores SET state = 'failed', error = 'interrupted before completion' "
                             "WHERE name = %s AND state = 'building'", [name])
                build_id = one_row(conn, "SELECT nextval(pg_get_serial_sequence('datastores', 'id'))")[0]
                table = f"{TREE_TABLE_PREFIX}{build_id}"
                conn.execute(
                    "INSERT INTO datastores (id, name, state, trees_table, tokenizer, tokenizer_fingerprint, "
                    "key_width, corpus, params) VALUES (%s, %s, 'building', %s, %s, %s, %s, %s, %s)",
                    [build_id, name, table, tokenizer, tokenizer_fingerprint, key_width,
                     json.dumps(corpus), json.dumps(params)])
                conn.execute(sql.SQL("CREATE TABLE {} (key bytea NOT NULL, tree bytea NOT NULL)").format(
                    sql.Identifier(table)))
            _, pending = vacuum(conn)  # leftovers of earlier builds (this name's interrupted ones included)
        except BaseException:
            conn.close()
            raise
        writer = cls(conn, name, build_id, table, url)
        writer.pending = pending
        return writer

    def write(self, keys: Sequence[bytes], trees: Sequence[bytes]) -> None:
        """Append rows by binary COPY.

        Args:
            keys: n-gram keys (``n * key_width`` bytes each, big-endian ids).
            trees: codec blobs, one per key.

        Raises:
            ValueError: when the two sequences differ in length.
        """
        if len(keys) != len(trees):
            raise ValueError(f"{len(keys)} keys but {len(trees)} trees")
        stmt = sql.SQL("COPY {} (key, tree) FROM STDIN (FORMAT BINARY)").format(sql.Identifier(self.table))
        with self._conn.cursor() as cur, cur.copy(stmt) as copy:
            copy.set_types(["bytea", "bytea"])
            for row in zip(keys, trees):
                copy.write_row(row)
        self.rows += len(keys)

    def load_parquet(self, files: Sequence[Path], connections: int = 2, batch_rows: int = 65_536) -> int:
        """Append the ``key`` and ``tree`` columns of Parquet files by binary COPY, over parallel connections.

        Each file is COPYed whole on one connection (its own transaction); ``connections`` files
        load at once. This is how a distributed build (``--engine spark``) hands its partitions over.

        Args:
            files: Parquet files with binary ``key`` and ``tree`` columns (other columns are ignored).
            connections: parallel connections (>= 1).
            batch_rows: rows read from a file at a time.

        Returns:
            Rows loaded.

        Raises:
            ValueError: when ``connections`` < 1, the writer was made without a URL, or a file lacks
                a ``key`` or ``tree`` column.
        """
        import pyarrow.parquet as pq

        if connections < 1:
            raise ValueError(f"connections must be >= 1, got {connections}")
        url = self._url
        if url is None:
            raise ValueError("load_parquet needs a writer made by DatastoreWriter.begin")
        for f in files:
            names = pq.read_schema(f).names
            if "key" not in names or "tree" not in names:
                raise ValueError(f"{f} has no key/tree columns (columns: {names})")
        stmt = sql.SQL("COPY {} (key, tree) FROM STDIN (FORMAT BINARY)").format(sql.Identifier(self.table))

        def load(path: Path) -> int:
            rows = 0
            with connect(url, autocommit=True) as conn, conn.cursor() as cur, cur.copy(stmt) as copy:
                copy.set_types(["bytea", "bytea"])
                for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_rows, columns=["key", "tree"]):
                    for row in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                        copy.write_row(row)
                    rows += batch.num_rows
            return rows

        with ThreadPoolExecutor(max_workers=connections, thread_name_prefix="copy") as pool:
            loaded = sum(pool.map(load, list(files)))
        self.rows += loaded
        return loaded

    def copy_from(self, source_table: str, keys: Sequence[bytes]) -> int:
        """Append the rows of another build whose key is in ``keys``, server-side.

        The keys are COPYed into a temporary table and the rows are copied with one
        ``INSERT ... SELECT`` join, so tree blobs never leave the server. This is how a
        datastore over a subset of another's n-grams (a smaller top-t, a single n) is made
        without rebuilding its trees: a tree depends only on its n-gram and the corpus.

        Args:
            source_table: the other build's tree table (``token_trees_<id>``).
            keys: n-gram keys to copy (keys absent from the source are skipped).

        Returns:
            Rows copied.
        """
        with self._conn.transaction():
            self._conn.execute("CREATE TEMP TABLE subset_keys (key bytea NOT NULL) ON COMMIT DROP")
            with self._conn.cursor() as cur, cur.copy("COPY subset_keys (key) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["bytea"])
                for key in keys:
                    copy.write_row((key,))
            copied = self._conn.execute(sql.SQL(
                "INSERT INTO {} (key, tree) SELECT s.key, s.tree FROM {} s JOIN subset_keys k ON s.key = k.key"
            ).format(sql.Identifier(self.table), sql.Identifier(source_table))).rowcount
        self.rows += copied
        return copied

    def finish(self, *, ngram_stats: dict, num_tokens: int, timings: dict,
               corpus: dict | None = None) -> tuple[int, float]:
        """Index the table and make this build the ready one.

        Args:
            ngram_stats: per n (string keys): at least ``kept``, the rows of that n. The lengths
                with ``kept > 0`` are recorded as ``params.ns`` and their largest as
                ``params.max_n``: what a client probes.
            num_tokens: tokens in the corpus stream.
            timings: seconds per stage; recorded with an ``index`` entry added (ANALYZE, the
                hash index, the grants and the swap).
            corpus: replaces the recorded corpus report when given.

        Returns:
            ``(bytes_on_disk, index_seconds)``.
        """
        ns = sorted(int(n) for n, s in ngram_stats.items() if int(s.get("kept", 0)) > 0)
        t0 = time.perf_counter()
        ident = sql.Identifier(self.table)
        self._conn.execute(sql.SQL("ANALYZE {}").format(ident))
        self._conn.execute(sql.SQL("CREATE INDEX {} ON {} USING hash (key) WITH (fillfactor = 100)").format(
            sql.Identifier(f"{self.table}_key_hash"), ident))
        size = one_row(self._conn, "SELECT pg_total_relation_size(%s::regclass)", [self.table])[0]
        self._prewarm()
        with self._conn.transaction():
            old = self._conn.execute(
                "SELECT id, trees_table FROM datastores WHERE name = %s AND state = 'ready' FOR UPDATE",
                [self.name]).fetchall()
            grant_to_readers(self._conn, self.table, self.name)
            for old_id, _ in old:
                self._conn.execute("UPDATE datastores SET state = 'retired' WHERE id = %s", [old_id])
            index_seconds = time.perf_counter() - t0
            recorded = dict(timings, index=round(index_seconds, 3))
            self._conn.execute(
                "UPDATE datastores SET state = 'ready', completed_at = now(), num_trees = %s, num_tokens = %s, "
                "bytes_on_disk = %s, ngram_stats = %s, timings = %s, corpus = COALESCE(%s::jsonb, corpus), "
                "params = params || %s::jsonb WHERE id = %s",
                [self.rows, num_tokens, size, json.dumps(ngram_stats), json.dumps(recorded),
                 json.dumps(corpus) if corpus is not None else None,
                 json.dumps({"ns": ns, "max_n": max(ns, default=0)}), self.build_id])
            self._conn.execute("SELECT pg_notify(%s, %s)", [SWAP_CHANNEL, self.name])  # delivered at commit
        self._done = True
        self.pending += drop_when_free(self._conn, [t for _, t in old])  # out of the registry: dropped when free
        return int(size), index_seconds

    def _prewarm(self) -> None:
        """Load the new table and its index into shared buffers before the swap, where the server has the
        ``pg_prewarm`` extension (the embedded server does): the first lookups after the swap then read no
        page from disk. Skipped otherwise (``CREATE EXTENSION pg_prewarm`` enables it)."""
        if self._conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_prewarm'").fetchone():
            for rel in (self.table, f"{self.table}_key_hash"):
                self._conn.execute("SELECT pg_prewarm(%s::regclass)", [rel])

    def abort(self, reason: str) -> None:
        """Mark the build failed and drop its table (the previous ready build keeps serving)."""
        if self._done or self._conn.closed:
            return
        self._conn.execute("UPDATE datastores SET state = 'failed', error = %s WHERE id = %s",
                           [reason[:2000], self.build_id])
        self._done = True
        self.pending += drop_when_free(self._conn, [self.table])

    def close(self) -> None:
        """Release the name lock and the connection."""
        if not self._conn.closed:
            self._conn.close()

    def __enter__(self) -> DatastoreWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is not None:
                self.abort(f"{exc_type.__name__}: {exc}")
        finally:
            self.close()
