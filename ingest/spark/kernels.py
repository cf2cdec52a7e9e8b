"""The Spark job's n-gram kernels: partial counts, occurrence gathering and tree building.

Each runs inside Spark's Python workers on Arrow batches and needs no Spark. They call the single-node build's own code
(:func:`ingest.counting.ngram_windows`, :func:`ingest.occurrences.tag_into`, :func:`ingest.continuations.build_trees`,
:func:`datastore.codec.encode_trees`), so the two engines cannot drift apart: there is one tree builder and one codec.
Counting groups with DuckDB (one thread per task, as Spark runs one task per core), the single-node build's counting
engine.

A partition of documents is laid out as the single-node token stream is (each document followed by
:data:`ingest.tokens.SEPARATOR`), so no n-gram and no continuation crosses a document. Trees are built per *bucket*: the
kept n-grams of one n are dealt round-robin into ``parts = partition_plan(kept, max_occurrences)`` buckets by rank, the
partitions the single-node build hands its worker processes (:func:`ingest.occurrences.partition`), so a bucket yields
the same :class:`datastore.codec.TreeBatch`, and the same blobs, on both engines.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

from datastore.codec import Compression, encode_trees
from datastore.keys import encode_keys
from ingest.continuations import build_trees

from ..counting import KeptNgrams, ngram_windows
from ..occurrences import kept_index, ngram_hash, tag_into
from ..tokens import SEPARATOR

COUNT_SCHEMA = pa.schema([("n", pa.int32()), ("reducer", pa.int32()), ("ngrams", pa.binary()), ("counts", pa.binary())])
COUNT_DDL = "n int, reducer int, ngrams binary, counts binary"
HISTOGRAM_DDL = "n int, c long, k long"
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
    compression: Compression
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


def _ngram_blob(ngrams: np.ndarray) -> bytes:
    return np.ascontiguousarray(ngrams, dtype=np.uint32).tobytes()


def _unique_counts(ngrams: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum ``counts`` ``[m]`` over equal rows of ``ngrams`` ``[m, n]`` (a DuckDB GROUP BY on one thread:
    Spark runs one task per core); returns ``([k, n]`` uint32 distinct rows in no particular order, ``[k]`` int64)."""
    n = ngrams.shape[1]
    names = [f"t{i}" for i in range(n)]
    table = pa.table([pa.array(ngrams[:, i]) for i in range(n)] + [pa.array(counts.astype(np.int64))],
                     names=names + ["c"])
    con = duckdb.connect(config={"threads": 1, "temp_directory": tempfile.gettempdir()})
    try:
        con.execute("SET enable_progress_bar = false")
        con.register("grams", table)
        out = con.sql(f"SELECT {', '.join(names)}, sum(c)::BIGINT AS c FROM grams GROUP BY ALL").to_arrow_table()
    finally:
        con.close()
    grouped = np.stack([out.column(c).to_numpy() for c in names], axis=1).astype(np.uint32) if out.num_rows \
        else np.zeros((0, n), dtype=np.uint32)
    return grouped, out.column("c").to_numpy().astype(np.int64)


def _counts_batch(n: int, reducer: int, ngrams: np.ndarray, counts: np.ndarray) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([n], pa.int32()), pa.array([reducer], pa.int32()), pa.array([_ngram_blob(ngrams)], pa.binary()),
         pa.array([np.ascontiguousarray(counts, dtype=np.int64).tobytes()], pa.binary())], schema=COUNT_SCHEMA)


def unpack_counts(table, n: int) -> tuple[np.ndarray, np.ndarray]:
    """:data:`COUNT_SCHEMA` rows of one n (a table or batch) -> ``([k, n]`` uint32 n-grams, ``[k]`` int64 counts)."""
    ngrams = np.concatenate([np.frombuffer(x, dtype=np.uint32) for x in table.column("ngrams").to_pylist()])
    counts = np.concatenate([np.frombuffer(x, dtype=np.int64) for x in table.column("counts").to_pylist()])
    return ngrams.reshape(len(counts), n), counts


def partial_counts(batches: Iterator[pa.RecordBatch], max_n: int, reducers: int) -> Iterator[pa.RecordBatch]:
    """Exact counts of every n-gram (n = 1..max_n) within one partition of documents.

    Yields :data:`COUNT_SCHEMA` rows, one per ``(n, reducer)``: the distinct n-grams seen here
    whose hash falls to that reducer (of ``reducers``), ``[k, n]`` uint32, with their ``[k]``
    int64 counts. Merging them by ``(n, reducer)`` (:func:`merge_counts`) gives the corpus counts
    of :func:`ingest.counting.count_top_t`.
    """
    stream = partition_stream(batches)
    for n in range(1, max_n + 1):
        chunks = [win[:, valid] for _, valid, win in ngram_windows(stream, n)]
        windows = np.concatenate(chunks, axis=1) if chunks else np.zeros((n, 0), dtype=np.uint32)
        if windows.shape[1] == 0:
            continue
        ngrams, counts = _unique_counts(windows.T, np.ones(windows.shape[1], dtype=np.int64))
        reducer = (ngram_hash(ngrams.T) % np.uint64(reducers)).astype(np.int64)
        order = np.argsort(reducer, kind="stable")
        bounds = np.searchsorted(reducer[order], np.arange(reducers + 1))
        for r in range(reducers):
            sel = order[bounds[r]:bounds[r + 1]]
            if len(sel):
                yield _counts_batch(n, r, ngrams[sel], counts[sel])


def merge_counts(table: pa.Table) -> pa.Table:
    """One ``(n, reducer)`` group of :func:`partial_counts` rows -> one row of corpus counts (same schema)."""
    if table.num_rows == 0:
        return COUNT_SCHEMA.empty_table()
    n, r = int(table.column("n")[0].as_py()), int(table.column("reducer")[0].as_py())
    ngrams, counts = _unique_counts(*unpack_counts(table, n))
    return pa.Table.from_batches([_counts_batch(n, r, ngrams, counts)])


def count_histogram(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Merged count rows -> ``(n, c, k)`` rows: ``k`` n-grams of length ``n`` have count ``c``
    (:data:`HISTOGRAM_DDL`)."""
    for batch in batches:
        for n, blob in zip(batch.column("n").to_pylist(), batch.column("counts").to_pylist()):
            c, k = np.unique(np.frombuffer(blob, dtype=np.int64), return_counts=True)
            yield pa.RecordBatch.from_arrays([pa.array(np.full(len(c), n, dtype=np.int32)), pa.array(c),
                                              pa.array(k.astype(np.int64))], names=["n", "c", "k"])


def count_candidates(batches: Iterator[pa.RecordBatch], minimum: dict[int, int]) -> Iterator[pa.RecordBatch]:
    """Merged count rows -> the same rows cut to the n-grams with count ``>= minimum[n]`` (other n dropped)."""
    for batch in batches:
        for i, n in enumerate(batch.column("n").to_pylist()):
            if n not in minimum:
                continue
            ngrams, counts = unpack_counts(batch.slice(i, 1), n)
            keep = counts >= minimum[n]
            yield _counts_batch(n, batch.column("reducer")[i].as_py(), ngrams[keep], counts[keep])


_INDEX_CACHE: dict[tuple[int, int], tuple] = {}


def _index(kept_set: KeptSet, n: int, token: int) -> tuple:
    """:func:`ingest.occurrences.kept_index` of one n, cached per worker process and selection."""
    key = (token, n)
    if key not in _INDEX_CACHE:
        if len(_INDEX_CACHE) > 16:  # selections of earlier builds in a reused worker
            _INDEX_CACHE.clear()
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
