"""``python -m ingest build --engine spark``: the CREST build as one Spark job, loaded by the same writer.

Stages (each timed in the build's record; nothing is visible before the swap, so a failed or killed job leaves the
previous build serving):

- tokenize: read the source as a DataFrame, validate and tokenize each record in Arrow UDFs
  (:mod:`ingest.spark.records`), dedupe by digest, apply ``--limit``; malformed records are counted by reason;
- count: partial counts per partition (:func:`ingest.spark.kernels.partial_counts`), summed by ``(n, key)``; each n's
  top-t rows are selected on the driver (:mod:`ingest.spark.selection`);
- trees: the selection is broadcast; each partition emits the continuations of kept n-grams grouped by ``(n, bucket)``;
  each bucket's trees are built and encoded by the single-node builder and codec
  (:func:`ingest.spark.kernels.bucket_trees`) and written as Parquet (key, tree);
- load and index: binary COPY over parallel connections (:meth:`datastore.admin.writer.DatastoreWriter.load_parquet`),
  then ANALYZE, the hash index and the atomic swap (:meth:`datastore.admin.writer.DatastoreWriter.finish`).
"""

from __future__ import annotations

import functools
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds

from datastore.admin.writer import DatastoreWriter
from datastore.connection import resolve_database_url
from datastore.keys import key_width_for
from toolkit.tokenizer import load_tokenizer, tokenizer_fingerprint

from ..config import BuildConfig, BuildResult
from ..occurrences import partition_plan
from ..sources import resolve_paths
from ..tokens import check_corpus
from .kernels import (
    COUNT_DDL,
    HISTOGRAM_DDL,
    OCCURRENCE_DDL,
    TREE_DDL,
    KeptSet,
    bucket_trees,
    count_candidates,
    count_histogram,
    gather_occurrences,
    merge_counts,
    partial_counts,
    unpack_counts,
)
from .records import RECORD_DDL, parse_records
from .selection import select, thresholds
from .session import spark_session
from .sources import read_records

_TARGET_PARTITION_BYTES = 32 << 20  # source bytes per partition of a one-split source
_TOKENS_PER_REDUCER = 4_000_000  # corpus tokens per count reducer (bounds a reducer's distinct n-grams)


def _order_le(cut: tuple[int, int, int]):
    """Column: the row's (o1, o2, o3) is at or before ``cut``."""
    from pyspark.sql import functions as F

    a, b, c = (F.lit(int(v)) for v in cut)
    o1, o2, o3 = F.col("o1"), F.col("o2"), F.col("o3")
    return (o1 < a) | ((o1 == a) & (o2 < b)) | ((o1 == a) & (o2 == b) & (o3 <= c))


def _say(progress: bool, message: str) -> None:
    if progress:
        print(f"spark: {message}", file=sys.stderr, flush=True)


