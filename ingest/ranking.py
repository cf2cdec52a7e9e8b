"""A build's n-gram ranking, kept on disk so that later builds of the same stream skip counting.

For every n the cache holds the kept n-grams in rank order (count descending,
token ids ascending; see :mod:`ingest.counting`), their counts, and, once the
trees are built, the node count of each one's tree. A later build of the same
token stream with the same ``min_count`` and a top-t no larger than the cached
one (or any top-t, when the cache already holds every distinct n-gram) takes its
selection by slicing: top-t selections of one stream are nested, so the first t
rows are exactly what counting would return. CREST's size grids (§5.3, §5.4)
are built this way: one count, many top-t values.

Files (``<dir>/``): ``meta.json`` (the stream's digest) and per n ``kept_<n>.npz``
(``ngrams`` ``[t, n]`` uint32, ``counts`` ``[t]`` uint64, ``distinct``,
``occurrences``, ``min_count``) and ``nodes_<n>.npy`` (``[t]`` int32).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from .counting import KeptNgrams

__all__ = ["RankingCache", "stream_digest"]


def stream_digest(path: Path, chunk: int = 1 << 24) -> str:
    """BLAKE2b-128 hex digest of a token stream file (names the stream a ranking belongs to)."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


class RankingCache:
    """The ranking cache of one token stream in ``directory``.

    Args:
        directory: where the files live (created). A cache of another stream found there is
            discarded: its files are removed.
        digest: the stream's :func:`stream_digest`.
    """

    def __init__(self, directory: Path, digest: str) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = self.dir / "meta.json"
        if meta.exists() and json.loads(meta.read_text()).get("stream") != digest:
            for f in list(self.dir.glob("kept_*.npz")) + list(self.dir.glob("nodes_*.npy")):
                f.unlink()
        meta.write_text(json.dumps({"stream": digest}))
        self.digest = digest

    def load(self, n: int, top_t: int, min_count: int) -> KeptNgrams | None:
        """The top-t n-grams of length ``n`` from the cache, or ``None`` when it cannot answer."""
        path = self.dir / f"kept_{n}.npz"
        if not path.exists():
            return None
        with np.load(path) as z:
            if int(z["min_count"]) != min_count:
                return None
            cached = len(z["counts"])
            complete = cached >= int(z["eligible"])  # every n-gram with count >= min_count is there
            if cached < top_t and not complete:
                return None
            return KeptNgrams(n, z["ngrams"][:top_t].copy(), z["counts"][:top_t].copy(), int(z["distinct"]),
                              int(z["occurrences"]), int(z["eligible"]))

    def save(self, kept: KeptNgrams, min_count: int) -> None:
        """Store a selection made with ``min_count`` (``kept.eligible`` must be known).

        Raises:
            ValueError: when ``kept.eligible`` is unknown (-1).
        """
        if kept.eligible < 0:
            raise ValueError("kept.eligible is unknown: count with ingest.counting.count_top_t")
        tmp = self.dir / f"kept_{kept.n}.tmp.npz"
        np.savez(tmp, ngrams=kept.ngrams, counts=kept.counts, distinct=kept.distinct,
                 occurrences=kept.occurrences, min_count=min_count, eligible=kept.eligible)
        tmp.replace(self.dir / f"kept_{kept.n}.npz")
        stale = self.dir / f"nodes_{kept.n}.npy"
        if stale.exists():
            stale.unlink()

    def save_nodes(self, n: int, nodes: np.ndarray) -> None:
        """Store ``[t]`` int32 tree sizes (nodes) of the kept n-grams of length ``n``, in rank order."""
        np.save(self.dir / f"nodes_{n}.npy", np.asarray(nodes, dtype=np.int32))

    def nodes(self, n: int) -> np.ndarray | None:
        """``[t]`` int32 tree sizes of length-``n`` n-grams in rank order, or ``None`` if not stored."""
        path = self.dir / f"nodes_{n}.npy"
        return np.load(path) if path.exists() else None

    def kept(self, n: int) -> KeptNgrams | None:
        """Everything cached for length ``n`` (no slicing), or ``None``."""
        path = self.dir / f"kept_{n}.npz"
        if not path.exists():
            return None
        with np.load(path) as z:
            return KeptNgrams(n, z["ngrams"].copy(), z["counts"].copy(), int(z["distinct"]), int(z["occurrences"]),
                              int(z["eligible"]))
