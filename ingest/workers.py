"""Tree building in worker processes, one partition of one n per job.

Jobs read the token stream and the occurrence tags through memory maps, so only the job
description (paths, part number, root counts) and the encoded blobs cross process boundaries.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from datastore.codec import Compression, encode_trees
from ingest.continuations import build_trees

from .occurrences import partition
from .tokens import open_stream


@dataclass(frozen=True)
class TreeJob:
    """One partition to build.

    Attributes:
        stream_path / tags_path: the token stream and this n's tags (``.npy``) files.
        n: n-gram length. num_kept: kept n-grams of this n. parts / part: the partition.
        root_counts: ``[k]`` uint64 counts of this part's n-grams (``kept.counts[part::parts]``).
        depth / budget / compression: tree and codec parameters.
    """

    stream_path: str
    tags_path: str
    n: int
    num_kept: int
    parts: int
    part: int
    root_counts: np.ndarray
    depth: int
    budget: int
    compression: Compression


@dataclass(frozen=True)
class TreeJobResult:
    """Blobs of one partition: ``tree_index`` ``[k]`` int64 into the kept n-grams, ``blobs`` ``[k]``,
    ``sizes`` ``[k]`` int32 nodes of each tree; ``nodes`` their sum."""

    n: int
    tree_index: np.ndarray
    blobs: list
    sizes: np.ndarray
    nodes: int
    build_seconds: float
    encode_seconds: float


def run_tree_job(job: TreeJob) -> TreeJobResult:
    """Build and encode one partition's trees (runs in a worker process)."""
    t0 = time.perf_counter()
    stream = open_stream(Path(job.stream_path))
    tags = np.load(job.tags_path, mmap_mode="r")
    tree_index, positions, local = partition(tags, job.num_kept, job.parts, job.part)
    batch = build_trees(stream, positions, local, job.root_counts, job.n, job.depth, job.budget)
    t1 = time.perf_counter()
    blobs = encode_trees(batch, job.compression)
    sizes = np.diff(batch.offsets).astype(np.int32)
    return TreeJobResult(job.n, tree_index, blobs, sizes, len(batch.token_ids), t1 - t0, time.perf_counter() - t1)
