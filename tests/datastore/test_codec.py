"""The codec (:mod:`datastore.codec`): round trips (hypothesis), every corruption and truncation refused, the format's
known answers, and the native payload parser against its Python oracle."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import crest_native
from datastore import codec
from datastore.codec import CodecError, TreeBatch, decode_tree, encode_tree, encode_trees
from datastore.tree import TokenTree, TreeError
from datastore.varint import encode_varints, zigzag
from oracle.codec import decode_blob, parse_payload, uvarints
from support import random_tree


@st.composite
def trees(draw, max_nodes=80, max_token=2**32 - 2):
    n = draw(st.integers(0, max_nodes))
    parents: list[int] = []
    counts: list[int] = []
    for i in range(n):
        p = draw(st.integers(-1, i - 1))
        parents.append(p)
        cap = counts[p] if p >= 0 else 10**6
        counts.append(draw(st.integers(0, cap)))
    tokens = draw(st.lists(st.integers(0, max_token), min_size=n, max_size=n))
    root = draw(st.integers(0, 2**40))
    return TokenTree(np.array(tokens, dtype=np.uint32), np.array(parents, dtype=np.int32),
                     np.array(counts, dtype=np.uint32), root)


@settings(max_examples=200, deadline=None)
@given(trees(), st.sampled_from(["zstd", "lz4", "none"]))
def test_round_trip(tree, compression):
    assert decode_tree(encode_tree(tree, compression)) == tree


@settings(max_examples=30, deadline=None)
@given(st.lists(trees(max_nodes=30, max_token=70000), max_size=12), st.sampled_from(["zstd", "lz4", "none"]))
def test_batch_encoding_matches_single(tree_list, compression):
    blobs = encode_trees(TreeBatch.from_trees(tree_list), compression)
    assert [decode_tree(b) for b in blobs] == tree_list


@settings(max_examples=40, deadline=None)
@given(trees(max_nodes=40), st.sampled_from(["zstd", "lz4", "none"]), st.data())
def test_any_single_byte_corruption_is_refused(tree, compression, data):
    """A changed byte is refused, or (a bit of a zstd frame header that the decompressor ignores: the payload, which
    the CRC covers, comes out the same) decodes to the same tree: a corrupt blob never decodes to another tree."""
    blob = bytearray(encode_tree(tree, compression))
    i = data.draw(st.integers(0, len(blob) - 1))
    blob[i] ^= data.draw(st.integers(1, 255))
    try:
        decoded = decode_tree(bytes(blob))
    except CodecError:
        return
    assert compression == "zstd" and decoded == tree


@settings(max_examples=40, deadline=None)
@given(trees(max_nodes=40), st.sampled_from(["zstd", "lz4", "none"]), st.data())
def test_truncation_and_extension_are_refused(tree, compression, data):
    blob = encode_tree(tree, compression)
    cut = data.draw(st.integers(0, len(blob) - 1))
    with pytest.raises(CodecError):
        decode_tree(blob[:cut])
    with pytest.raises(CodecError):
        decode_tree(blob + data.draw(st.binary(min_size=1, max_size=8)))


def test_unknown_version_and_magic_named_in_error():
    blob = bytearray(encode_tree(TokenTree(np.array([5]), np.array([-1]), np.array([1]), 1)))
    blob[1] = 99
    with pytest.raises(CodecError, match="version 99"):
        decode_tree(bytes(blob))
    with pytest.raises(CodecError, match="magic"):
        decode_tree(b"\x00" + bytes(blob[1:]))


def test_zstd_shrinks_repetitive_trees():
    chain = TokenTree(np.full(60, 7, np.uint32), np.arange(-1, 59, dtype=np.int32), np.full(60, 3, np.uint32), 3)
    assert len(encode_tree(chain, "zstd")) < len(encode_tree(chain, "none"))


def test_tree_validation_rejects_bad_arrays():
    with pytest.raises(TreeError, match="parent"):
        TokenTree(np.array([1, 2]), np.array([-1, 1]), np.array([1, 1]))
    with pytest.raises(TreeError, match="more than its parent"):
        TokenTree(np.array([1, 2]), np.array([-1, 0]), np.array([1, 2]))
    with pytest.raises(TreeError, match="lengths differ"):
        TokenTree(np.array([1, 2]), np.array([-1]), np.array([1, 1]))


@given(st.lists(st.integers(0, 2**64 - 1), max_size=50))
def test_varints_round_trip(values):
    buf = bytes(encode_varints(np.array(values, dtype=np.uint64)))
    decoded, end = uvarints(buf, 0, len(values))
    assert decoded == values and end == len(buf)


@given(st.lists(st.integers(-(2**62), 2**62), max_size=50))
def test_zigzag_keeps_small_magnitudes_small(values):
    coded = zigzag(np.array(values, dtype=np.int64)).tolist()
    assert [(c >> 1) ^ -(c & 1) for c in coded] == values
    assert all(c <= 2 * abs(v) for c, v in zip(coded, values))


# Format v1, known answers. A 3-node tree, token 300 needs 2-byte ids:
#   c7 01 02           magic, version 1, compression 0 (none) << 4 | token width 2
#   ce de f7 04        CRC-32 (LE) of c7 01 02 followed by the payload
#   0e                 payload length 14 (varint)
#   03 06              num_nodes 3, root_count 6
#   05 00 2c 01 07 00  token ids 5, 300, 7 (LE)
#   00 02 01           zigzag deltas of parent + 1: (0, 1, 0) -> 0, +1, -1
#   04 03 02           counts
V1_NONE = bytes.fromhex("c70102cedef7040e030605002c010700000201040302")
V1_TREE = TokenTree(np.array([5, 300, 7]), np.array([-1, 0, -1]), np.array([4, 3, 2]), 6)
# a 40-token chain of id 7, each node counting 3, stored with zstd (magicless frame) and with lz4 (raw block)
V1_ZSTD = bytes.fromhex("c701112d6e66477a00007d0000302803070002030310004af1c1ca21")
V1_LZ4 = bytes.fromhex("c701216d02f7677a3f2803070100142f00020100131f0301000f500303030303")
V1_CHAIN = TokenTree(np.full(40, 7, np.uint32), np.arange(-1, 39, dtype=np.int32), np.full(40, 3, np.uint32), 3)


def test_format_v1_known_answers():
    """Blobs written by format v1 must stay readable, and the uncompressed layout must not drift: a format
    change has to come with a new version number, and this test has to change with it."""
    assert encode_tree(V1_TREE, "none") == V1_NONE
    assert decode_tree(V1_NONE) == V1_TREE
    assert decode_tree(V1_ZSTD) == V1_CHAIN and decode_tree(V1_LZ4) == V1_CHAIN
    assert len(V1_ZSTD) < len(encode_tree(V1_CHAIN, "none")) and V1_ZSTD[2] >> 4 == 1 and V1_LZ4[2] >> 4 == 2


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 70), st.sampled_from([1, 2, 3, 4]))
def test_native_payload_parser_equals_the_oracle(seed, size, width):
    rng = np.random.default_rng(seed)
    tree = random_tree(rng, min(1 << (8 * width), 1 << 20), size)
    raw = codec._payloads(TreeBatch.from_trees([tree]))[0].tobytes()
    w = codec._token_width(int(tree.token_ids.max(initial=0)))
    tokens, parents, counts, root = crest_native.parse_tree_payload(raw, w)
    assert TokenTree(tokens, parents, counts, root) == parse_payload(raw, w) == tree
    # damaged payloads: the same refusals, with the same messages
    for damaged in (raw[:-1], raw + b"\x00", raw[:1] + bytes([0xFF]) * 12, bytes(rng.integers(0, 256, 12).tolist())):
        try:
            want = parse_payload(damaged, w)
        except CodecError as exc:
            with pytest.raises(ValueError) as got:
                crest_native.parse_tree_payload(damaged, w)
            assert str(got.value) == str(exc)
        else:
            t, p, c, r = crest_native.parse_tree_payload(damaged, w)
            assert TokenTree.trusted(t, p, c, r) == want


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 40), st.sampled_from(["none", "zstd", "lz4"]), st.data())
def test_decode_tree_equals_the_oracle_on_damaged_blobs(seed, size, compression, data):
    """The native header and payload reader behind decode_tree accepts and refuses what the Python oracle does, with
    the same messages: every byte changed, cut or appended, and arbitrary bytes."""
    rng = np.random.default_rng(seed)
    blob = encode_tree(random_tree(rng, 1 << 16, size), compression)
    at = data.draw(st.integers(0, len(blob) - 1))
    flipped = bytearray(blob)
    flipped[at] ^= data.draw(st.integers(1, 255))
    for damaged in (bytes(flipped), blob[:at], blob + b"\x00", bytes(rng.integers(0, 256, at + 1).tolist())):
        try:
            want = decode_blob(damaged)
        except CodecError as exc:
            with pytest.raises(CodecError) as got:
                decode_tree(damaged)
            assert str(got.value) == str(exc)
        else:
            assert decode_tree(damaged) == want


def test_decode_tree_uses_the_native_parser():
    tree = TokenTree(np.array([3, 4], np.uint32), np.array([-1, 0], np.int32), np.array([5, 2], np.uint32), 9)
    blob = encode_tree(tree, "none")
    assert codec.parse_blob is crest_native.parse_blob and codec.blob_header is crest_native.blob_header
    assert codec.decode_tree(blob) == tree
    bad = bytearray(blob)
    bad[-1] ^= 0x40  # a count now above its parent's, with the CRC made to match
    raw = bytes(bad[8:])
    bad[3:7] = zlib.crc32(raw, zlib.crc32(bytes(bad[:3]))).to_bytes(4, "little")
    with pytest.raises(CodecError, match="counts more than its parent"):
        codec.decode_tree(bytes(bad))
