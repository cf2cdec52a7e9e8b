"""Host-local replicas (:mod:`datastore.replica`, ``csrc/replica.cpp``): a replica holds every tree of its build, bit
for bit what the round trip decodes (its oracle: :func:`datastore.codec.decode_tree` of the build's rows); a file
that is missing, of another build, truncated or corrupt is refused when opened, naming what is wrong; a file damaged,
deleted or replaced mid-run never changes a draft (the step drafts from the round trip, one warning) and is written
again in the background; a rebuild reaches the host's replica within seconds; a reader role writes it; unused
replicas are removed. Real Postgres, real builds, real tokens."""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import cast

import numpy as np
import psutil
import psycopg
import pytest
from psycopg import sql

from crest_native import COMPRESSION_IDS, Replica, ReplicaError, key_hash
from datastore.admin.catalog import datastore_stats
from datastore.admin.grants import grant_reader
from datastore.codec import decode_tree, encode_tree
from datastore.connection import connect
from datastore.errors import ClosedError, CodecError
from datastore.keys import decode_key
from datastore.registry import resolve_build
from datastore.replica import Stores
from datastore.replica_file import database_key, identity_of, open_replica, remove_unused, replica_path, write_replica
from datastore.shared import SharedDatastore
from drafting import DatastoreSource, DraftingService
from oracle import codec as codec_oracle
from oracle import replica as replica_oracle
from support import REPO, alive_after, build_small

VOCAB = 49_152


def _build(url: str, name: str):
    with connect(url) as conn:
        return resolve_build(conn, name), database_key(conn)


def _rows(url: str, table: str) -> list[tuple[bytes, bytes]]:
    with psycopg.connect(url) as conn:
        return [(bytes(k), bytes(t)) for k, t in
                conn.execute(sql.SQL("SELECT key, tree FROM {}").format(sql.Identifier(table))).fetchall()]


def _write(url: str, name: str, folder: Path) -> tuple[Path, bytes]:
    info, db = _build(url, name)
    path, identity = replica_path(folder, db, info), identity_of(info, db)
    write_replica(url, info, path, identity)
    return path, identity


@pytest.mark.slow  # every key of a build read back: over 30 s
def test_a_replica_holds_every_tree_of_its_build(database_url, chat_datastore, tmp_path):
    """Every stored key gives the tree the round trip decodes from the same row (zstd-compressed or plain), and keys of
    every length the build does not hold give nothing."""
    info, db = _build(database_url, chat_datastore)
    path, identity = _write(database_url, chat_datastore, tmp_path)
    replica = open_replica(path, identity)
    rows = _rows(database_url, info.table)
    assert replica.entries == len(rows) and replica.unreadable == 0 and replica.lengths == sorted(info.ns)[::-1]
    assert replica.key_width == info.key_width and replica.file_size == path.stat().st_size
    compressed = 0
    for key, blob in rows:
        want = decode_tree(blob)
        got = replica.find(np.asarray(decode_key(key, info.key_width), np.uint32))
        assert got is not None and not isinstance(got, str)
        tokens, parents, counts, root = got
        assert (tokens.tolist(), parents.tolist(), counts.tolist(), root) == \
            (want.token_ids.tolist(), want.parents.tolist(), want.counts.tolist(), want.root_count)
        compressed += blob[2] >> 4 != 0
    assert compressed > len(rows) // 2  # most stored trees are compressed: the writer decompressed them
    stored = {k for k, _ in rows}
    rng = np.random.default_rng(0)
    for _ in range(2000):
        ids = rng.integers(0, VOCAB, int(rng.integers(1, 6))).astype(np.uint32)
        key = ids.astype(">u2").tobytes()
        assert (replica.find(ids) is None) == (key not in stored)
    oracle = replica_oracle.read(path.read_bytes())  # every block and record checks as the format says
    assert sorted(oracle) == sorted(stored)
    for key, blob in rows:
        rec, want = oracle[key], decode_tree(blob)
        assert rec.payload is not None
        got = codec_oracle.parse_payload(rec.payload, rec.width)
        assert (got.token_ids.tolist(), got.parents.tolist(), got.counts.tolist(), got.root_count) == \
            (want.token_ids.tolist(), want.parents.tolist(), want.counts.tolist(), want.root_count)
    for length in range(0, 40):  # the format's hash: the oracle's, partial chunks included
        key = rng.integers(0, 256, length).astype(np.uint8).tobytes()
        assert key_hash(key) == replica_oracle.hash_bytes(key)
    bytes_per_ngram = path.stat().st_size / len(rows)
    assert bytes_per_ngram < 1.1 * datastore_stats(database_url, chat_datastore)["bytes_total"] / len(rows)


