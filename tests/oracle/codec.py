"""The Python oracle of the native payload parser (``csrc/codec.cpp``): a token-tree payload (codec v1,
docs/tree-format.md) parsed with numpy, the same trees accepted and the same refused, with the same messages."""

from __future__ import annotations

import numpy as np

from datastore.errors import CodecError
from datastore.tree import TokenTree

_TOKEN_DTYPES: dict[int, str] = {1: "u1", 2: "<u2", 4: "<u4"}


def uvarints(buf: bytes, pos: int, count: int) -> tuple[list[int], int]:
    """Read ``count`` LEB128 varints from ``buf`` at ``pos``."""
    out: list[int] = []
    for _ in range(count):
        value = shift = 0
        while True:
            if pos >= len(buf):
                raise CodecError("payload ends inside a varint")
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                if value >> 64:
                    raise CodecError("varint value exceeds 64 bits")
                break
            shift += 7
            if shift > 63:
                raise CodecError("varint longer than 10 bytes")
        out.append(value)
    return out, pos


def parse_payload(p: bytes, width: int) -> TokenTree:
    (n, root), pos = uvarints(p, 0, 2)
    if pos + n * width > len(p):
        raise CodecError(f"payload too short for {n} token ids")
    if width in (1, 2, 4):
        tokens = np.frombuffer(p, dtype=_TOKEN_DTYPES[width], count=n, offset=pos).astype(np.uint32)
    else:
        b = np.frombuffer(p, dtype=np.uint8, count=n * width, offset=pos).reshape(n, width).astype(np.uint32)
        tokens = b[:, 0] | (b[:, 1] << np.uint32(8)) | (b[:, 2] << np.uint32(16))
    pos += n * width
    codes, pos = uvarints(p, pos, n)
    counts, pos = uvarints(p, pos, n)
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


def decode_blob(blob: bytes) -> TokenTree:
    """A whole blob (docs/tree-format.md): header, decompression, length, CRC, payload, refused with the same messages
    as the native core's reader (``csrc/codec.cpp``) and :func:`datastore.codec.decode_tree`."""
    import struct
    import zlib

    import lz4.block
    import zstandard

    if len(blob) < 8:
        raise CodecError(f"blob of {len(blob)} bytes is shorter than the 8-byte header")
    magic, version, flags, crc = struct.unpack_from("<BBBI", blob)
    if magic != 0xC7:
        raise CodecError(f"bad magic byte 0x{magic:02x}; this is not a token tree blob")
    if version != 1:
        raise CodecError(f"tree format version {version} is not supported (this build reads version 1)")
    cid, width = flags >> 4, flags & 0x0F
    if not 1 <= width <= 4:
        raise CodecError(f"token width {width} is outside 1..4")
    (raw_len,), body = uvarints(blob, 7, 1)
    if raw_len > 1 << 24:
        raise CodecError(f"payload length {raw_len} exceeds the {1 << 24}-byte limit")
    if cid > 2:
        raise CodecError(f"unknown compression id {cid}")
    try:
        if cid == 0:
            raw = blob[body:]
        elif cid == 1:
            dobj = zstandard.ZstdDecompressor(format=zstandard.FORMAT_ZSTD1_MAGICLESS).decompressobj()
            raw = dobj.decompress(blob[body:])
            if not dobj.eof or dobj.unused_data:
                raise CodecError("zstd body is truncated or followed by extra bytes")
        else:
            raw = lz4.block.decompress(blob[body:], uncompressed_size=raw_len)
    except CodecError:  # a ValueError too, but already the message the codec gives
        raise
    except (zstandard.ZstdError, lz4.block.LZ4BlockError, ValueError) as exc:
        raise CodecError(f"corrupt tree blob: {exc}") from exc
    if len(raw) != raw_len:
        raise CodecError(f"payload is {len(raw)} bytes, header says {raw_len}")
    if zlib.crc32(raw, zlib.crc32(blob[:3])) != crc:
        raise CodecError("CRC mismatch: the blob is corrupt")
    return parse_payload(raw, width)
