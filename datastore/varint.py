"""Vectorized LEB128 varints and zigzag, the integer coding of the tree codec.

LEB128: seven value bits a byte, least significant group first, the high bit set
on every byte but the last. Encoding and decoding run on whole numpy arrays so
that millions of trees can be coded without a Python loop per value.
"""

from __future__ import annotations

import numpy as np

__all__ = ["varint_lengths", "encode_varints", "decode_varints", "zigzag", "unzigzag", "VarintError"]

_MAX_BYTES = 10  # 64-bit values need at most ten 7-bit groups


class VarintError(ValueError):
    """Raised when a byte string does not hold the varints asked for."""


def varint_lengths(values: np.ndarray) -> np.ndarray:
    """Bytes each value takes as a varint.

    Args:
        values: ``[n]`` unsigned integers (any uint dtype, cast to uint64).

    Returns:
        ``[n]`` uint8 lengths, each in 1..10.
    """
    v = np.asarray(values, dtype=np.uint64)
    n = np.ones(v.shape, dtype=np.uint8)
    top = int(v.max(initial=0))
    for k in range(1, _MAX_BYTES):
        if top >> (7 * k) == 0:
            break
        n += v >= np.uint64(1 << (7 * k))
    return n


def encode_varints(values: np.ndarray, out: np.ndarray | None = None, offsets: np.ndarray | None = None) -> np.ndarray:
    """Encode unsigned integers as concatenated varints.

    Args:
        values: ``[n]`` unsigned integers.
        out: optional uint8 buffer to write into; with it, ``offsets`` (``[n]``
            int64, the byte position of each value in ``out``) is required.
        offsets: see ``out``.

    Returns:
        The uint8 buffer written (``out`` when given, else a new array holding
        exactly the encoded bytes).
    """
    v = np.asarray(values, dtype=np.uint64)
    lengths = varint_lengths(v)
    if out is None:
        out = np.empty(int(lengths.sum(dtype=np.int64)), dtype=np.uint8)
        offsets = np.zeros(len(v), dtype=np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
    elif offsets is None:
        raise ValueError("encode_varints: offsets are required when out is given")
    for k in range(int(lengths.max(initial=1))):
        sel = lengths > k
        group = ((v[sel] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        more = (lengths[sel] > k + 1).astype(np.uint8) << 7
        out[offsets[sel] + k] = group | more
    return out


def decode_varints(buf: np.ndarray, count: int, start: int = 0) -> tuple[np.ndarray, int]:
    """Decode ``count`` varints from ``buf`` starting at byte ``start``.

    Args:
        buf: uint8 array.
        count: how many values to read.
        start: byte offset of the first value.

    Returns:
        ``(values, end)``: ``[count]`` uint64 values and the offset after the last byte read.

    Raises:
        VarintError: when the buffer ends inside the values, or a value is
            longer than ten bytes.
    """
    if count == 0:
        return np.zeros(0, dtype=np.uint64), start
    tail = buf[start:]
    ends = np.flatnonzero(tail < 0x80)
    if len(ends) < count:
        raise VarintError(f"buffer holds {len(ends)} complete varints, {count} were expected")
    ends = ends[:count]
    begins = np.empty(count, dtype=np.int64)
    begins[0] = 0
    begins[1:] = ends[:-1] + 1
    lengths = ends - begins + 1
    if lengths.max() > _MAX_BYTES:
        raise VarintError("varint longer than 10 bytes")
    values = np.zeros(count, dtype=np.uint64)
    for k in range(int(lengths.max())):
        sel = lengths > k
        values[sel] |= (tail[begins[sel] + k].astype(np.uint64) & np.uint64(0x7F)) << np.uint64(7 * k)
    return values, start + int(ends[-1]) + 1


def zigzag(values: np.ndarray) -> np.ndarray:
    """Map signed int64 to uint64 so that small magnitudes stay small (0,-1,1,-2 -> 0,1,2,3)."""
    v = np.asarray(values, dtype=np.int64)
    return ((v << 1) ^ (v >> 63)).astype(np.uint64)


def unzigzag(values: np.ndarray) -> np.ndarray:
    """Inverse of :func:`zigzag`: uint64 back to int64."""
    u = np.asarray(values, dtype=np.uint64)
    return ((u >> np.uint64(1)).astype(np.int64)) ^ -((u & np.uint64(1)).astype(np.int64))
