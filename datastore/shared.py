"""One datastore shared by every decoder of a process: pooled connections, cached trees, one round trip a batch.

:class:`SharedDatastore` answers the same longest-match lookups as :class:`datastore.Datastore` (CREST §3,
https://arxiv.org/abs/2408.04678), for many threads at once, with only ``SELECT`` and ``LISTEN`` (a reader role is
enough):

- a :class:`datastore.cache.TreeCache` holds decoded trees and absent keys, bounded in bytes (a hit costs no round
  trip);
- ``lookup_batch`` sends the keys the cache cannot answer, for a whole batch, in **one** query on a ``psycopg_pool``
  connection; ``retrieve_batch`` asks the live layer's keys in the same query;
- a build swap is pushed (``NOTIFY crest_datastores, '<name>'``), not polled: a listener thread follows the new build
  and drops the old one's cache entries; a datastore dropped, or rebuilt with another tokenizer, makes lookups raise
  (:class:`drafting.source.DatastoreSource` falls back);
- host-local replicas of the builds (:mod:`datastore.replica`), once ready, go to the drafting step (:meth:`stores`).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

from crest_native import Replica
from toolkit.console import clause
from toolkit.settings import Settings
from toolkit.tokenizer import tokenizer_fingerprint

from .cache import CACHE_BYTES
from .connection import connect, resolve_database_url
from .errors import ClosedError, DatabaseUnavailable, DatastoreError, DatastoreNotFound, TokenizerMismatch
from .layers import delta_of
from .lookup import LookupClient
from .queries import READER_APPLICATION, configure_reader
from .registry import SWAP_CHANNEL, DatastoreInfo, check_tokenizer, resolve_build
from .replica import HostReplicas, Stores
from .replica_file import database_key
from .schema import require_schema

__all__ = ["SharedDatastore"]

log = logging.getLogger(__name__)


class SharedDatastore(LookupClient):
    """Thread-safe, pooled, cached lookups in one ready datastore (:class:`datastore.lookup.LookupClient`:
    :meth:`lookup`, :meth:`lookup_batch`, :meth:`candidates_batch`, :meth:`stats`). Use :meth:`open`.
    """

    def __init__(self, url: str, info: DatastoreInfo, fingerprint: str, *, pool_size: int, cache_bytes: int,
                 listen: bool, connect_timeout_s: float, live_name: str | None,
                 replicas: HostReplicas | None = None) -> None:
        super().__init__(info, fingerprint, cache_bytes, live_name)
        self._url = url
        self._fault: DatastoreError | None = None
        self._timeout = connect_timeout_s
        self.replicas = replicas
        self._pool = ConnectionPool(url, min_size=1, max_size=pool_size, configure=configure_reader,
                                    kwargs={"autocommit": True, "application_name": READER_APPLICATION},
                                    name=f"crest-{info.name}", open=True)
        self.live, self.delta = self._read_live()
        self._serving()
        self._closing = threading.Event()
        self._listening = threading.Event()
        self._listener = None
        if listen:
            self._listener = threading.Thread(target=self._listen, name=f"crest-listen-{info.name}", daemon=True)
            self._listener.start()

    @classmethod
    def open(cls, name: str, *, tokenizer=None, fingerprint: str | None = None, database_url: str | None = None,
             pool_size: int = 4, cache_bytes: int = CACHE_BYTES, listen: bool = True,
             connect_timeout_s: float = 2.0, live: str | None = None,
             replicas: bool | Path = True) -> SharedDatastore:
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
            live: the live layer's datastore (:func:`datastore.layers.live_name`), answered with ``name`` in one
                round trip by :meth:`retrieve_batch`; ``None``: none. It may be built later: the listener picks it up.
            replicas: keep host-local replicas of the builds served (:mod:`datastore.replica`), in the folder of
                ``CREST_REPLICAS`` (``True``; none when it is ``off``) or in the folder given; ``False``: none, every
                lookup is a round trip.

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
        with connect(url, autocommit=True, application_name=READER_APPLICATION) as conn:  # fails fast, with the fix
            require_schema(conn)
            info = resolve_build(conn, name)
            database = database_key(conn)
        check_tokenizer(info, fingerprint)
        root = (Settings.from_env().replicas_dir if replicas is True else replicas) if replicas is not False else None
        layers = [name] + ([live, delta_of(live)] if live else [])
        host = HostReplicas(url, Path(root), database, layers) if root else None
        return cls(url, info, fingerprint, pool_size=pool_size, cache_bytes=cache_bytes, listen=listen,
                   connect_timeout_s=connect_timeout_s, live_name=live, replicas=host)

    # -- build swaps ------------------------------------------------------------------------------------------

    def _read_registry(self, name: str) -> DatastoreInfo:
        try:
            with self._pool.connection(timeout=self._timeout) as conn:
                return resolve_build(conn, name)
        except PoolTimeout as exc:
            raise DatabaseUnavailable(f"datastore {self.info.name!r} is unreachable: {clause(exc)}") from exc

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
                with connect(self._url, autocommit=True, application_name=f"{READER_APPLICATION} listener") as conn:
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(SWAP_CHANNEL)))
                    self._on_notice()  # catch up with anything missed while not listening
                    self._listening.set()
                    while not self._closing.is_set():
                        for note in conn.notifies(timeout=0.2):  # close() waits at most this long for the thread
                            if note.payload in (self.info.name, self.live_name, self.delta_name):
                                self._on_notice()
            except (psycopg.Error, DatastoreError):
                self._listening.clear()
                self._closing.wait(1.0)  # the server is down or restarting: try again

    def wait_listening(self, timeout: float = 5.0) -> bool:
        """Block until the listener is subscribed (tests and benchmarks); returns whether it is."""
        return self._listening.wait(timeout)

    # -- lookups (LookupClient) ------------------------------------------------------------------------------

    def _raise_fault(self) -> None:
        if self._fault is not None:
            raise self._fault

    # -- replicas -------------------------------------------------------------------------------------------------

    def _serving(self) -> None:
        if self.replicas is not None:
            builds: dict[str, DatastoreInfo | None] = {self.info.name: self.info}
            if self.live_name is not None and self.delta_name is not None:
                builds[self.live_name], builds[self.delta_name] = self.live, self.delta
            self.replicas.follow(builds)

    def stores(self) -> Stores | None:
        """The host-local replicas of the builds served when they are ready and the datastore is (``None``: the
        datastore was dropped or rebuilt with another tokenizer, or a replica is not ready)."""
        return None if self.replicas is None or self._fault is not None else self.replicas.stores()

    def replica_damaged(self, replica: Replica) -> None:
        if self.replicas is not None:
            self.replicas.damaged(replica)

    def _execute(self, query: str, params) -> list:
        if self._closing.is_set():
            raise ClosedError(f"this client of datastore {self.info.name!r} was closed; open a new one")
        try:
            with self._pool.connection(timeout=self._timeout) as conn:
                return conn.execute(query, params, prepare=True, binary=True).fetchall()
        except PoolTimeout as exc:
            raise DatabaseUnavailable(f"datastore {self.info.name!r} is unreachable: {clause(exc)}") from exc

    # -- the rest -----------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the listener and the replicas' keeper (a replica being written is abandoned, its temporary file
        removed) and close the pool, within about a second; final: a later lookup raises
        :class:`datastore.errors.ClosedError`."""
        self._closing.set()
        if self._listener is not None:
            self._listener.join(timeout=2.0)
        if self.replicas is not None:
            self.replicas.close()
        self._pool.close()