def _documents(spark, config, tokenizer_spec: str, partitions: int):
    """Tokenized documents (one ``ids`` column, persisted), their totals and the source report."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    paths = resolve_paths(config.source, config.path)
    records = read_records(spark, config.source, paths, glob=config.glob, text_field=config.text_field,
                           partitions=partitions, chat_field=config.chat_field)
    parse = functools.partial(parse_records, source=config.source, tokenizer_spec=tokenizer_spec,
                              text_field=config.text_field)
    parsed = records.mapInArrow(parse, RECORD_DDL).persist(StorageLevel.MEMORY_AND_DISK)
    valid = parsed.where(F.col("ids").isNotNull())
    docs = valid
    if config.source != "sharegpt":  # the single-node reader dedupes these sources, keeping the first
        first = Window.partitionBy("digest").orderBy("o1", "o2", "o3")
        docs = valid.withColumn("_rank", F.row_number().over(first)).where(F.col("_rank") == 1).drop("_rank")
    seen = F.lit(True)
    if config.limit is not None:
        docs = docs.orderBy("o1", "o2", "o3").limit(config.limit)
        last = docs.agg(F.max(F.struct("o1", "o2", "o3")).alias("m")).collect()[0]["m"]
        if last is not None:  # the single-node reader stops at the limit: count only what it read
            seen = _order_le((last["o1"], last["o2"], last["o3"]))
        docs = docs.repartition(partitions)  # a global limit leaves one partition
    docs = docs.select("ids").persist(StorageLevel.MEMORY_AND_DISK)
    row = docs.agg(F.count("*").alias("docs"), F.sum(F.size("ids")).alias("tokens"),
                   F.max(F.array_max("ids")).alias("top")).collect()[0]
    malformed = Counter({r["reason"]: int(r["count"]) for r in
                         parsed.where(F.col("reason").isNotNull() & seen).groupBy("reason").count().collect()})
    read = parsed.where(F.col("ids").isNotNull() & seen).count()
    notes = [r["note"] for r in parsed.where(F.col("note").isNotNull() & seen).orderBy("o1", "o3").collect()]
    parsed.unpersist()
    num_docs = int(row["docs"])
    report = {"source": config.source, "path": ":".join(map(str, paths)), "documents": num_docs,
              "malformed": dict(malformed), "duplicates": int(read - num_docs) if config.source != "sharegpt" else 0,
              "notes": notes}
    return docs, num_docs, int(row["tokens"] or 0), int(row["top"] if row["top"] is not None else -1), report


def _select(spark, docs, config, reducers: int) -> tuple[dict, dict]:
    """Count every n and keep the top-t: ``({n: KeptNgrams}, ngram_stats)``."""
    from pyspark import StorageLevel

    partial = functools.partial(partial_counts, max_n=config.max_n, reducers=reducers)
    counts = (docs.mapInArrow(partial, COUNT_DDL).groupBy("n", "reducer").applyInArrow(merge_counts, COUNT_DDL)
              .persist(StorageLevel.MEMORY_AND_DISK))
    histogram = [(r["n"], r["c"], r["k"]) for r in
                 counts.mapInArrow(count_histogram, HISTOGRAM_DDL).groupBy("n", "c").sum("k")
                 .withColumnRenamed("sum(k)", "k").collect()]
    stats = thresholds(histogram, config.top_t, config.min_count)
    minimum = {n: s.threshold for n, s in stats.items() if s.threshold is not None}
    candidates = counts.mapInArrow(functools.partial(count_candidates, minimum=minimum), COUNT_DDL).toArrow()
    counts.unpersist()
    kept_by_n, ngram_stats = {}, {}
    n_col = candidates.column("n").to_numpy()
    for n in minimum:
        ngrams, cs = unpack_counts(candidates.take(np.flatnonzero(n_col == n)), n)
        kept_by_n[n] = select(n, ngrams, cs, stats[n], config.top_t)
    for n in range(1, config.max_n + 1):
        s, kept = stats.get(n), kept_by_n.get(n)
        ngram_stats[str(n)] = {"kept": 0 if kept is None else len(kept), "distinct": 0 if s is None else s.distinct,
                               "occurrences": 0 if s is None else s.occurrences,
                               "min_kept_count": int(kept.counts[-1]) if kept is not None and len(kept) else 0}
    return kept_by_n, ngram_stats


def _trees(spark, docs, kept_set: KeptSet, out: Path) -> None:
    """Build every kept n-gram's tree and write ``(key, tree, n, nodes)`` Parquet files under ``out``."""
    shared = spark.sparkContext.broadcast(kept_set)
    token = time.monotonic_ns()  # names this selection in the workers' index cache

    def gather(batches):
        return gather_occurrences(batches, shared.value, token)

    def build(table):
        return bucket_trees(table, shared.value)

    occurrences = docs.mapInArrow(gather, OCCURRENCE_DDL)
    occurrences.groupBy("n", "bucket").applyInArrow(build, TREE_DDL).write.mode("overwrite").parquet(str(out))
    shared.unpersist()


def _load(writer: DatastoreWriter, out: Path, cores: int, ngram_stats: dict) -> list[Path]:
    """COPY the trees' Parquet files under ``out`` into the build; record each n's stored nodes. Returns the files."""
    files = sorted(out.glob("*.parquet"))
    writer.load_parquet(files, connections=max(1, min(cores, 8)))
    nodes = ds.dataset([str(f) for f in files], format="parquet").to_table(columns=["n", "nodes"])
    per_n = nodes.group_by("n").aggregate([("nodes", "sum")]).to_pydict()
    for n, total in zip(per_n["n"], per_n["nodes_sum"]):
        ngram_stats[str(n)]["nodes"] = int(total)
    for stats in ngram_stats.values():
        stats.setdefault("nodes", 0)
    return files


