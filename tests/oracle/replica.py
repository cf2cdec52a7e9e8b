"""The Python oracle of the host-local replica format, version 2 (``docs/replica-format.md``, ``csrc/replica.cpp``):
the format's hash (:func:`hash_bytes`), and a reader of the whole file that checks every slot block and record the way
a lookup does and returns each stored key's record."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .codec import uvarints

_MASK = (1 << 64) - 1
HEADER_BYTES = 4096
BLOCK_BYTES = 64
BLOCK_SLOTS = 7
CHECK_BYTES = 8


def hash_bytes(data: bytes, seed: int = 0) -> int:
    """The format's 64-bit hash of ``data`` from ``seed`` (a key's: seed 0; a slot block's: its number; a record's: its
    offset in the records): 8-byte little-endian chunks (the last zero-padded), each xored in, multiplied and
    xorshifted, then MurmurHash3's finalizer."""
    h = 0x9E3779B97F4A7C15 ^ ((len(data) * 0xC2B2AE3D27D4EB4F) & _MASK) ^ seed
    for i in range(0, len(data), 8):
        h ^= int.from_bytes(data[i:i + 8], "little")
        h = (h * 0xBF58476D1CE4E5B9) & _MASK
        h ^= h >> 31
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & _MASK
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & _MASK
    return h ^ (h >> 33)


@dataclass(frozen=True)
class Record:
    """One stored n-gram: where its record starts in the file, its key bytes, and its tree's payload and token width
    (``None``, 0: the build's tree is unreadable)."""

    at: int
    key: bytes
    payload: bytes | None
    width: int


@dataclass(frozen=True)
class Layout:
    """A replica's regions: ``records`` (start, end) and ``slots`` (start, end), in file offsets."""

    records: tuple[int, int]
    slots: tuple[int, int]


def layout(data: bytes) -> Layout:
    """The regions of a replica's bytes, from its header."""
    records_at, records_bytes, slots_at = struct.unpack_from("<QQQ", data, 48)
    slots = struct.unpack_from("<Q", data, 40)[0]
    return Layout((records_at, records_at + records_bytes), (slots_at, slots_at + slots // BLOCK_SLOTS * BLOCK_BYTES))


def read(data: bytes) -> dict[bytes, Record]:
    """Every record of a replica, by key, each reached from the slot table as a lookup does; raises ``ValueError``
    naming the first slot block or record that fails its check."""
    where = layout(data)
    records_at = where.records[0]
    out: dict[bytes, Record] = {}
    for b, start in enumerate(range(*where.slots, BLOCK_BYTES)):
        block = data[start:start + BLOCK_BYTES]
        if hash_bytes(block[:BLOCK_SLOTS * 8], b) != int.from_bytes(block[BLOCK_SLOTS * 8:], "little"):
            raise ValueError(f"slot block {b} fails its check")
        for k in range(BLOCK_SLOTS):
            slot = int.from_bytes(block[8 * k:8 * k + 8], "little")
            if slot:
                rec = _record(data, records_at, (slot & ((1 << 48) - 1)) - 1)
                out[rec.key] = rec
    return out


def _record(data: bytes, records_at: int, offset: int) -> Record:
    at = records_at + offset
    key_len = data[at]
    key = data[at + 1:at + 1 + key_len]
    (size,), pos = uvarints(data, at + 1 + key_len, 1)
    end = pos + size
    if hash_bytes(data[at:end], offset) != int.from_bytes(data[end:end + CHECK_BYTES], "little"):
        raise ValueError(f"the record at {offset} fails its check")
    if size == 0:
        return Record(at, key, None, 0)
    return Record(at, key, data[pos + 1:end], data[pos])
