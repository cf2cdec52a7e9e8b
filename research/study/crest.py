"""CREST datastores over a size grid, each a subset of one full build.

A kept n-gram's token tree depends only on the n-gram and the corpus, not on
top-t, so the datastore for any (set of n, top-t) point is exactly the rows of a
build at the grid's largest top-t whose n-gram is among the first top-t of its n.
The study builds that full datastore once (its ranking cached by
:class:`ingest.ranking.RankingCache`), then materializes each point as a datastore
of its own with one server-side copy (:meth:`datastore.admin.writer.DatastoreWriter.copy_from`),
hash index and all, and measures its real bytes on disk.

Points follow CREST: single n (§5.3: only n-grams of one length) and combined
(§5.4: an equal top-t for every n <= m).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np

from datastore.admin.catalog import datastore_stats
from datastore.admin.writer import DatastoreWriter
from datastore.connection import connect, one_row
from datastore.errors import DatastoreNotFound
from datastore.keys import encode_keys
from ingest.build import BuildConfig, build_datastore
from ingest.ranking import RankingCache, stream_digest
from toolkit.tokenizer import tokenizer_fingerprint

from .corpus import StudyCorpus


@dataclass(frozen=True)
class CrestPoint:
    """One CREST datastore of the grid.

    Attributes:
        ns: the n-gram lengths kept (one for single n, ``1..m`` for combined).
        top_t: n-grams kept per n.
    """

    ns: tuple[int, ...]
    top_t: int

    @property
    def method(self) -> str:
        """``crest-single`` or ``crest-combined``."""
        return "crest-single" if len(self.ns) == 1 else "crest-combined"

    @property
    def label(self) -> str:
        """E.g. ``n=3 t=16K`` or ``n<=5 t=16K``."""
        n = f"n={self.ns[0]}" if len(self.ns) == 1 else f"n<={max(self.ns)}"
        return f"{n} t={_short(self.top_t)}"


def _short(x: int) -> str:
    for div, suffix in ((1_000_000, "M"), (1_000, "K")):
        if x >= div and x % div == 0:
            return f"{x // div}{suffix}"
    return str(x)


@dataclass(frozen=True)
class FullBuild:
    """The build every grid point is cut from.

    Attributes:
        name: its datastore name. table: its tree table. key_width: bytes per key token.
        top_t / max_n: its selection. ranking: the cached ranking (kept n-grams, tree sizes).
        seconds: build time (0 when reused).
    """

    name: str
    table: str
    key_width: int
    top_t: int
    max_n: int
    ranking: RankingCache
    seconds: float
    _loaded: dict = field(default_factory=dict, repr=False, compare=False)

    def kept(self, n: int):
        """The ranking's kept ``n``-grams (:class:`ingest.counting.KeptNgrams`) and ``[t]`` tree sizes,
        read from disk once per build: ``(kept or None, sizes or None)``."""
        if n not in self._loaded:
            self._loaded[n] = (self.ranking.kept(n), self.ranking.nodes(n))
        return self._loaded[n]


@dataclass(frozen=True)
class Materialized:
    """A grid point turned into a datastore.

    Attributes:
        name: datastore name. ngrams: rows. bytes: table + TOAST + hash index, bytes.
        per_n: n -> (n-grams kept, mean tree nodes). seconds: copy + index time.
        effective: n -> rows actually kept (below ``top_t`` once an n runs out of n-grams).
    """

    name: str
    ngrams: int
    bytes: int
    per_n: dict[int, tuple[int, float]]
    seconds: float
    effective: tuple[int, ...]


def full_build(corpus: StudyCorpus, top_t: int, max_n: int, *, url: str, tokenizer, tokenizer_spec: str,
               depth: int = 10, tree_budget: int = 64, prefix: str = "study", progress: bool = True) -> FullBuild:
    """The corpus's CREST build at ``top_t`` for every n <= ``max_n``, built once and then reused.

    It is named ``<prefix>-<corpus>-full`` and reused while the database still serves it and it
    was made from the same stream with a top-t, ``max_n``, depth and tree budget covering the request.

    Raises:
        datastore.connection.DatabaseUnavailable: when Postgres is unreachable.
    """
    name = f"{prefix}-{corpus.name}-full"
    digest = stream_digest(corpus.tokenized.path)
    manifest = corpus.dir / "crest-full.json"
    ranking_dir = corpus.dir / "ranking"
    want = {"digest": digest, "depth": depth, "tree_budget": tree_budget,
            "fingerprint": tokenizer_fingerprint(tokenizer), "url": url}
    if manifest.exists():
        m = json.loads(manifest.read_text())
        if all(m.get(k) == v for k, v in want.items()) and m["top_t"] >= top_t and m["max_n"] >= max_n:
            try:
                stats = datastore_stats(url, name)
            except DatastoreNotFound:
                stats = None
            if stats is not None and stats["id"] == m["build_id"]:
                return FullBuild(name, stats["table"], m["key_width"], m["top_t"], m["max_n"],
                                 RankingCache(ranking_dir, digest), 0.0)
    t0 = time.perf_counter()
    config = BuildConfig(name=name, top_t=top_t, max_n=max_n, depth=depth, tree_budget=tree_budget,
                         tokenizer=tokenizer_spec, database_url=url, ranking_dir=ranking_dir,
                         workdir=corpus.dir)
    result = build_datastore(config, progress=progress, corpus=corpus.tokenized)
    stats = datastore_stats(url, name)
    with connect(url) as conn:
        width = one_row(conn, "SELECT key_width FROM datastores WHERE id = %s", [result.build_id])[0]
    manifest.write_text(json.dumps(want | {"top_t": top_t, "max_n": max_n, "build_id": result.build_id,
                                           "key_width": width}))
    return FullBuild(name, stats["table"], width, top_t, max_n, RankingCache(ranking_dir, digest),
                     time.perf_counter() - t0)


def effective_sizes(full: FullBuild, point: CrestPoint) -> tuple[int, ...]:
    """Rows per n the point keeps: ``min(top_t, n-grams of that n in the full build)``.

    Raises:
        ValueError: when the point asks for more than the full build holds.
    """
    out = []
    for n in point.ns:
        kept, _ = full.kept(n)
        if kept is None or n > full.max_n:
            raise ValueError(f"the full build has no {n}-grams (max_n={full.max_n})")
        if point.top_t > full.top_t and len(kept) >= full.top_t:
            raise ValueError(f"top-t {point.top_t} exceeds the full build's {full.top_t}")
        out.append(min(point.top_t, len(kept), full.top_t))
    return tuple(out)


def materialize(full: FullBuild, point: CrestPoint, name: str, *, url: str, tokenizer_spec: str,
                fingerprint: str) -> Materialized:
    """Make ``point`` the ready datastore ``name`` (replacing its previous build) and measure it.

    Raises:
        ValueError: when the point is outside the full build.
        datastore.admin.writer.BuildConflict: when another build of ``name`` is running.
    """
    t0 = time.perf_counter()
    sizes = effective_sizes(full, point)
    keys: list[bytes] = []
    per_n: dict[int, tuple[int, float]] = {}
    for n, k in zip(point.ns, sizes):
        kept, nodes = full.kept(n)
        keys += encode_keys(kept.ngrams[:k], full.key_width)
        per_n[n] = (k, float(np.mean(nodes[:k])) if nodes is not None and k else float("nan"))
    params = {"top_t": point.top_t, "ns": list(point.ns), "derived_from": full.name}
    writer = DatastoreWriter.begin(url, name, tokenizer=tokenizer_spec, tokenizer_fingerprint=fingerprint,
                                   key_width=full.key_width, corpus={"derived_from": full.name}, params=params)
    with writer:
        copied = writer.copy_from(full.table, keys)
        if copied != len(keys):
            raise RuntimeError(f"{full.name} lacks {len(keys) - copied} of the point's n-grams: rebuild it")
        stats = {str(n): {"kept": k, "nodes": int(round(m * k)) if k and m == m else 0}  # m != m: NaN, unknown
                 for n, (k, m) in per_n.items()}
        size, _ = writer.finish(ngram_stats=stats, num_tokens=0, timings={})
    return Materialized(name, copied, size, per_n, time.perf_counter() - t0, sizes)

