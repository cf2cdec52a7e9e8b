"""One build per name, always: the name is locked before the corpus is read and held to the swap, so a second
build of the same name started 0, 5 or 20 s after the first (in either order of two different corpora) fails
at once, exit 2, naming the running build, and never replaces it. Each corpus is a named pipe that the test
feeds only after the second build has been refused, so the first build is as slow as the test needs."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from datastore.admin.catalog import datastore_stats
from datastore.connection import connect
from support import REPO

pytestmark = pytest.mark.slow

DOCS = {"a": [f"Alpha document {i}: the quick brown fox jumps over the lazy dog." for i in range(30)],
        "b": [f"Beta document {i}: pack my box with five dozen liquor jugs." for i in range(30)]}


def _start(corpus: Path, name: str, url: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ingest", "build", "--source", "jsonl", "--path", str(corpus),
                             "--name", name, "--top-t", "50", "--max-n", "2", "--quiet", "--json",
                             "--database-url", url], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _feed(fifo: Path, lines: list[str]) -> bool:
    """Write the corpus into the pipe if a build reads it (a refused build never opened it); returns whether."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # no reader
            return False
        raise
    os.set_blocking(fd, True)
    with os.fdopen(fd, "w") as fh:
        fh.write("".join(json.dumps({"content": line}) + "\n" for line in lines))
    return True


def _registered(url: str, name: str) -> bool:
    with connect(url) as conn:
        return conn.execute("SELECT 1 FROM datastores WHERE name = %s AND state = 'building'", [name]).fetchone() \
            is not None


@pytest.mark.parametrize("gap", [0, 5, 20])
@pytest.mark.parametrize("order", ["ab", "ba"])
def test_a_second_build_of_a_name_fails_at_once_naming_the_first(tmp_path, database_url, ds_name, gap, order):
    fifos = {k: tmp_path / f"{k}.jsonl" for k in "ab"}
    for f in fifos.values():
        os.mkfifo(f)
    first, second = order[0], order[1]
    procs = {first: _start(fifos[first], ds_name, database_url)}
    started = {first: time.monotonic()}
    time.sleep(gap)
    first_registered = gap > 0 and _registered(database_url, ds_name)
    procs[second] = _start(fifos[second], ds_name, database_url)
    started[second] = time.monotonic()
    # exactly one is refused, at once: it never reads its corpus
    deadline = time.monotonic() + 60
    while all(p.poll() is None for p in procs.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    refused = next((k for k, p in procs.items() if p.poll() is not None), None)
    assert refused is not None, "neither build was refused"
    winner = second if refused == first else first
    if first_registered:
        assert refused == second  # the first had taken the name: the later one is refused
    _, refusal = procs[refused].communicate(timeout=60)
    assert procs[refused].returncode == 2, refusal
    assert time.monotonic() - started[refused] < 30  # at once: start-up, the tokenizer, one query
    assert "Traceback" not in refusal and "one build per name" in refusal and ds_name in refusal
    assert procs[winner].poll() is None  # still waiting on its corpus
    assert _feed(fifos[winner], DOCS[winner]) and not _feed(fifos[refused], DOCS[refused])
    out, err = procs[winner].communicate(timeout=300)
    assert procs[winner].returncode == 0 and "Traceback" not in err, err
    build = json.loads(out)["build_id"]
    assert f"build {build} (started " in refusal  # the refusal named the running build and when it started
    stats = datastore_stats(database_url, ds_name)
    assert stats["id"] == build  # the winner serves; the refused build replaced nothing
    with connect(database_url) as conn:
        states = conn.execute("SELECT state FROM datastores WHERE name = %s", [ds_name]).fetchall()
    assert [s for (s,) in states] == ["ready"]  # the refused build left no row behind
