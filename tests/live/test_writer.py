"""The live layer's writer (:mod:`live.writer`): an appender role may only ``INSERT`` outputs; the
queue is bounded in bytes, and a server that is down loses the outputs, nothing else."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Sequence
from typing import cast

import numpy as np
import psycopg
import pytest
from psycopg import sql

from datastore.admin.grants import grant_appender
from datastore.connection import connect
from live.store import decode_output
from live.writer import LiveWriter
from support import UNREACHABLE, with_params


def test_appender_role_may_only_insert(database_url, live_ds):
    role = f"crest_appender_{uuid.uuid4().hex[:8]}"
    grant_appender(database_url, role, create=True)
    try:
        url = with_params(database_url, user=role)
        writer = LiveWriter(live_ds, url, origin="pytest")
        # an int array is a token sequence to append (encode_output takes any 1-D array of ids)
        assert writer.append([5, 6, 7, 8]) and writer.append(cast(Sequence[int], np.arange(100, 164)))
        assert not writer.append([1])  # too short to learn from
        assert writer.flush(30)
        writer.close()
        assert (writer.appended, writer.written, writer.failed, writer.dropped) == (2, 2, 0, 1)
        with connect(database_url) as conn:
            got = conn.execute("SELECT tokens, origin FROM live_outputs WHERE name = %s ORDER BY id",
                               [live_ds]).fetchall()
        assert [decode_output(bytes(t)).tolist() for t, _ in got] == [[5, 6, 7, 8], list(range(100, 164))]
        assert {o for _, o in got} == {"pytest"}
        with psycopg.connect(url, autocommit=True) as conn:
            for stmt in ("SELECT * FROM live_outputs", "DELETE FROM live_outputs",
                         "UPDATE live_outputs SET origin = ''", "SELECT * FROM datastores"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(stmt)
    finally:
        with connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_writer_is_bounded_and_a_down_server_loses_nothing_but_the_outputs():
    writer = LiveWriter("nowhere", UNREACHABLE, max_pending_bytes=64)
    kept = [writer.append(list(range(10))) for _ in range(50)]  # 40 bytes each: the queue holds one at a time
    assert writer.flush(30)
    writer.close()
    assert writer.appended == sum(kept) and writer.dropped == 50 - sum(kept) and writer.dropped > 0
    assert writer.written == 0 and writer.failed == writer.appended
    with pytest.raises(ValueError):
        LiveWriter("x", UNREACHABLE, max_pending_bytes=1)


def test_writer_batches_outputs_into_one_copy_until_flushed(database_url, live_ds):
    writer = LiveWriter(live_ds, database_url, origin="pytest-batch", batch_s=60.0)
    try:
        for i in range(5):
            assert writer.append([10 + i, 11, 12])
        time.sleep(0.3)  # nothing written before the batch's time is up (or a flush)
        assert writer.written == 0 and writer.batches == 0
        assert writer.flush(30)  # a flush writes at once, in one COPY
        assert (writer.written, writer.batches) == (5, 1)
    finally:
        writer.close()
    with connect(database_url) as conn:
        got = conn.execute("SELECT count(*) FROM live_outputs WHERE name = %s AND origin = 'pytest-batch'",
                           [live_ds]).fetchone()
    assert got == (5,)
    with pytest.raises(ValueError, match="batch_s"):
        LiveWriter("x", UNREACHABLE, batch_s=-1.0)


def test_a_forked_child_appends_under_its_own_origin(database_url, live_ds):
    """A writer with the default origin (``host:pid``) takes the child's pid in a forked child, so each process's
    feed (:class:`live.OutputFeed`) tells its own outputs from the others'; a given origin is kept."""
    import multiprocessing as mp

    writer, tagged = LiveWriter(live_ds, database_url), LiveWriter(live_ds, database_url, origin="given")
    assert writer.origin.endswith(f":{os.getpid()}")

    def child() -> None:
        assert writer.append([1, 2, 3]) and tagged.append([4, 5, 6])
        assert writer.flush(30) and tagged.flush(30)
        writer.close()
        tagged.close()

    p = mp.get_context("fork").Process(target=child)
    p.start()
    p.join(60)
    assert p.exitcode == 0 and p.pid is not None
    writer.close()
    tagged.close()
    with connect(database_url) as conn:
        got = conn.execute("SELECT origin FROM live_outputs WHERE name = %s ORDER BY id", [live_ds]).fetchall()
    assert sorted(o for (o,) in got) == sorted([f"{socket.gethostname()}:{p.pid}", "given"])