def test_a_replica_of_an_lz4_build_holds_its_trees(database_url, ds_name, sharegpt_sample, tmp_path):
    """A build compressed with lz4 (no zstd body at all): the writer decompresses every body with the codec's own
    decompressor, and every key gives the tree the round trip decodes."""
    from ingest import BuildConfig, build_datastore

    build_datastore(BuildConfig(name=ds_name, path=sharegpt_sample, limit=10, top_t=50, max_n=2, compression="lz4",
                                database_url=database_url), progress=False)
    info, _ = _build(database_url, ds_name)
    rows = _rows(database_url, info.table)
    lz4_id = COMPRESSION_IDS["lz4"]
    assert any(blob[2] >> 4 == lz4_id for _, blob in rows)
    path, identity = _write(database_url, ds_name, tmp_path)
    replica = open_replica(path, identity)
    assert replica.entries == len(rows) and replica.unreadable == 0
    for key, blob in rows:
        want = decode_tree(blob)
        got = replica.find(np.asarray(decode_key(key, info.key_width), np.uint32))
        assert got is not None and not isinstance(got, str)
        assert [a.tolist() for a in got[:3]] + [got[3]] == \
            [want.token_ids.tolist(), want.parents.tolist(), want.counts.tolist(), want.root_count]


def test_a_tree_the_build_cannot_decode_is_stored_as_unreadable(database_url, ds_name, sharegpt_sample, tmp_path):
    """A row whose blob is corrupt (a plain one failing its CRC, a zstd body cut short) is answered ``unreadable``,
    exactly where the round trip's decode fails, so both paths serve it as absent."""
    build_small(database_url, ds_name, sharegpt_sample)
    info, _ = _build(database_url, ds_name)
    rows = _rows(database_url, info.table)
    plain, blob = rows[0]
    packed = next(k for k, b in rows if b[2] >> 4 == 1 and k != plain)
    bad = bytearray(encode_tree(decode_tree(blob), compression="none"))  # stored plain, its last byte changed
    bad[-1] ^= 0xFF
    with psycopg.connect(database_url, autocommit=True) as conn:
        table = sql.Identifier(info.table)
        conn.execute(sql.SQL("UPDATE {} SET tree = %s WHERE key = %s").format(table), [bytes(bad), plain])
        conn.execute(sql.SQL("UPDATE {} SET tree = substring(tree from 1 for length(tree) - 2) WHERE key = %s")
                     .format(table), [packed])
    path, identity = _write(database_url, ds_name, tmp_path)
    replica = open_replica(path, identity)
    assert replica.unreadable == 2 and replica.entries == len(rows)
    for key, blob in _rows(database_url, info.table):
        ids = np.asarray(decode_key(key, info.key_width), np.uint32)
        try:
            decode_tree(blob)
        except CodecError:
            assert key in (plain, packed) and replica.find(ids) == "unreadable"
        else:
            assert not isinstance(replica.find(ids), str)


def test_a_bad_file_is_refused_when_opened_naming_what_is_wrong(database_url, chat_datastore, ds_name,
                                                                sharegpt_sample, tmp_path):
    path, identity = _write(database_url, chat_datastore, tmp_path / "a")
    size = path.stat().st_size
    data = path.read_bytes()
    header_at, slots_at = 100, size - 64  # inside the header's identity; inside the slot table (at the end)

    def damaged(name: str, content: bytes) -> Path:
        p = tmp_path / name
        p.write_bytes(content)
        return p

    cases = [
        (tmp_path / "missing.crr", "cannot open"),
        (damaged("short.crr", data[:1000]), "shorter than a replica's header"),
        (damaged("cut.crr", data[:-8]), "truncated or extended"),
        (damaged("long.crr", data + b"\0"), "truncated or extended"),
        (damaged("magic.crr", b"X" + data[1:]), "not a crest-spec replica"),
        (damaged("header.crr", data[:header_at] + bytes([data[header_at] ^ 1]) + data[header_at + 1:]),
         "the header fails its CRC"),
        (damaged("slots.crr", data[:slots_at] + bytes([data[slots_at] ^ 0x10]) + data[slots_at + 1:]),
         "the slot table fails its check"),
    ]
    for bad, named in cases:
        with pytest.raises(ReplicaError, match=named):
            open_replica(bad, identity)
    build_small(database_url, ds_name, sharegpt_sample)
    other, db = _build(database_url, ds_name)
    with pytest.raises(ReplicaError, match="a replica of another build"):
        open_replica(path, identity_of(other, db))
    assert isinstance(ReplicaError("x"), OSError)


