"""A host-local replica file (:mod:`datastore.replica`): where a build's replica lives and what ties it to its
build (:func:`replica_path`, :func:`identity_of`), how it is opened (:func:`open_replica`) and how it is written: from
the build's rows by a ``COPY`` into :class:`crest_native.ReplicaWriter` (:func:`write_replica`), under a temporary name
and renamed under the host's lock file (:func:`host_replica`), by a child process at the lowest CPU priority
(:func:`write_in_child`, ``python -m datastore replica``). The format: ``docs/replica-format.md``."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
import zstandard
from psycopg import sql

from crest_native import Replica, ReplicaError, ReplicaWriter
from toolkit.children import spawn_idle

from .codec import decompress_body
from .connection import APPLICATION_NAME, connect
from .errors import CodecError
from .registry import DatastoreInfo

__all__ = ["WriteCancelled", "WriteReport", "database_key", "host_replica", "identity_of", "open_replica",
           "remove_unused", "replica_path", "write_in_child", "write_replica"]

log = logging.getLogger(__name__)

SUFFIX = ".crr"
"""A replica file's suffix (``<datastore>.<build id>.crr``)."""
POLL_S = 0.05
"""Seconds between checks, while waiting for the host's writer (its lock, or a child writing), that the waiter was not
closed."""
REPLICA_APPLICATION = f"{APPLICATION_NAME} replica"
"""The ``application_name`` of the connection that reads a build's rows into a replica."""
_CHUNK_BYTES = 8 << 20  # COPY data handed to the writer at a time


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
    at once and its temporary file removed (:class:`WriteCancelled`); when this process ends, however it ends, the
    child ends within a second (a temporary file it leaves is removed by the next keeper, :func:`remove_unused`).

    Raises:
        crest_native.ReplicaError: when the child failed (its last line of error: the rows unreadable, the file not
            written, the build no longer the datastore's ready one) or could not start.
    """
    args = ["replica", "--name", info.name, "--build", str(info.id), "--folder", str(root), "--json"]
    env = dict(os.environ, DATABASE_URL=url)  # not on the command line, where `ps` would show a password
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            child = spawn_idle("datastore", args, env, out, err)
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
