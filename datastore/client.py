"""The lookup client: one read-only connection to one ready datastore (:mod:`datastore.lookup` does the lookups).

A client only reads (``SELECT``): it checks the registry's schema revision instead of migrating, so a
least-privilege role (``python -m datastore grant-reader``) can use it. Every failure is a
:class:`datastore.errors.DatastoreError`. For many threads of one process, use
:class:`datastore.shared.SharedDatastore` (a pool and a tree cache).
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from toolkit.tokenizer import tokenizer_fingerprint

from .connection import connect, resolve_database_url
from .lookup import LookupClient
from .queries import READER_APPLICATION, configure_reader
from .registry import DatastoreInfo, check_tokenizer, resolve_build
from .schema import require_schema


class Datastore(LookupClient):
    """A read-only connection to one ready datastore: :meth:`lookup`, :meth:`lookup_batch`,
    :meth:`candidates_batch` (:class:`datastore.lookup.LookupClient`), no cache.

    Use :meth:`open`. The instance holds one psycopg connection and is not thread-safe: use one client
    per thread. When the datastore is rebuilt under it, the next lookup follows the new build (after
    checking its tokenizer).
    """

    def __init__(self, conn: psycopg.Connection, info: DatastoreInfo, fingerprint: str,
                 live_name: str | None = None) -> None:
        super().__init__(info, fingerprint, cache_bytes=0, live_name=live_name)
        self._conn = conn
        self.live, self.delta = self._read_live()

    @classmethod
    def open(cls, name: str, *, tokenizer=None, fingerprint: str | None = None, database_url: str | None = None,
             live: str | None = None) -> Datastore:
        """Connect to the ready datastore ``name``; never writes.

        Args:
            name: the datastore name given at build time.
            tokenizer: the caller's tokenizer; its fingerprint must match the build's.
            fingerprint: the caller's tokenizer fingerprint, instead of ``tokenizer``.
            database_url: libpq URL; default ``DATABASE_URL`` or the embedded server.
            live: the live layer's datastore (:func:`datastore.layers.live_name`), answered with ``name`` by
                :meth:`retrieve_batch`; ``None``: none. This client reads it at open and at every rebuild it
                follows (:class:`datastore.shared.SharedDatastore` follows it at once).

        Raises:
            ValueError: when neither ``tokenizer`` nor ``fingerprint`` is given.
            datastore.errors.DatabaseUnavailable: when Postgres cannot be reached.
            datastore.errors.SchemaMismatch: when the registry is not at the revision this client reads.
            datastore.errors.DatastoreNotFound: when ``name`` has no ready build.
            datastore.errors.TokenizerMismatch: when the fingerprints differ.
            datastore.errors.LookupFailed: when the role may not read the registry or the build.

        The connection is named ``crest-spec reader`` and its statements time out after
        :data:`datastore.queries.LOOKUP_TIMEOUT_S` seconds.
        """
        if fingerprint is None:
            if tokenizer is None:
                raise ValueError("Datastore.open needs the caller's tokenizer (or its fingerprint) to check it")
            fingerprint = tokenizer_fingerprint(tokenizer)
        conn = connect(resolve_database_url(database_url), autocommit=True, application_name=READER_APPLICATION)
        try:
            configure_reader(conn)
            require_schema(conn)
            info = resolve_build(conn, name)
            check_tokenizer(info, fingerprint)
        except BaseException:
            conn.close()
            raise
        return cls(conn, info, fingerprint, live)

    def _execute(self, query: str, params: Sequence) -> list:
        return self._conn.execute(query, params, prepare=True, binary=True).fetchall()

    def _read_registry(self, name: str) -> DatastoreInfo:
        return resolve_build(self._conn, name)

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()