@pytest.mark.parametrize("part", ["key", "length", "payload", "check"])
def test_a_record_that_fails_its_check_is_reported_damaged(part, database_url, chat_datastore, tmp_path):
    """A replica whose record bytes changed (after it was opened, or unnoticed at open: records are checked when
    read), in its key, its length, its tree or its check, answers ``damaged`` for that key, never another tree nor
    nothing."""
    info, _ = _build(database_url, chat_datastore)
    path, identity = _write(database_url, chat_datastore, tmp_path)
    key, blob = next((k, b) for k, b in _rows(database_url, info.table) if len(decode_tree(b)) > 8)
    ids = np.asarray(decode_key(key, info.key_width), np.uint32)
    data = bytearray(path.read_bytes())
    rec = replica_oracle.read(bytes(data))[key]
    assert rec.payload is not None
    end = rec.at + 1 + len(key) + 1 + 1 + len(rec.payload) + (len(rec.payload) + 1 >= 128)
    at = {"key": rec.at + 1 + len(key) - 1, "length": rec.at + 1 + len(key), "payload": rec.at + len(key) + 8,
          "check": end + 3}[part]
    data[at] ^= 0x04
    flipped = tmp_path / "flipped.crr"
    flipped.write_bytes(bytes(data))
    replica = open_replica(flipped, identity)  # the header and the slot table are intact
    assert replica.find(ids) == "damaged"


def _stores(client: SharedDatastore) -> Stores:
    stores = client.stores()
    assert stores is not None
    return stores


def _service(url: str, name: str, tokenizer, replicas: Path | bool):
    source = DatastoreSource(lambda: SharedDatastore.open(name, tokenizer=tokenizer, database_url=url,
                                                          replicas=replicas))
    service = DraftingService(source, vocab_size=VOCAB)
    return service, service.retrieval, source


FAULTS = {
    "rotted": lambda p: _rot(p),
    "deleted": lambda p: p.unlink(),
    "truncated": lambda p: os.truncate(p, p.stat().st_size // 2),
    "bit-flipped": lambda p: _flip(p, p.stat().st_size // 3),
    "replaced": lambda p: os.replace(_garbage(p), p),
}


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x20]))


