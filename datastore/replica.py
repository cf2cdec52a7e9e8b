"""Host-local replicas: each ready build (a datastore's, its live layer's) as one read-only file on the decoding host,
memory-mapped by every drafting process there, so a lookup costs a few memory reads and the page cache holds one copy.

PostgreSQL stays the system of record. A replica is written from its build's rows by the first client on the host that
wants it (a ``COPY``, which a reader role may do) into :class:`crest_native.ReplicaWriter`: each tree a plain codec v1
blob in a static hash table of the build's keys (``docs/replica-format.md``). It is written under a temporary name and
renamed, under a lock file, so a host writes it once and no reader sees half of one (:func:`host_replica`), by a child
process at the lowest CPU priority (``python -m datastore replica``, :func:`toolkit.children.spawn_idle`); the builds
already mapped serve meanwhile.

The native core probes it (:class:`crest_native.Replica`). Its identity (:func:`identity_of`), CRC-32, slot blocks and
size are checked on open, and every block and record a lookup reads; a replica missing, of another build, truncated or
corrupt is never read (:class:`HostReplicas` serves the previous builds' or the round trip until a good one is written:
output is the same). Settings: ``CREST_REPLICAS`` (the folder, or ``off``).
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import logging
import os
import re
import sys
import tempfile
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import psycopg
import zstandard
from psycopg import sql

from crest_native import Replica, ReplicaError, ReplicaWriter
from toolkit.children import spawn_idle

from .codec import decompress_body
from .connection import APPLICATION_NAME, connect
from .errors import CodecError
from .registry import DatastoreInfo

__all__ = ["HostReplicas", "ReplicaError", "Stores", "WriteCancelled", "WriteReport", "database_key", "host_replica",
           "identity_of", "open_replica", "replica_path", "write_replica"]

log = logging.getLogger(__name__)

SUFFIX = ".crr"
"""A replica file's suffix (``<datastore>.<build id>.crr``)."""
CHECK_S = 1.0
"""Seconds between checks that the mapped files are still the ones on disk (and of the builds served)."""
POLL_S = 0.05
"""Seconds between checks, while waiting for the host's writer (its lock, or a child writing), that the waiter was not
closed."""
REPLICA_APPLICATION = f"{APPLICATION_NAME} replica"
"""The ``application_name`` of the connection that reads a build's rows into a replica."""
_CHUNK_BYTES = 8 << 20  # COPY data handed to the writer at a time


class Stores(NamedTuple):
    """The replicas a drafting step reads: the datastore's, its live layer's and the layer's delta's (``None``: no
    build; in this order: a step names a damaged one by its index)."""

    datastore: Replica
    live: Replica | None
    delta: Replica | None = None


def database_key(conn: psycopg.Connection) -> str:
    """A short name of the database ``conn`` is on (its server's address, port and database name), so that replicas of
    two databases on one host never meet."""
    info = conn.info
    return hashlib.sha256(f"{info.host}:{info.port}/{info.dbname}".encode()).hexdigest()[:16]


def identity_of(info: DatastoreInfo, database: str) -> bytes:
    """What ties a replica to its build: the database, the datastore's name, the build id and table, the tokenizer's
    fingerprint, the key width and the stored n-gram lengths, as canonical JSON (at most 4008 bytes)."""
    return json.dumps({"database": database, "datastore": info.name, "build": info.id, "table": info.table,
                       "tokenizer_fingerprint": info.tokenizer_fingerprint, "key_width": info.key_width,
                       "ns": list(info.ns)}, sort_keys=True, separators=(",", ":")).encode()


def replica_path(root: Path, database: str, info: DatastoreInfo) -> Path:
    """Where the replica of build ``info`` of database ``database`` lives under ``root``: ``<root>/<database>/<name>.<
    build id>.crr`` (characters of the name other than letters, digits, ``.``, ``_`` and ``-`` as ``%XX``)."""
    name = re.sub(r"[^A-Za-z0-9._-]", lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), info.name)
    return root / database / f"{name}.{info.id}{SUFFIX}"


