"""Row keys: an n-gram's token ids as fixed-width big-endian bytes.

A key is ``n * key_width`` bytes, so its length gives n. ``key_width`` is 2 when
every id of the tokenizer's vocabulary is below 65,536, else 4 (vocabularies up
to 2**32 - 1 ids work).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

__all__ = ["decode_key", "encode_key", "encode_keys", "key_width_for"]

_DTYPES = {2: ">u2", 4: ">u4"}
_STRUCT = {2: "H", 4: "I"}


def key_width_for(vocab_size: int) -> int:
    """2 for vocabularies of at most 65,536 ids, else 4.

    Raises:
        ValueError: when ``vocab_size`` is not in 1..2**32 - 1.
    """
    if not 1 <= vocab_size < 2**32:
        raise ValueError(f"vocabulary size {vocab_size} is outside 1..2**32-1")
    return 2 if vocab_size <= 1 << 16 else 4


def encode_key(tokens: Sequence[int], width: int) -> bytes:
    """One n-gram's key.

    Raises:
        ValueError: when a token id does not fit ``width`` bytes.
    """
    try:
        return struct.pack(f">{len(tokens)}{_STRUCT[width]}", *tokens)
    except struct.error as exc:
        raise ValueError(f"token ids must be in 0..{(1 << (8 * width)) - 1} for key width {width}: {exc}") from exc


def encode_keys(ngrams: np.ndarray, width: int) -> list[bytes]:
    """Keys of many n-grams of one length; ``ngrams`` is ``[t, n]`` uint32."""
    t, n = ngrams.shape
    buf = np.ascontiguousarray(ngrams.astype(_DTYPES[width])).tobytes()
    step = n * width
    return [buf[i:i + step] for i in range(0, t * step, step)]


def decode_key(key: bytes, width: int) -> tuple[int, ...]:
    """The token ids of a key.

    Raises:
        ValueError: when the key length is not a multiple of ``width``.
    """
    if len(key) % width:
        raise ValueError(f"key of {len(key)} bytes is not a multiple of key width {width}")
    return struct.unpack(f">{len(key) // width}{_STRUCT[width]}", key)