def _rot(path: Path) -> None:
    """Random bytes over the slot table, the file's size and modification time kept (a failing disk)."""
    stat = path.stat()
    start, end = replica_oracle.layout(path.read_bytes()).slots
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(np.random.default_rng(3).integers(0, 256, end - start).astype(np.uint8).tobytes())
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _garbage(path: Path) -> Path:
    other = path.with_name("garbage.tmp")
    other.write_bytes(b"not a replica" * 1000)
    return other


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_mid_run_never_changes_a_draft_and_the_replica_is_written_again(
        fault, database_url, chat_datastore, tokenizer, eval_prompts, tmp_path, caplog):
    """Requests draft through the replica and through the round trip side by side; mid-run the replica file is
    deleted, truncated, bit-flipped or replaced. Every draft stays what the round trip drafts; a damaged file gives
    one warning and is never read again; the file is written again in the background, and drafting returns to it."""
    folder = tmp_path / "replicas"
    local, method, source = _service(database_url, chat_datastore, tokenizer, folder)
    trip, _, trip_source = _service(database_url, chat_datastore, tokenizer, False)
    client = cast(SharedDatastore, source.client)
    assert client.replicas is not None and client.replicas.wait_ready(60)
    path = Path(_stores(client).datastore.path)
    written = len(client.replicas.written)  # not the inode: ext4 hands a freed inode number to the next new file
    ids = [list(map(int, p.token_ids)) for p in eval_prompts]
    for svc in (local, trip):
        for i, seq in enumerate(ids):
            svc.start_request(i, seq[:12])
    compared = 0
    with caplog.at_level(logging.WARNING):
        for pos in range(12, 80):
            if pos == 30:
                FAULTS[fault](path)
            live = [i for i, seq in enumerate(ids) if pos < len(seq)]
            for chain in (True, False):  # the chain's step follows each request's new token: the tree's, none
                new = [ids[i][pos - 1:pos] if chain and pos > 12 else [] for i in live]
                got = local.step(live, [8] * len(live), tokens=new, chain=chain).drafts
                want = trip.step(live, [8] * len(live), tokens=new, chain=chain).drafts
                assert [d.token_ids.tolist() for d in got] == [d.token_ids.tolist() for d in want], (fault, pos)
                assert all(a.scores.tobytes() == b.scores.tobytes() for a, b in zip(got, want))
                compared += len(live)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # written again, and mapped: drafting is back on the replica
            stores = client.replicas.stores()
            if stores is not None and len(client.replicas.written) > written and path.exists() \
                    and stores.datastore.inode == path.stat().st_ino:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the replica was not written again after it was {fault}")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    damaged = fault in ("truncated", "bit-flipped", "rotted")
    assert len(warned) == (1 if damaged or fault == "replaced" else 0), warned
    # a damaged file is read by at most one step (the background check may find it first)
    assert method.stats.damaged <= (1 if damaged else 0) and compared > 300
    steps = method.stats.replica_steps
    local.step([0], [8])
    assert method.stats.replica_steps == steps + 1
    source.close()
    trip_source.close()


def test_a_rebuild_reaches_the_replica_within_seconds_and_the_old_one_goes(database_url, ds_name, sharegpt_sample,
                                                                          tokenizer, tmp_path):
    """A rebuild swapped in: the client follows it at once, the old build's replica serving until the new one is
    mapped (never the round trip), which is within 5 s; the old build's file is removed once no process maps it."""
    build_small(database_url, ds_name, sharegpt_sample)
    client = SharedDatastore.open(ds_name, tokenizer=tokenizer, database_url=database_url, replicas=tmp_path)
    try:
        assert client.replicas is not None and client.replicas.wait_ready(30) and client.wait_listening()
        old = Path(_stores(client).datastore.path)
        held = Replica(str(old))  # another process still maps the old build
        start = time.monotonic()
        new_build = build_small(database_url, ds_name, sharegpt_sample)
        swapped = time.monotonic()
        unserved = 0
        while time.monotonic() - swapped < 10:
            stores = client.stores()
            unserved += stores is None
            if stores is not None and f'"build":{new_build},'.encode() in stores.datastore.identity:
                break
            time.sleep(0.02)
        reached = time.monotonic() - swapped
        assert reached < 5.0, f"the rebuild reached the replica {reached:.1f} s after its swap"
        assert unserved == 0, "the step was sent to the round trip while the new build's replica was written"
        assert old.exists()  # still mapped elsewhere: kept
        del held
        assert old in remove_unused(old.parent, {Path(_stores(client).datastore.path)}) and not old.exists()
        assert time.monotonic() - start < 60
    finally:
        client.close()


def test_a_reader_role_writes_the_replica(database_url, ds_name, sharegpt_sample, reader, tokenizer, tmp_path):
    """The role that may SELECT a datastore may write its host replica: the replica's rows are one SELECT."""
    role, reader_url = reader
    build_small(database_url, ds_name, sharegpt_sample)
    grant_reader(database_url, role, ds_name, create=True)
    client = SharedDatastore.open(ds_name, tokenizer=tokenizer, database_url=reader_url, replicas=tmp_path)
    try:
        assert client.replicas is not None and client.replicas.wait_ready(30)
        assert len(client.replicas.written) == 1 and client.replicas.written[0].entries > 0
    finally:
        client.close()


def test_processes_of_one_host_write_a_replica_once(database_url, chat_datastore, tokenizer, tmp_path):
    """Two clients of one build on one host: one writes the file, under the lock; the other maps it."""
    clients = [SharedDatastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url, replicas=tmp_path)
               for _ in range(2)]
    try:
        for c in clients:
            assert c.replicas is not None and c.replicas.wait_ready(60)
        assert sum(len(c.replicas.written) for c in clients if c.replicas is not None) == 1
        paths = {c.stores().datastore.path for c in clients}  # type: ignore[union-attr]
        assert len(paths) == 1 and len(list(tmp_path.rglob("*.crr"))) == 1
    finally:
        for c in clients:
            c.close()


