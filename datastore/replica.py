"""Host-local replicas: each ready build (a datastore's, its live layer's) as one read-only file on the decoding host,
memory-mapped by every drafting process there, so a lookup costs a few memory reads and the page cache holds one copy.

PostgreSQL stays the system of record. :class:`HostReplicas` keeps a client's replicas in step with the builds it
serves: the first client on a host that wants a build's replica writes it (:mod:`datastore.replica_file`: a ``COPY``
a reader role may do, by a child process at the lowest CPU priority, under the host's lock) while the builds already
mapped serve. The native core probes it (:class:`crest_native.Replica`); its identity, CRC-32, slot blocks and size
are checked on open, and every block and record a lookup reads. A replica missing, of another build, truncated or
corrupt is never read: the previous builds' replicas or the round trip serve until a good one is written, and output
is the same. Settings: ``CREST_REPLICAS`` (the folder, or ``off``).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import psycopg

from crest_native import Replica, ReplicaError

from .registry import DatastoreInfo
from .replica_file import WriteReport, identity_of, open_replica, remove_unused, replica_path, write_in_child

__all__ = ["HostReplicas", "ReplicaError", "Stores"]

log = logging.getLogger(__name__)

CHECK_S = 1.0
"""Seconds between checks that the mapped files are still the ones on disk (and of the builds served)."""


class Stores(NamedTuple):
    """The replicas a drafting step reads: the datastore's, its live layer's and the layer's delta's (``None``: no
    build; in this order: a step names a damaged one by its index)."""

    datastore: Replica
    live: Replica | None
    delta: Replica | None = None


@dataclass
class _Layer:
    info: DatastoreInfo | None = None  # the build to serve (None: the layer has none)
    replica: Replica | None = None     # its replica, mapped (None: not yet)
    stale: bool = False                # the mapped file was removed or replaced on disk: ready it again
    refused: bool = False              # readying this build's replica failed once (warned)


class HostReplicas:
    """This process's replicas of one client's builds (its datastore's and its live layer's), kept in step with the
    builds it serves by a background thread: each build's file is mapped when it is good, written first when it is
    missing or bad (one writer per host), written again when it is found damaged or removed, and the files no build
    needs are removed once unused. Thread-safe.

    Args:
        url: the database (the client's URL; a reader role is enough).
        root: the host's replica folder. database: :func:`database_key` of the database.
        layers: the names of the layers served, the datastore first (``[name]`` or ``[name, name.live,
            name.live.delta]``).

    Attributes:
        written: replicas this process wrote (:class:`WriteReport` each). warnings: faults warned about.
    """

    def __init__(self, url: str, root: Path, database: str, layers: list[str]) -> None:
        self._url, self._root, self._database = url, root, database
        self._layers = {name: _Layer() for name in layers}
        self._names = layers
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._stores: Stores | None = None
        self.written: list[WriteReport] = []
        self.warnings = 0
        self._thread = threading.Thread(target=self._run, name="crest-replicas", daemon=True)
        self._thread.start()
        atexit.register(_close_at_exit, weakref.ref(self))  # no write left running in a daemon thread at exit

    # -- what the drafting step reads ---------------------------------------------------------------------------

    def stores(self) -> Stores | None:
        """The mapped replicas of the builds served now, or ``None`` while one of them is not ready."""
        return self._stores

    def damaged(self, replica: Replica) -> None:
        """A step found ``replica`` damaged (changed in place, cut short, or a slot block or record failing its check):
        stop reading it (one warning), remove the file and write it again in the background."""
        path, inode = Path(replica.path), replica.inode
        with self._lock:
            held = [layer for layer in self._layers.values() if layer.replica is replica]
            served = self._stores is not None and any(r is replica for r in self._stores)
            if held or served:
                self._warn(f"replica {path} is damaged (changed in place, cut short, or a slot block or record fails "
                           "its check); drafting from the round trip while it is written again (output is "
                           "unaffected)")
                _discard(path, inode)
            for layer in held:
                layer.replica = None
            if served:
                self._stores = None  # never read again, whether of the builds served or of the previous ones
            self._publish()
        self._wake.set()

    def follow(self, infos: dict[str, DatastoreInfo | None]) -> None:
        """Serve these builds (by layer name; ``None``: the layer has none): their replicas are readied in the
        background, and the stores served until now (of the previous builds) serve until every one is mapped (the
        drafts differ only in what the new builds add; output never depends on them)."""
        with self._lock:
            for name, info in infos.items():
                layer = self._layers[name]
                if (layer.info and layer.info.id) != (info and info.id):
                    layer.info, layer.replica, layer.stale, layer.refused = info, None, False, False
            self._publish()
        self._wake.set()

    def wait_ready(self, timeout: float) -> bool:
        """Block until the stores are ready (tests and benchmarks); returns whether they are."""
        deadline = time.monotonic() + timeout
        while self._stores is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return self._stores is not None

    def close(self) -> None:
        """Stop the background thread, within about a second: a replica being written is abandoned (its temporary file
        removed; the next client writes it). A mapped file is released once the last step reading it is done."""
        self._closing.set()
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        with self._lock:
            self._stores = None

    # -- the background thread ----------------------------------------------------------------------------------

    def _warn(self, message: str) -> None:
        self.warnings += 1
        log.warning(message)

    def _publish(self) -> None:
        """Recompute what the step reads (under the lock): the builds served, once every layer with a build has its
        replica mapped; until then, the last such set (of the previous builds), or none."""
        first, *rest = (self._layers[n] for n in self._names)
        layers = [layer.replica for layer in rest] + [None, None]
        ready = first.replica is not None and all(layer.info is None or layer.replica is not None for layer in rest)
        if ready and first.replica is not None:
            self._stores = Stores(first.replica, layers[0], layers[1])

    def _run(self) -> None:
        while not self._closing.is_set():
            for name in self._names:
                if self._closing.is_set():
                    return
                self._ready(name)
            self._check()
            self._wake.wait(CHECK_S)
            self._wake.clear()

    def _path(self, info: DatastoreInfo) -> Path:
        return replica_path(self._root, self._database, info)

    def _ready(self, name: str) -> None:
        """Map the replica of layer ``name``'s build, writing it first when it is missing or bad."""
        with self._lock:
            layer = self._layers[name]
            info = layer.info
            if info is None or (layer.replica is not None and not layer.stale):
                return
        path, identity = self._path(info), identity_of(info, self._database)
        try:
            replica = self._open_or_write(path, identity, info)
        except (ReplicaError, psycopg.Error, OSError) as exc:
            if self._closing.is_set():
                return  # abandoned by close(): nothing to warn about
            with self._lock:
                if layer.info is not info:
                    return  # the build was replaced meanwhile (its table may be gone): the next one is readied
                if not layer.refused:
                    layer.refused = True
                    self._warn(f"cannot ready the replica of datastore {info.name!r} build {info.id} ({exc}); drafting "
                               "from the round trip (output is unaffected); retrying")
            self._closing.wait(CHECK_S)
            return
        with self._lock:
            if layer.info is info:
                layer.replica, layer.stale = replica, False
                self._publish()
        remove_unused(path.parent, self._keep())

    def _keep(self) -> set[Path]:
        with self._lock:
            return {self._path(layer.info) for layer in self._layers.values() if layer.info is not None}

    def _open_or_write(self, path: Path, identity: bytes, info: DatastoreInfo) -> Replica:
        try:
            return open_replica(path, identity)
        except ReplicaError as exc:
            if path.exists():
                self._warn(f"{exc}; writing it again (drafting from the round trip meanwhile; output is unaffected)")
        report = write_in_child(self._url, self._root, info, path, self._closing)
        if report is not None:
            self.written.append(report)
        return open_replica(path, identity)

    def _check(self) -> None:
        """Drop a mapped replica changed in place (damaged); ready again one whose file was removed or replaced (its
        mapping serves meanwhile: it is still the build's)."""
        with self._lock:
            mapped = [r for layer in self._layers.values() if (r := layer.replica) is not None and not layer.stale]
        for replica in mapped:
            if not replica.unchanged():
                self.damaged(replica)
                continue
            try:
                same = Path(replica.path).stat().st_ino == replica.inode
            except FileNotFoundError:
                same = False
            if not same:
                log.info("replica %s was removed or replaced on disk; readying it again", replica.path)
                with self._lock:
                    for layer in self._layers.values():
                        if layer.replica is replica:
                            layer.stale = True
                self._wake.set()


def _close_at_exit(ref: weakref.ref) -> None:
    keeper = ref()
    if keeper is not None:
        keeper.close()


def _discard(path: Path, inode: int) -> None:
    """Remove a damaged replica file, when it is still the one that was mapped."""
    try:
        if path.stat().st_ino == inode:
            path.unlink()
    except FileNotFoundError:
        pass
