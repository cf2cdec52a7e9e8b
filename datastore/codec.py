"""Versioned binary codec for token trees (format spec: docs/tree-format.md).

One blob holds one tree: magic ``0xC7``, format version 1, a byte of compression id (high nibble: 0 none, 1 zstd, 2 lz4)
and token width (low nibble: 1..4 bytes), the CRC-32 (uint32 LE) of those three bytes followed by the uncompressed
payload, the payload's uncompressed length (LEB128 varint), then the payload, compressed as the id says. The payload:
varint num_nodes, varint root_count, the token ids (LE), zigzag varints of ``parents[i] - parents[i-1]``
(``parents[-1] = -1``), and varint counts.

The encoder (numpy, the ingest hot path) stores the payload uncompressed whenever compression would not make it smaller,
so "zstd" means "zstd where it pays". Any corruption or truncation raises :class:`CodecError`: the header, lengths and
CRC are all checked, and the decoded arrays must form a valid :class:`TokenTree`. Blobs are checked and parsed by the
native core (``csrc/codec.cpp``, which also reads the replicas' plain blobs); its Python oracle
(``tests/oracle/codec.py``) accepts and refuses the same blobs, with the same messages.
"""

from __future__ import annotations

import struct
import threading
import zlib
from dataclasses import dataclass
from typing import Literal

import lz4.block
import numpy as np
import zstandard

from crest_native import COMPRESSION_IDS, blob_header, parse_blob

from .errors import CodecError
from .tree import TokenTree
from .varint import encode_varints, varint_lengths, zigzag

__all__ = ["TreeBatch", "encode_trees", "decode_tree", "decompress_body", "Compression"]

MAGIC = 0xC7
FORMAT_VERSION = 1
Compression = Literal["none", "zstd", "lz4"]
_COMPRESSION_IDS: dict[str, int] = dict(COMPRESSION_IDS)  # named once, in the native core (csrc/codec.hpp)
_NONE, _ZSTD = _COMPRESSION_IDS["none"], _COMPRESSION_IDS["zstd"]
_HEADER = struct.Struct("<BBBI")  # magic, version, compression<<4 | token width, crc32


