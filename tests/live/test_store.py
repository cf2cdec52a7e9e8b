"""The live layer's outputs read back (:mod:`live.store`): the newest within a token bound, the ids
appended since, one origin left out; a reader granted a live layer may read them, one granted only a datastore may
not. Real Postgres."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

from datastore.admin.grants import grant_reader, revoke_reader
from datastore.connection import connect
from datastore.errors import DatabaseUnavailable
from datastore.layers import live_name
from live.store import LiveOutputs, decode_output, encode_output
from support import UNREACHABLE, append_outputs, with_params


def test_newest_within_a_bound_ids_after_and_fetch(database_url, live_ds):
    outs = [[i, i + 1, i + 2] for i in range(0, 30, 3)]  # ten outputs of three tokens
    append_outputs(database_url, live_ds, outs[:6], "a")
    append_outputs(database_url, live_ds, outs[6:], "b")
    append_outputs(database_url, live_ds + "-other", [[9, 9]], "a")  # another layer's output is never read
    reader = LiveOutputs(live_ds, database_url)
    try:
        newest = reader.newest(10)  # three whole outputs fit in 10 tokens
        assert [o.tokens.tolist() for o in newest] == outs[-3:]
        assert [o.id for o in newest] == sorted(o.id for o in newest)
        assert [o.tokens.tolist() for o in reader.newest(1000, skip_origin="b")] == outs[:6]
        assert reader.newest(2) == []
        ids = reader.ids_after(0)
        assert len(ids) == 10 and ids == sorted(ids) and reader.last_id() == ids[-1]
        assert LiveOutputs(live_ds + "-none", database_url).last_id() == 0
        assert reader.ids_after(ids[5]) == ids[6:] and reader.ids_after(0, skip_origin="a") == ids[6:]
        got = reader.fetch([ids[7], ids[2], 10**15])  # in id order; an id not of this layer is left out
        assert [o.tokens.tolist() for o in got] == [outs[2], outs[7]] and reader.fetch([]) == []
        assert reader.newest(0) == []
        with pytest.raises(ValueError, match="max_tokens"):
            reader.newest(-1)
    finally:
        reader.close()
        with connect(database_url, autocommit=True) as conn:
            conn.execute("DELETE FROM live_outputs WHERE name = %s", [live_ds + "-other"])


def test_a_live_layers_reader_may_read_the_outputs_and_no_other(database_url, live_ds):
    append_outputs(database_url, live_ds, [[1, 2, 3]], "a")
    role = f"crest_reader_{uuid.uuid4().hex[:8]}"
    grant_reader(database_url, role, live_ds, create=True, future=True)
    url = with_params(database_url, user=role)
    try:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            LiveOutputs(live_ds, url).newest(100)  # a datastore's reader alone: not its layer's outputs
        grant_reader(database_url, role, live_name(live_ds), future=True)
        reader = LiveOutputs(live_ds, url)
        assert [o.tokens.tolist() for o in reader.newest(100)] == [[1, 2, 3]]  # the failed read did not stick
        reader.close()
        with psycopg.connect(url, autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM live_outputs")  # reading never needs writing
        revoke_reader(database_url, role, live_name(live_ds))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            LiveOutputs(live_ds, url).newest(100)
    finally:
        with connect(database_url, autocommit=True) as conn:
            conn.execute("DELETE FROM reader_grants WHERE role = %s", [role])
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_server_that_is_down_is_named():
    with pytest.raises(DatabaseUnavailable, match="cannot connect"):
        LiveOutputs("x", UNREACHABLE).ids_after(0)

def test_encode_decode_round_trip_and_errors():
    toks = [0, 1, 49151, 2**32 - 1]
    blob = encode_output(toks)
    assert len(blob) == 16 and blob[:4] == b"\x00\x00\x00\x00" and blob[4:8] == b"\x01\x00\x00\x00"  # little-endian
    assert decode_output(blob).tolist() == toks
    for bad in ([], [-1], [2**32]):
        with pytest.raises(ValueError):
            encode_output(bad)
    with pytest.raises(ValueError, match="multiple of 4"):
        decode_output(b"\x00\x01\x02")