def open_replica(path: Path, identity: bytes) -> Replica:
    """Map the replica at ``path`` when it is of the build ``identity`` names.

    Raises:
        crest_native.ReplicaError: (an ``OSError``) when it is missing, unreadable, truncated or corrupt (its header or
            slot table fails its check), or of another build, naming which.
    """
    replica = Replica(str(path))
    if replica.identity != identity:
        raise ReplicaError(f"{path} is a replica of another build ({replica.identity.decode(errors='replace')})")
    return replica


@dataclass(frozen=True)
class WriteReport:
    """What writing one replica did: ``entries`` (n-grams), ``unreadable`` (trees of the build that did not decode,
    stored as such), ``bytes`` (the file), ``seconds``."""

    entries: int
    unreadable: int
    bytes: int
    seconds: float


def _payload(kind: int, body: bytes, size: int) -> bytes | None:
    """A stored body's payload (:func:`datastore.codec.decompress_body`); ``None`` when it does not decompress."""
    try:
        return decompress_body(kind, body, size)
    except CodecError:
        return None


def _payloads(frames: bytes, segments: bytes, sizes: bytes,
              zstd: zstandard.ZstdDecompressor) -> zstandard.BufferWithSegmentsCollection | list:
    """The payloads of a batch's zstd frames (framed by the native writer, ``ReplicaWriter.add_copy``), decompressed
    in one call; frame by frame (``None`` for a frame that does not decompress) when one of them fails."""
    if not segments:
        return []
    try:
        return zstd.multi_decompress_to_buffer(zstandard.BufferWithSegments(frames, segments),
                                               decompressed_sizes=sizes)
    except zstandard.ZstdError:
        out: list = []
        for k in range(len(sizes) // 8):
            one = zstandard.BufferWithSegments(frames, segments[16 * k:16 * (k + 1)])
            try:
                out.append(zstd.multi_decompress_to_buffer(one, decompressed_sizes=sizes[8 * k:8 * (k + 1)])[0])
            except zstandard.ZstdError:
                out.append(None)
        return out


class WriteCancelled(ReplicaError):
    """A replica's writing was abandoned (its writer was closed); nothing was left behind."""


def write_replica(url: str, info: DatastoreInfo, path: Path, identity: bytes,
                  cancel: threading.Event | None = None) -> WriteReport:
    """Write the replica of build ``info`` to ``path``: its rows streamed from the server (one ``COPY ... TO STDOUT``, a
    ``SELECT``), written under a temporary name, synced and renamed into place.

    Args:
        cancel: when it is set, the writing stops at the next chunk of rows (its temporary file removed).

    Raises:
        psycopg.Error: when the rows cannot be read (the table dropped, the server gone, no grant).
        crest_native.ReplicaError: when the file cannot be written; :class:`WriteCancelled` when ``cancel`` was set.
    """
    start = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    zstd = zstandard.ZstdDecompressor()
    writer = ReplicaWriter(str(tmp), info.key_width, identity.decode())
    try:
        def hand(data: bytes) -> bytes:
            used, frames, segments, sizes, others = writer.add_copy(data)
            writer.complete(_payloads(frames, segments, sizes, zstd),
                            [_payload(kind, body, size) for kind, body, size in others])
            return data[used:]

        query = sql.SQL("COPY (SELECT key, tree FROM {}) TO STDOUT (FORMAT BINARY)").format(sql.Identifier(info.table))
        with connect(url, autocommit=True, application_name=REPLICA_APPLICATION) as conn, conn.cursor() as cur, \
                cur.copy(query) as copy:
            rest = b""
            parts: list = [rest]
            size = 0
            for data in copy:
                if cancel is not None and cancel.is_set():
                    raise WriteCancelled(f"the replica {path} was abandoned (its client was closed)")
                parts.append(data)
                size += len(data)
                if size >= _CHUNK_BYTES:
                    rest = hand(b"".join(parts))
                    parts, size = [rest], 0
            rest = hand(b"".join(parts))
        if rest:
            raise ReplicaError(f"the rows of {info.table} ended inside a row")
        writer.finish()
        os.replace(tmp, path)
        _sync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return WriteReport(int(writer.entries), int(writer.unreadable), path.stat().st_size, time.perf_counter() - start)


def _sync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_unused(folder: Path, keep: set[Path]) -> list[Path]:
    """Remove the replicas in ``folder`` but ``keep`` that no process maps (an exclusive ``flock`` is had at once),
    and temporary files of writers that died; returns what was removed."""
    removed = []
    for path in folder.glob(f"*{SUFFIX}"):
        if path in keep:
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink(missing_ok=True)
            removed.append(path)
        except BlockingIOError:
            pass  # mapped by a process: left for later
        finally:
            os.close(fd)
    for tmp in folder.glob(f".*{SUFFIX}.*.tmp"):
        pid = tmp.name.split(".")[-3]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def host_replica(url: str, info: DatastoreInfo, path: Path, identity: bytes,
                 cancel: threading.Event | None = None) -> tuple[Replica, WriteReport | None]:
    """The replica of build ``info`` at ``path``, mapped; written first (:func:`write_replica`) when it is missing or
    bad, under ``path``'s lock file (``<path>.lock``), so that processes of one host write it once: the others wait for
    the lock, then map the writer's file. Returns the mapping and what writing it did (``None``: it was there).

    Args:
        cancel: when it is set, waiting for the lock or writing stops (:class:`WriteCancelled`; nothing left behind).

    Raises:
        psycopg.Error: when the build's rows cannot be read (the table dropped, the server gone, no grant).
        crest_native.ReplicaError: when the file cannot be written or mapped; :class:`WriteCancelled` when ``cancel``
            was set.
    """
    try:
        return open_replica(path, identity), None
    except ReplicaError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a+b") as lock:
        while True:  # one writer per host: the others wait here (while not cancelled), then map its file
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if cancel is None:
                    time.sleep(POLL_S)
                elif cancel.wait(POLL_S):
                    raise WriteCancelled(f"the replica {path} was abandoned (its client was closed)") from None
        try:
            return open_replica(path, identity), None
        except ReplicaError:
            log.info("writing the host's replica of datastore %r build %d to %s", info.name, info.id, path)
            report = write_replica(url, info, path, identity, cancel)
            log.info("replica of datastore %r build %d: %d n-grams, %d bytes, %.1f s", info.name, info.id,
                     report.entries, report.bytes, report.seconds)
            return open_replica(path, identity), report


def write_in_child(url: str, root: Path, info: DatastoreInfo, path: Path,
                   cancel: threading.Event) -> WriteReport | None:
    """Have a child process at the lowest CPU priority (:func:`toolkit.children.spawn_idle`) ready the replica of build
    ``info`` at ``path`` (``python -m datastore replica --build ...``: :func:`host_replica`, under the host's lock), and
    wait for it; returns what its write did (``None``: the file was there). When ``cancel`` is set the child is killed
    at once and its temporary file removed (:class:`WriteCancelled`).

    Raises:
        crest_native.ReplicaError: when the child failed (its last line of error: the rows unreadable, the file not
            written, the build no longer the datastore's ready one) or could not start.
    """
    argv = [sys.executable, "-m", "datastore", "replica", "--name", info.name, "--build", str(info.id), "--folder",
            str(root), "--json"]
    env = dict(os.environ, DATABASE_URL=url)  # not on the command line, where `ps` would show a password
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            child = spawn_idle(argv, env, out, err)
        except OSError as exc:
            raise ReplicaError(f"cannot start the replica's writer ({exc})") from exc
        try:
            while child.poll() is None:
                if cancel.wait(POLL_S):
                    raise WriteCancelled(f"the replica {path} was abandoned (its client was closed)")
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
                for tmp in path.parent.glob(f".{path.name}.{child.pid}.*.tmp"):  # write_replica's temporary name
                    tmp.unlink(missing_ok=True)
        out.seek(0)
        err.seek(0)
        said = err.read().decode(errors="replace").strip().splitlines()
        if child.returncode != 0:
            raise ReplicaError(f"its writer failed: {said[-1] if said else f'exit {child.returncode}'}")
        printed = out.read()
    try:  # the command's --json line; anything else is the writer's fault, not a reason to end the keeper
        written = json.loads(printed)["written"]
        return WriteReport(**written) if written is not None else None
    except (ValueError, KeyError, TypeError) as exc:
        raise ReplicaError(f"its writer printed no report ({exc}): {printed[-200:]!r}") from exc


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