@dataclass(frozen=True)
class TreeBatch:
    """Many token trees in concatenated flat arrays (what ingest produces and the codec encodes).

    Attributes:
        offsets: ``[num_trees + 1]`` int64; tree ``k`` owns nodes ``offsets[k]:offsets[k+1]``.
        token_ids: ``[total_nodes]`` uint32.
        parents: ``[total_nodes]`` int32, indices local to each tree (``-1`` = root).
        counts: ``[total_nodes]`` uint32.
        root_counts: ``[num_trees]`` uint64, the count of each tree's root context.
    """

    offsets: np.ndarray
    token_ids: np.ndarray
    parents: np.ndarray
    counts: np.ndarray
    root_counts: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def tree(self, k: int) -> TokenTree:
        """Tree ``k`` as a :class:`TokenTree` (validated)."""
        s, e = int(self.offsets[k]), int(self.offsets[k + 1])
        return TokenTree(self.token_ids[s:e], self.parents[s:e], self.counts[s:e], int(self.root_counts[k]))

    @classmethod
    def from_trees(cls, trees: list[TokenTree]) -> TreeBatch:
        """Concatenate individual trees into one batch."""
        sizes = np.array([len(t) for t in trees], dtype=np.int64)
        offsets = np.zeros(len(trees) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        def cat(attr: str, dt) -> np.ndarray:
            return np.concatenate([getattr(t, attr) for t in trees]).astype(dt) if trees else np.zeros(0, dt)

        return cls(
            offsets,
            cat("token_ids", np.uint32),
            cat("parents", np.int32),
            cat("counts", np.uint32),
            np.array([t.root_count for t in trees], dtype=np.uint64),
        )


def _token_width(max_token: int) -> int:
    return 1 if max_token < 1 << 8 else 2 if max_token < 1 << 16 else 3 if max_token < 1 << 24 else 4


def _segment_sums(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    cs = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=cs[1:])
    return cs[offsets[1:]] - cs[offsets[:-1]], cs


def _payloads(batch: TreeBatch) -> tuple[np.ndarray, np.ndarray, int]:
    """Build every tree's uncompressed payload into one buffer; returns (buffer, starts[T+1], width)."""
    offsets = np.asarray(batch.offsets, dtype=np.int64)
    sizes = np.diff(offsets)
    tree_of = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    local = np.arange(len(batch.token_ids), dtype=np.int64) - offsets[tree_of]
    width = _token_width(int(batch.token_ids.max(initial=0)))

    p1 = batch.parents.astype(np.int64) + 1
    prev = np.zeros_like(p1)
    prev[1:] = p1[:-1]
    prev[local == 0] = 0
    parent_codes = zigzag(p1 - prev)
    counts = batch.counts.astype(np.uint64)

    len_n = varint_lengths(sizes.astype(np.uint64)).astype(np.int64)
    len_r = varint_lengths(batch.root_counts).astype(np.int64)
    plen = varint_lengths(parent_codes).astype(np.int64)
    clen = varint_lengths(counts).astype(np.int64)
    seg_p, cs_p = _segment_sums(plen, offsets)
    seg_c, cs_c = _segment_sums(clen, offsets)
    total = len_n + len_r + sizes * width + seg_p + seg_c
    starts = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(total, out=starts[1:])

    buf = np.empty(int(starts[-1]), dtype=np.uint8)
    encode_varints(sizes.astype(np.uint64), buf, starts[:-1])
    encode_varints(batch.root_counts, buf, starts[:-1] + len_n)
    tok_base = starts[:-1] + len_n + len_r
    tok_pos = tok_base[tree_of] + local * width
    for b in range(width):
        buf[tok_pos + b] = ((batch.token_ids >> np.uint32(8 * b)) & np.uint32(0xFF)).astype(np.uint8)
    par_base = tok_base + sizes * width
    encode_varints(parent_codes, buf, par_base[tree_of] + (cs_p[:-1] - cs_p[offsets[tree_of]]))
    cnt_base = par_base + seg_p
    encode_varints(counts, buf, cnt_base[tree_of] + (cs_c[:-1] - cs_c[offsets[tree_of]]))
    return buf, starts, width


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _zstd_params(level: int) -> zstandard.ZstdCompressionParameters:
    return zstandard.ZstdCompressionParameters.from_level(
        level, format=zstandard.FORMAT_ZSTD1_MAGICLESS, write_content_size=False, write_checksum=False,
        write_dict_id=False
    )


def encode_trees(batch: TreeBatch, compression: Compression = "zstd", level: int = 3, threads: int = 0) -> list[bytes]:
    """Encode many trees, one blob each (vectorized; the ingest hot path).

    Args:
        batch: the trees; not validated here (ingest builds them valid by construction).
        compression: ``"zstd"`` (default), ``"lz4"`` or ``"none"``; a blob is
            stored uncompressed when compression would not shrink it.
        level: zstd compression level (1..22).
        threads: zstd worker threads (0: one; -1: all cores).

    Returns:
        ``[num_trees]`` blobs in batch order.

    Raises:
        ValueError: for an unknown compression name.
    """
    if compression not in _COMPRESSION_IDS:
        raise ValueError(f"unknown compression {compression!r}; use one of {sorted(_COMPRESSION_IDS)}")
    buf, starts, width = _payloads(batch)
    raw_bytes = buf.tobytes()
    raws = [raw_bytes[s:e] for s, e in zip(starts[:-1].tolist(), starts[1:].tolist())]
    if compression == "zstd" and raws:
        comp = zstandard.ZstdCompressor(compression_params=_zstd_params(level))
        if threads and len(raws) > 1:
            segments: list[bytes | bytearray | memoryview] = list(raws)
            packed = comp.multi_compress_to_buffer(segments, threads=threads)
            bodies = [packed[i].tobytes() for i in range(len(raws))]
        else:
            bodies = [comp.compress(r) for r in raws]
    elif compression == "lz4":
        bodies = [lz4.block.compress(r, store_size=False) for r in raws]
    else:
        bodies = raws
    cid = _COMPRESSION_IDS[compression]
    out: list[bytes] = []
    pack = _HEADER.pack
    for raw, body in zip(raws, bodies):
        n = len(raw)
        length = _varint_bytes(n)
        flags = (cid << 4) | width if len(body) < n else width
        crc = zlib.crc32(raw, zlib.crc32(bytes((MAGIC, FORMAT_VERSION, flags))))
        out.append(pack(MAGIC, FORMAT_VERSION, flags, crc) + length + (body if flags >> 4 else raw))
    return out


def encode_tree(tree: TokenTree, compression: Compression = "zstd", level: int = 3) -> bytes:
    """Encode one tree; see :func:`encode_trees` for the arguments."""
    return encode_trees(TreeBatch.from_trees([tree]), compression, level)[0]


_local = threading.local()  # one zstd decompression context per thread (they are not thread-safe)


def _zstd() -> zstandard.ZstdDecompressor:
    dctx = getattr(_local, "zstd", None)
    if dctx is None:  # creating one costs ~14 us, a third of decoding a typical tree
        dctx = _local.zstd = zstandard.ZstdDecompressor(format=zstandard.FORMAT_ZSTD1_MAGICLESS)
    return dctx


def decompress_body(cid: int, body: bytes, raw_len: int) -> bytes:
    """The payload of a stored blob's body (what follows its header), compressed as compression id ``cid`` says
    (``crest_native.COMPRESSION_IDS``; a zstd body is magicless): ``raw_len`` bytes. The one decompressor of a body:
    decoding a tree and writing a replica both use it (a replica writes its zstd bodies in batches first).

    Raises:
        CodecError: when the body does not decompress (truncated, extra bytes, corrupt), or ``cid`` is unknown.
    """
    try:
        if cid == _NONE:
            return body
        if cid == _ZSTD:
            dobj = _zstd().decompressobj()
            raw = dobj.decompress(body)
            if not dobj.eof or dobj.unused_data:
                raise CodecError("zstd body is truncated or followed by extra bytes")
            return raw
        if cid == _COMPRESSION_IDS["lz4"]:
            return lz4.block.decompress(body, uncompressed_size=raw_len)
    except CodecError:  # a ValueError too, but already the message the codec gives
        raise
    except (zstandard.ZstdError, lz4.block.LZ4BlockError, ValueError) as exc:
        raise CodecError(f"corrupt tree blob: {exc}") from exc
    raise CodecError(f"unknown compression id {cid}")


def decode_tree(blob: bytes) -> TokenTree:
    """Decode one blob written by :func:`encode_tree` / :func:`encode_trees`: the native core reads its header
    (:func:`crest_native.blob_header`) and checks and parses its payload (:func:`crest_native.parse_blob`: length,
    CRC, tree); the body is decompressed here.

    Args:
        blob: the bytes as stored.

    Returns:
        The :class:`TokenTree`, with ``root_count`` set.

    Raises:
        CodecError: on a wrong magic byte, an unknown version or compression
            id, a bad length, a failed decompression, a CRC mismatch, trailing
            bytes, or arrays that do not form a valid tree.
    """
    blob = bytes(blob)
    try:
        cid, raw_len, body = blob_header(blob)
    except ValueError as exc:
        raise CodecError(str(exc)) from None
    raw = decompress_body(cid, blob[body:], raw_len)
    try:
        tokens, parents, counts, root = parse_blob(blob, raw)
    except ValueError as exc:
        raise CodecError(str(exc)) from None
    return TokenTree.trusted(tokens, parents, counts, root)