def test_close_during_a_replica_write_returns_within_a_second_and_leaves_nothing(database_url, chat_datastore,
                                                                              tokenizer, tmp_path):
    """A client closed while its replica is being written (by a child process at idle priority): ``close()`` returns
    within 1 s, the write is abandoned (no temporary file, no replica, no child), no thread of the client is left, and
    a later lookup raises ClosedError."""
    before = set(threading.enumerate())
    client = SharedDatastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url, replicas=tmp_path)
    deadline = time.monotonic() + 30
    while not list(tmp_path.rglob("*.tmp")) and time.monotonic() < deadline:
        time.sleep(0.001)
    tmp = list(tmp_path.rglob("*.tmp"))
    assert tmp, "the replica's write was not seen"
    writer = int(tmp[0].name.split(".")[-3])  # written by a child process at idle priority, not by this one
    assert writer != os.getpid() and os.sched_getscheduler(writer) == os.SCHED_IDLE
    start = time.monotonic()
    client.close()
    took = time.monotonic() - start
    assert took < 1.0, f"close() took {took:.2f} s during a replica write"
    with pytest.raises(ProcessLookupError):
        os.kill(writer, 0)
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob("*.crr"))
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]
    with pytest.raises(ClosedError, match="was closed"):
        client.lookup([1, 2, 3])


def test_close_while_another_process_writes_the_replica_returns_within_a_second(database_url, chat_datastore,
                                                                               tokenizer, tmp_path):
    """The host's writer lock held elsewhere (another process writing the replica): the client waits for it, and
    ``close()`` still returns within 1 s with no thread left."""
    info, db = _build(database_url, chat_datastore)
    path = replica_path(tmp_path, db, info)
    path.parent.mkdir(parents=True)
    before = set(threading.enumerate())
    with open(path.with_name(path.name + ".lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        client = SharedDatastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url,
                                      replicas=tmp_path)
        time.sleep(0.3)
        start = time.monotonic()
        client.close()
        assert time.monotonic() - start < 1.0
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]


def test_the_replica_writer_ends_within_seconds_of_a_parent_killed_with_sigkill(database_url, chat_datastore,
                                                                                tmp_path):
    """A drafting process's replica writer (``python -m datastore replica``, a child at idle priority) waiting for the
    host's writer lock, its parent killed with SIGKILL (no cleanup): the writer is gone within 5 s, and writes
    nothing."""
    info, db = _build(database_url, chat_datastore)
    path = replica_path(tmp_path, db, info)
    path.parent.mkdir(parents=True)
    parent_script = f"""
import threading
from datastore.registry import resolve_build
from datastore.replica_file import write_in_child
from datastore.connection import connect
from pathlib import Path
with connect({database_url!r}) as conn:
    info = resolve_build(conn, {chat_datastore!r})
print("writing", flush=True)
write_in_child({database_url!r}, Path({str(tmp_path)!r}), info, Path({str(path)!r}), threading.Event())
"""
    with open(path.with_name(path.name + ".lock"), "a+b") as lock:  # another process writes it: the child waits
        fcntl.flock(lock, fcntl.LOCK_EX)
        parent = subprocess.Popen([sys.executable, "-c", parent_script], cwd=REPO, stdout=subprocess.PIPE, text=True)
        try:
            assert parent.stdout is not None and parent.stdout.readline().strip() == "writing"
            deadline = time.monotonic() + 30
            while not (children := psutil.Process(parent.pid).children(recursive=True)):
                assert time.monotonic() < deadline, "no writer started"
                time.sleep(0.02)
            writers = [c.pid for c in children]
            time.sleep(1.0)  # the writer's interpreter is up, waiting for the lock
            assert alive_after(writers, 0) == writers
            os.kill(parent.pid, signal.SIGKILL)
            parent.wait()
            assert not alive_after(writers, 5), "the replica writer outlived its parent by 5 s"
        finally:
            parent.kill()
            parent.wait()
    assert not path.exists()
