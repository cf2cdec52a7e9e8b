"""The Spark job's n-gram kernels: partial counts, occurrence gathering and tree building.

Each runs inside Spark's Python workers on Arrow batches and needs no Spark. They call the
single-node build's own code (:func:`ingest.counting.ngram_windows`, :func:`ingest.occurrences.tag_into`,
:func:`datastore.continuations.build_trees`, :func:`datastore.codec.encode_trees`), so the two
engines cannot drift apart: there is one tree builder and one codec.

A partition of documents is laid out as the single-node token stream is (each document
followed by :data:`ingest.tokens.SEPARATOR`), so no n-gram and no continuation crosses a
document, exactly as on one machine.

Trees are built per *bucket*: the kept n-grams of one n are dealt round-robin into
``parts = partition_plan(kept, max_occurrences)`` buckets by rank, the very partitions the
single-node build hands its worker processes (:func:`ingest.occurrences.partition`). A bucket
therefore yields the same :class:`datastore.codec.TreeBatch`, and the same blobs, on both engines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa

from datastore.codec import encode_trees
from datastore.continuations import build_trees
from datastore.keys import encode_keys

from ..counting import KeptNgrams, ngram_windows
from ..occurrences import kept_index, tag_into
from ..tokens import SEPARATOR

__all__ = ["COUNT_SCHEMA", "COUNT_DDL", "OCCURRENCE_SCHEMA", "OCCURRENCE_DDL", "TREE_SCHEMA", "TREE_DDL",
           "KeptSet", "partition_stream", "partial_counts", "keys_to_ngrams", "gather_occurrences", "bucket_trees"]

COUNT_SCHEMA = pa.schema([("n", pa.int32()), ("key", pa.binary()), ("c", pa.int64())])
COUNT_DDL = "n int, key binary, c long"
OCCURRENCE_SCHEMA = pa.schema([("n", pa.int32()), ("bucket", pa.int32()), ("local", pa.binary()),
                               ("conts", pa.binary())])
OCCURRENCE_DDL = "n int, bucket int, local binary, conts binary"
TREE_SCHEMA = pa.schema([("key", pa.binary()), ("tree", pa.binary()), ("n", pa.int32()), ("nodes", pa.int32())])
TREE_DDL = "key binary, tree binary, n int, nodes int"

_SEP16 = np.uint16(0xFFFF)


@dataclass(frozen=True)
class KeptSet:
    """What the tree kernels need to know about the selection (broadcast to every worker).

    Attributes:
        kept: per n, the :class:`ingest.counting.KeptNgrams` (rank order).
        parts: per n, the number of tree buckets (``partition_plan``).
        depth / budget / compression: tree and codec parameters.
        key_width: bytes per token id in keys (2 or 4).
        narrow: continuations travel as uint16 (every token id < 65,535; 0xFFFF ends a
            continuation), else uint32.
    """

    kept: dict[int, KeptNgrams]
    parts: dict[int, int]
    depth: int
    budget: int
    compression: str
    key_width: int
    narrow: bool


def partition_stream(batches: Iterator[pa.RecordBatch], column: str = "ids") -> np.ndarray:
    """``[tokens + documents]`` uint32: a partition's documents, each followed by the separator."""
    values, lengths = [], []
    for batch in batches:
        ids = batch.column(column)
        if len(ids) == 0:
            continue
        offsets = ids.offsets.to_numpy()
        values.append(ids.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]].astype(np.uint32))
        lengths.append(np.diff(offsets))
    if not values:
        return np.zeros(0, dtype=np.uint32)
    flat, lens = np.concatenate(values), np.concatenate(lengths)
    ends = np.cumsum(lens)
    return np.insert(flat, ends, SEPARATOR).astype(np.uint32)


def _key_array(ngrams: np.ndarray, width: int) -> pa.Array:
    """``[k, n]`` uint32 n-grams -> binary keys (:func:`datastore.keys.encode_key` layout)."""
    k, n = ngrams.shape
    buf = np.ascontiguousarray(ngrams.astype(">u2" if width == 2 else ">u4")).tobytes()
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(n * width), k, [None, pa.py_buffer(buf)])
    return fixed.cast(pa.binary())


