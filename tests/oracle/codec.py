"""The Python oracle of the native payload parser (``csrc/codec.cpp``): a token-tree payload (codec v1,
docs/tree-format.md) parsed with numpy, the same trees accepted and the same refused, with the same messages."""

from __future__ import annotations

import numpy as np

from datastore.codec import _uvarints
from datastore.errors import CodecError
from datastore.tree import TokenTree

_TOKEN_DTYPES: dict[int, str] = {1: "u1", 2: "<u2", 4: "<u4"}


def parse_payload(p: bytes, width: int) -> TokenTree:
    (n, root), pos = _uvarints(p, 0, 2)
    if pos + n * width > len(p):
        raise CodecError(f"payload too short for {n} token ids")
    if width in (1, 2, 4):
        tokens = np.frombuffer(p, dtype=_TOKEN_DTYPES[width], count=n, offset=pos).astype(np.uint32)
    else:
        b = np.frombuffer(p, dtype=np.uint8, count=n * width, offset=pos).reshape(n, width).astype(np.uint32)
        tokens = b[:, 0] | (b[:, 1] << np.uint32(8)) | (b[:, 2] << np.uint32(16))
    pos += n * width
    codes, pos = _uvarints(p, pos, n)
    counts, pos = _uvarints(p, pos, n)
    if pos != len(p):
        raise CodecError(f"{len(p) - pos} trailing bytes after the tree payload")
    parents = []
    prev = 0
    for i, code in enumerate(codes):
        prev += (code >> 1) ^ -(code & 1)  # unzigzag, then undo the delta on parent + 1
        parent = prev - 1
        if not -1 <= parent < i:
            raise CodecError(f"decoded arrays are not a valid tree: node {i} has parent {parent}")
        if counts[i] > 0xFFFFFFFF or (parent >= 0 and counts[i] > counts[parent]):
            raise CodecError(f"decoded arrays are not a valid tree: node {i} counts more than its parent")
        parents.append(parent)
    return TokenTree.trusted(tokens, np.array(parents, dtype=np.int32), np.array(counts, dtype=np.uint32), root)
