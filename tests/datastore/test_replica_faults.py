"""A replica's file changed under a running process never changes a draft and never crashes it (``csrc/replica.cpp``:
every byte a lookup uses is checked, and reads are copied out of the mapping under a SIGBUS guard):

- random bytes written anywhere in a mapped replica (its modification time kept, as a failing disk does): every step
  that drafts from it drafts what the round trip drafts, or reports the file damaged (and is then drafted by the round
  trip);
- the file truncated, replaced or deleted while 256 rows draft trees of 64 nodes from it, in a loop: the process lives,
  and every step drafts what the file drafted before, or reports it damaged.

Real Postgres, a real build, real tokens; the drafting step is the merged drafter's native call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from crest_native import Replica, ReplicaError
from datastore.connection import connect
from datastore.registry import resolve_build
from datastore.replica_file import database_key, identity_of, open_replica, replica_path, write_replica
from drafting import DatastoreSource, DraftingService
from oracle import replica as replica_oracle
from support import native_core, native_step

VOCAB = 49_152
CHAIN, TREE = 8, 32  # budgets: a chain; a tree that backs off (every stored suffix is a candidate)


def _write(url: str, name: str, folder: Path) -> tuple[Path, bytes]:
    with connect(url) as conn:
        info, db = resolve_build(conn, name), database_key(conn)
    path, identity = replica_path(folder, db, info), identity_of(info, db)
    write_replica(url, info, path, identity)
    return path, identity


def _contexts(prompts, rows: int) -> list[np.ndarray]:
    """``rows`` contexts: the prompts cut at every 5th position, in turn."""
    cuts = [np.asarray(p.token_ids[:k], np.uint32) for p in prompts for k in range(6, len(p.token_ids), 5)]
    return [cuts[i % len(cuts)] for i in range(rows)]


def _drafts(made) -> list[tuple[bytes, bytes, bytes]]:
    o = made.offsets.tolist()
    return [(made.tokens[a:b].tobytes(), made.parents[a:b].tobytes(), made.scores[a:b].tobytes())
            for a, b in zip(o, o[1:])]


def _draft_stored(core, handles, budgets, datastore, chain: bool, delta=None):
    """(the step, the damaged store: -1 none) of a step drafted from the replicas."""
    made = native_step(core, handles, budgets, (datastore, None, delta), chain=chain)
    return made, made.damaged


@pytest.mark.slow  # hundreds of damaged files, each drafted through: over 30 s
def test_random_bytes_anywhere_never_change_a_draft(database_url, chat_datastore, tokenizer, eval_prompts, tmp_path):
    """200 trials: random bytes written into the mapped file (anywhere; in the slot table; in the records the rows
    read), its mtime kept. Each step, chain and tree, drafts what the round trip drafts or reports the file damaged."""
    path, identity = _write(database_url, chat_datastore, tmp_path)
    pristine = path.read_bytes()
    where = replica_oracle.layout(pristine)
    replica = open_replica(path, identity)
    contexts = _contexts(eval_prompts, 48)
    core = native_core()
    handles = np.array([core.start(c) for c in contexts], np.int64)
    read = sorted({rec.at for rec in replica_oracle.read(pristine).values()
                   if any(c[-len(rec.key) // 2:].astype(">u2").tobytes() == rec.key for c in contexts)})
    assert len(read) > 20
    trip = DraftingService(DatastoreSource(lambda: _trip_client(database_url, chat_datastore, tokenizer)),
                           vocab_size=VOCAB)
    try:
        for i, c in enumerate(contexts):
            trip.start_request(i, c)
        want = {chain: [(d.token_ids.tobytes(), d.parents.tobytes(), d.scores.tobytes())
                        for d in trip.step(list(range(len(contexts))), [CHAIN if chain else TREE] * len(contexts),
                                           chain=chain).drafts]
                for chain in (True, False)}
    finally:
        trip.close()
    for chain in (True, False):  # the intact file drafts what the round trip drafts (token ids as uint32 there)
        made, damaged = _draft_stored(core, handles, np.full(len(handles), CHAIN if chain else TREE), replica, chain)
        assert damaged == -1 and [d[1:] for d in _drafts(made)] == [w[1:] for w in want[chain]]
        want[chain] = _drafts(made)
    rng = np.random.default_rng(42)
    stat = path.stat()
    fd = os.open(path, os.O_RDWR)
    detected = 0
    try:
        for trial in range(200):
            region = trial % 4
            if region == 0:  # anywhere, a whole 4 KiB (a failing sector)
                at, size = int(rng.integers(0, len(pristine) - 4096)), 4096
            else:
                lo, hi = {1: (0, len(pristine)), 2: where.slots}.get(region, (0, 0))
                if region == 3:  # inside a record the rows read: its key, length, tree or check
                    lo = int(read[int(rng.integers(len(read)))])
                    hi = lo + 40
                at, size = int(rng.integers(lo, hi - 8)), int(rng.integers(1, 9))
            os.pwrite(fd, rng.integers(0, 256, size).astype(np.uint8).tobytes(), at)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            assert replica.unchanged()  # the damage is not seen by the file's size or time
            for chain in (True, False):
                made, damaged = _draft_stored(core, handles, np.full(len(handles), CHAIN if chain else TREE), replica,
                                              chain)
                if damaged == -1:
                    assert _drafts(made) == want[chain], (trial, at, size)
                else:
                    detected += 1
            os.pwrite(fd, pristine[at:at + size], at)
            os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    finally:
        os.close(fd)
    assert detected >= 50, detected  # the slot table's and the records' trials are found


def _trip_client(url: str, name: str, tokenizer):
    from datastore.shared import SharedDatastore

    return SharedDatastore.open(name, tokenizer=tokenizer, database_url=url, replicas=False, listen=False)


def test_truncating_replacing_or_deleting_the_file_while_drafting_never_crashes(database_url, chat_datastore,
                                                                              eval_prompts, tmp_path):
    """50 trials of each fault, in a child process (a SIGBUS would end it) while 256 rows draft trees of 64 nodes in a
    loop: it exits cleanly, every step drafts what the intact file drafted or reports it damaged, and truncated files
    (cut short under their mapping, the trial that used to end the process) are reported."""
    path, identity = _write(database_url, chat_datastore, tmp_path)
    pristine = tmp_path / "pristine.crr"
    pristine.write_bytes(path.read_bytes())
    contexts = tmp_path / "contexts.npz"
    np.savez(contexts, *_contexts(eval_prompts, 256))
    for fault in ("truncate", "replace", "delete"):
        run = subprocess.run([sys.executable, __file__, str(path), str(pristine), str(contexts), fault, "50"],
                             capture_output=True, text=True, timeout=240,
                             env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)})
        assert run.returncode == 0, (fault, run.returncode, run.stderr[-2000:])
        report = json.loads(run.stdout.splitlines()[-1])
        assert report["trials"] == 50 and report["differed"] == 0 and report["steps"] >= 10, (fault, report)
        if fault == "truncate":
            assert report["damaged"] >= 1, report
        else:  # a removed or replaced file still maps its build intact
            assert report["damaged"] == 0, report


def _stress(path: Path, pristine: Path, contexts_file: Path, fault: str, trials: int) -> dict:
    """The child of the test above: drafts in a loop while another thread changes the file ``trials`` times."""
    with np.load(contexts_file) as z:
        contexts = [z[k] for k in sorted(z.files, key=lambda k: int(k.split("_")[1]))]
    core = native_core()
    handles = np.array([core.start(c) for c in contexts], np.int64)
    budgets = np.full(len(handles), 64, np.int64)
    replica = Replica(str(path))
    made, damaged = _draft_stored(core, handles, budgets, replica, False)
    assert damaged == -1
    want = _drafts(made)
    rng = np.random.default_rng(7)
    size = path.stat().st_size
    done = threading.Event()

    def change() -> None:
        for trial in range(trials):
            time.sleep(float(rng.uniform(0.0, 0.01)))
            if fault == "truncate":
                os.truncate(path, int(rng.integers(0, size)))
            elif fault == "replace":
                garbage = path.with_name(f"garbage.{trial}")
                garbage.write_bytes(b"not a replica" * 1000)
                os.replace(garbage, path)
            else:
                path.unlink()
            time.sleep(0.02)
            fresh = path.with_name(f"fresh.{trial}")
            fresh.write_bytes(pristine.read_bytes())
            os.replace(fresh, path)  # as the client writes a replica again: a new file renamed into place
        done.set()

    changer = threading.Thread(target=change)
    changer.start()
    steps = damaged_steps = differed = 0
    while not done.is_set():
        made, damaged = _draft_stored(core, handles, budgets, replica, False)
        steps += 1
        if damaged != -1:
            damaged_steps += 1
            while not done.is_set():  # the damaged file is dropped: map the one at the path once it is good again
                try:
                    replica = Replica(str(path))
                    break
                except ReplicaError:
                    time.sleep(0.001)
        elif _drafts(made) != want:
            differed += 1
    changer.join()
    return {"trials": trials, "steps": steps, "damaged": damaged_steps, "differed": differed}


if __name__ == "__main__":
    a = sys.argv[1:]
    print(json.dumps(_stress(Path(a[0]), Path(a[1]), Path(a[2]), a[3], int(a[4]))))


def test_a_delta_replica_cut_short_is_named_damaged_and_drafts_nothing(database_url, chat_datastore, eval_prompts,
                                                                       tmp_path):
    """The live layer's delta is read from its own replica (``Stores.delta``): cut short under the running process, the
    step reports it (index 3: its set's delta, so the caller drops that replica and drafts by the round trip) and
    drafts nothing from it; the datastore's replica beside it is untouched."""
    path, identity = _write(database_url, chat_datastore, tmp_path)
    delta_path = tmp_path / "delta.crr"
    delta_path.write_bytes(path.read_bytes())
    replica, delta = open_replica(path, identity), open_replica(delta_path, identity)
    core = native_core()
    handles = np.array([core.start(c) for c in _contexts(eval_prompts, 16)], np.int64)
    budgets = np.full(len(handles), CHAIN, np.int64)
    made, damaged = _draft_stored(core, handles, budgets, replica, True, delta)
    assert damaged == -1 and len(made.tokens) > 0
    os.truncate(delta_path, delta_path.stat().st_size // 2)
    made, damaged = _draft_stored(core, handles, budgets, replica, True, delta)
    assert damaged == 3 and not made.drafted
    made, damaged = _draft_stored(core, handles, budgets, replica, True)  # without it: drafts again
    assert damaged == -1 and len(made.tokens) > 0
