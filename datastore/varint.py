"""Vectorized LEB128 varint and zigzag encoding, the integer coding of the tree codec.

LEB128: seven value bits a byte, least significant group first, the high bit set
on every byte but the last. Encoding runs on whole numpy arrays so that millions
of trees are coded without a Python loop per value; decoding reads one small
tree at a time and lives in :mod:`datastore.codec`.
"""

from __future__ import annotations

import numpy as np

_MAX_BYTES = 10  # 64-bit values need at most ten 7-bit groups


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


def zigzag(values: np.ndarray) -> np.ndarray:
    """Map signed int64 to uint64 so that small magnitudes stay small (0,-1,1,-2 -> 0,1,2,3)."""
    v = np.asarray(values, dtype=np.int64)
    return ((v << 1) ^ (v >> 63)).astype(np.uint64)