def keys_to_ngrams(keys: pa.Array, n: int, width: int) -> np.ndarray:
    """Binary keys of one n (``n * width`` bytes each) -> ``[k, n]`` uint32 n-grams.

    Raises:
        ValueError: when a key has another length.
    """
    keys = keys.cast(pa.binary()) if keys.type != pa.binary() else keys
    offsets = np.frombuffer(keys.buffers()[1], dtype=np.int32, count=len(keys) + 1, offset=keys.offset * 4)
    if len(keys) and np.any(np.diff(offsets) != n * width):
        raise ValueError(f"keys of n={n} must be {n * width} bytes each")
    data = np.frombuffer(keys.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
    return data.view(">u2" if width == 2 else ">u4").reshape(len(keys), n).astype(np.uint32)


def partial_counts(batches: Iterator[pa.RecordBatch], max_n: int, key_width: int) -> Iterator[pa.RecordBatch]:
    """Exact counts of every n-gram (n = 1..max_n) within one partition of documents.

    Yields :data:`COUNT_SCHEMA` batches, one per n: distinct keys with their counts here. Summing
    them by ``(n, key)`` over all partitions gives the corpus counts of
    :func:`ingest.counting.count_top_t`.
    """
    stream = partition_stream(batches)
    for n in range(1, max_n + 1):
        chunks = [win[:, valid] for _, valid, win in ngram_windows(stream, n)]
        windows = np.concatenate(chunks, axis=1) if chunks else np.zeros((n, 0), dtype=np.uint32)
        if windows.shape[1] == 0:
            continue
        order = np.lexsort(windows[::-1])  # first token is the primary key
        ordered = windows[:, order]
        change = np.any(ordered[:, 1:] != ordered[:, :-1], axis=0)
        starts = np.flatnonzero(np.r_[True, change])
        counts = np.diff(np.r_[starts, ordered.shape[1]])
        yield pa.RecordBatch.from_arrays(
            [pa.array(np.full(len(starts), n, dtype=np.int32)), _key_array(ordered[:, starts].T, key_width),
             pa.array(counts.astype(np.int64))], schema=COUNT_SCHEMA)


_INDEX_CACHE: dict[tuple[int, int], tuple] = {}


def _index(kept_set: KeptSet, n: int, token: int) -> tuple:
    """:func:`ingest.occurrences.kept_index` of one n, cached per worker process and selection."""
    key = (token, n)
    if key not in _INDEX_CACHE:
        _INDEX_CACHE.clear() if len(_INDEX_CACHE) > 16 else None
        _INDEX_CACHE[key] = kept_index(kept_set.kept[n])
    return _INDEX_CACHE[key]


def gather_occurrences(batches: Iterator[pa.RecordBatch], kept_set: KeptSet, token: int) -> Iterator[pa.RecordBatch]:
    """Every occurrence of a kept n-gram in one partition, with its continuation, grouped by bucket.

    Yields :data:`OCCURRENCE_SCHEMA` rows, one per ``(n, bucket)`` present here: ``local`` holds
    ``[m]`` int32 tree indices within the bucket (rank ``// parts``), ``conts`` ``[m, depth]``
    tokens (uint16 or uint32 per ``kept_set.narrow``, native byte order) that follow each
    occurrence, the separator past a document's end. ``token`` names the selection (a cache key).
    """
    stream = partition_stream(batches)
    if len(stream) == 0:
        return
    tags = np.empty(len(stream), dtype=np.int32)
    steps = np.arange(kept_set.depth, dtype=np.int64)
    for n, kept in kept_set.kept.items():
        if len(kept) == 0:
            continue
        tag_into(stream, kept, tags, _index(kept_set, n, token))
        pos = np.flatnonzero(tags >= 0)
        if len(pos) == 0:
            continue
        tree = tags[pos].astype(np.int64)
        at = pos[:, None] + n + steps[None, :]  # [m, depth]
        conts = stream[np.minimum(at, len(stream) - 1)]
        conts[at >= len(stream)] = SEPARATOR
        if kept_set.narrow:
            conts = conts.astype(np.uint16)  # SEPARATOR -> 0xFFFF
        parts = kept_set.parts[n]
        bucket = tree % parts
        order = np.argsort(bucket, kind="stable")
        bounds = np.searchsorted(bucket[order], np.arange(parts + 1))
        for b in range(parts):
            sel = order[bounds[b]:bounds[b + 1]]
            if len(sel) == 0:
                continue
            yield pa.RecordBatch.from_arrays(
                [pa.array([n], pa.int32()), pa.array([b], pa.int32()),
                 pa.array([(tree[sel] // parts).astype(np.int32).tobytes()], pa.binary()),
                 pa.array([np.ascontiguousarray(conts[sel]).tobytes()], pa.binary())], schema=OCCURRENCE_SCHEMA)


def bucket_trees(table: pa.Table, kept_set: KeptSet) -> pa.Table:
    """Build and encode the trees of one ``(n, bucket)`` group of :func:`gather_occurrences` rows.

    Returns a :data:`TREE_SCHEMA` table: every kept n-gram of the bucket with its codec blob
    and node count, identical to the single-node build's partition of the same number.
    """
    if table.num_rows == 0:
        return TREE_SCHEMA.empty_table()
    n, b = int(table.column("n")[0].as_py()), int(table.column("bucket")[0].as_py())
    kept, parts, depth = kept_set.kept[n], kept_set.parts[n], kept_set.depth
    local = np.concatenate([np.frombuffer(x, dtype=np.int32) for x in table.column("local").to_pylist()])
    dtype = np.uint16 if kept_set.narrow else np.uint32
    conts = np.concatenate([np.frombuffer(x, dtype=dtype) for x in table.column("conts").to_pylist()])
    conts = conts.reshape(len(local), depth).astype(np.uint32)
    if kept_set.narrow:
        conts[conts == np.uint32(_SEP16)] = SEPARATOR
    # one occurrence per row: its continuation, then a separator that ends it
    tokens = np.concatenate([conts, np.full((len(local), 1), SEPARATOR, dtype=np.uint32)], axis=1).ravel()
    positions = np.arange(len(local), dtype=np.int64) * (depth + 1)
    root_counts = kept.counts[b::parts]
    batch = build_trees(tokens, positions, local.astype(np.int64), root_counts, 0, depth, kept_set.budget)
    blobs = encode_trees(batch, kept_set.compression)
    keys = encode_keys(kept.ngrams[b::parts], kept_set.key_width)
    return pa.table([pa.array(keys, pa.binary()), pa.array(blobs, pa.binary()),
                     pa.array(np.full(len(keys), n, dtype=np.int32)),
                     pa.array(np.diff(batch.offsets).astype(np.int32))], schema=TREE_SCHEMA)