def build_with_spark(config: BuildConfig, progress: bool = True) -> BuildResult:
    """Run the build of ``config`` (an :class:`ingest.config.BuildConfig`) on Spark.

    Same contract as :func:`ingest.build.build_datastore`, whose rows it reproduces exactly.

    Raises:
        ingest.spark.session.SparkUnavailable: when pyspark or Java 17+ is missing.
        ingest.errors.SourceError: when the corpus cannot be read.
        datastore.errors.BuildConflict / DatabaseUnavailable: as the single-node build.
        ValueError: when the corpus yields no tokens or the vocabulary exceeds 2**31 - 1 ids.
    """

    timings: dict[str, float] = {}
    started = time.perf_counter()
    resolve_paths(config.source, config.path)  # a missing or wrong path is refused before anything starts
    url = resolve_database_url(config.database_url)
    tokenizer = load_tokenizer(config.tokenizer)
    if len(tokenizer) >= 2**31:
        raise ValueError(f"--engine spark carries token ids as int32; {config.tokenizer} has {len(tokenizer):,} ids")
    width = key_width_for(len(tokenizer))
    # the name is locked (and the build registered) before the corpus is read: a second build fails at once
    writer = DatastoreWriter.begin(url, config.name, tokenizer=config.tokenizer,
                                   tokenizer_fingerprint=tokenizer_fingerprint(tokenizer), key_width=width, corpus={},
                                   params=config.params() | {"vocab_size": len(tokenizer)})
    with writer, tempfile.TemporaryDirectory(prefix="crest-spark-", dir=config.workdir) as tmp, \
            spark_session(config.spark_master, dict(config.spark_conf), Path(tmp)) as spark:
        cores = spark.sparkContext.defaultParallelism
        size = sum(p.stat().st_size for p in resolve_paths(config.source, config.path) if p.is_file())
        partitions = max(4 * cores, -(-size // _TARGET_PARTITION_BYTES))
        t0 = time.perf_counter()
        docs, num_docs, num_tokens, max_token, report = _documents(spark, config, config.tokenizer, partitions)
        timings["tokenize"] = time.perf_counter() - t0
        _say(progress, f"tokenize {timings['tokenize']:.1f} s: {num_docs:,} documents, {num_tokens:,} tokens "
                       f"({partitions} partitions on {cores} cores)")
        check_corpus(num_tokens, max_token, len(tokenizer), report)
        recorded = report | {"tokens": num_tokens}
        t0 = time.perf_counter()
        reducers = max(2 * cores, -(-num_tokens // _TOKENS_PER_REDUCER))
        kept_by_n, ngram_stats = _select(spark, docs, config, reducers)
        timings["count"] = time.perf_counter() - t0
        _say(progress, f"count {timings['count']:.1f} s: kept " +
             ", ".join(f"n={n} {s['kept']:,}" for n, s in ngram_stats.items()))
        t0 = time.perf_counter()
        kept_set = KeptSet({n: k for n, k in kept_by_n.items() if len(k)},
                           {n: partition_plan(k, config.max_occurrences) for n, k in kept_by_n.items()},
                           config.depth, config.tree_budget, config.compression, width, max_token < 0xFFFF)
        out = Path(tmp) / "trees"
        _trees(spark, docs, kept_set, out)
        timings["trees"] = time.perf_counter() - t0
        _say(progress, f"trees {timings['trees']:.1f} s: {sum(kept_set.parts.values())} buckets")
        docs.unpersist()
        t0 = time.perf_counter()
        files = _load(writer, out, cores, ngram_stats)
        timings["load"] = time.perf_counter() - t0
        _say(progress, f"load {timings['load']:.1f} s: {writer.rows:,} rows from {len(files)} Parquet files")
        size, timings["index"] = writer.finish(ngram_stats=ngram_stats, num_tokens=num_tokens, corpus=recorded,
                                               timings={k: round(v, 3) for k, v in timings.items()})
    return BuildResult(config.name, writer.build_id, num_docs, num_tokens, writer.rows, size, ngram_stats,
                       {k: round(v, 3) for k, v in timings.items()}, round(time.perf_counter() - started, 3), recorded,
                       [p.describe() for p in writer.pending])
