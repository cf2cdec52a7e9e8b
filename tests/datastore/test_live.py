"""The live layer's stored form (:mod:`datastore.live`): outputs as uint32 little-endian token ids."""

from __future__ import annotations

import pytest

from datastore.live import decode_output, encode_output


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
