"""The build pipeline: corpus -> token stream -> top-t n-grams -> token trees -> Postgres.

Stages (timed, in seconds, and stored with the build):
    tokenize  read the source and tokenize it into the on-disk token stream
    count     exact n-gram counts and the top-t of every n (DuckDB), before any tree is built,
              so the tree stage knows its total from the start
    tag       find the occurrences of the kept n-grams (one n at a time, while the workers
              build the previous n's trees)
    trees     build the pruned continuation trees (worker processes, summed)
    encode    codec blobs, zstd by default (worker processes, summed)
    screen    the contamination screen: the stream against the evaluation sets (:mod:`ingest.contamination`),
              recorded with the build's corpus
    load      binary COPY into the build's table
    index     ANALYZE, the hash index and the swap (``DatastoreWriter.finish``)
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from datastore.admin.writer import DatastoreWriter
from datastore.connection import resolve_database_url
from datastore.keys import encode_keys, key_width_for
from toolkit.children import exit_with_parent
from toolkit.tokenizer import load_tokenizer, tokenizer_fingerprint

from .config import BuildConfig, BuildResult
from .contamination import screen_corpus
from .counting import KeptNgrams, count_top_t
from .occurrences import partition_plan, tag_occurrences
from .ranking import RankingCache, stream_digest
from .sources import SourceReport, iter_documents, resolve_paths
from .tokens import TokenStreamWriter, check_corpus, open_stream
from .workers import TreeJob, run_tree_job

__all__ = ["BuildConfig", "TokenizedCorpus", "build_datastore", "tokenize_corpus"]


@dataclass(frozen=True)
class TokenizedCorpus:
    """A corpus already tokenized into a stream file (see :mod:`ingest.tokens`).

    Attributes:
        path: the stream file. num_documents / num_tokens: documents and tokens in it
        (separators excluded). max_token: largest token id. report: the source report
        (:meth:`ingest.sources.SourceReport.as_dict`).
        tokenizer: ``(fingerprint, vocabulary size)`` of the tokenizer ``config.tokenizer`` names, when the caller knows
        them (a live layer's compaction reads them off its datastore's build): the build then does not load it.
    """

    path: Path
    num_documents: int
    num_tokens: int
    max_token: int
    report: dict
    tokenizer: tuple[str, int] | None = None


def tokenize_corpus(config: BuildConfig, tokenizer, stream_path: Path, progress: bool = True) -> TokenizedCorpus:
    """Tokenize ``config``'s corpus into ``stream_path`` (see :func:`tokenize_source`).

    Raises:
        ingest.errors.SourceError: when the corpus cannot be read.
    """
    report, info = tokenize_source(config, tokenizer, stream_path, progress)
    return TokenizedCorpus(Path(stream_path), info.num_documents, info.num_tokens, info.max_token, report.as_dict())


def tokenize_source(config: BuildConfig, tokenizer, stream_path: Path,
                    progress: bool = True) -> tuple[SourceReport, TokenStreamWriter]:
    """Stream the source through the tokenizer into ``stream_path`` (the documents' names beside it,
    :func:`ingest.tokens.names_path`); returns the report and the closed writer."""
    report, batches = iter_documents(config.source, config.path, tokenizer=tokenizer, limit=config.limit,
                                     glob=config.glob, text_field=config.text_field, chat_field=config.chat_field)
    backend = tokenizer.backend_tokenizer
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    with TokenStreamWriter(stream_path, with_names=True) as writer, \
            tqdm(desc="tokenize", unit=" docs", disable=not progress) as bar:
        for batch in batches:
            texts = batch.column("text").to_pylist()
            encodings = encode(texts, add_special_tokens=False)
            writer.write([np.asarray(e.ids, dtype=np.uint32) for e in encodings], batch.column("name").to_pylist())
            bar.update(len(texts))
            bar.set_postfix(tokens=f"{writer.num_tokens:,}")
    return report, writer


def build_datastore(config: BuildConfig, progress: bool = True, corpus: TokenizedCorpus | None = None) -> BuildResult:
    """Run the whole pipeline and make the new build the ready datastore ``config.name``.

    ``corpus``: a stream tokenized earlier with the same tokenizer (the tokenize stage is then
    skipped and ``config``'s source fields are ignored); ``None`` tokenizes ``config``'s source.

    Raises:
        ingest.errors.SourceError: when the corpus cannot be read.
        datastore.errors.BuildConflict: when a build of the same name is running.
        datastore.errors.DatabaseUnavailable: when Postgres is unreachable.
        ingest.spark.SparkUnavailable: with ``engine="spark"`` where pyspark or Java 17+ is missing.
        ValueError: when the corpus yields no tokens.
    """
    if config.engine == "spark":
        if corpus is not None:
            raise ValueError("--engine spark reads its source itself; a pre-tokenized corpus needs --engine duckdb")
        from .spark import build_with_spark

        return build_with_spark(config, progress)
    timings: dict[str, float] = defaultdict(float)
    started = time.perf_counter()
    if corpus is None:
        resolve_paths(config.source, config.path)  # a missing or wrong path is refused before anything starts
    url = resolve_database_url(config.database_url)
    tokenizer, fingerprint, vocab_size = _tokenizer_of(config, corpus)
    width = key_width_for(vocab_size)
    # the name is locked (and the build registered) before the corpus is read: a second build fails at once
    writer = DatastoreWriter.begin(url, config.name, tokenizer=config.tokenizer, tokenizer_fingerprint=fingerprint,
                                   key_width=width, corpus={} if corpus is None else corpus.report,
                                   params=config.params() | {"vocab_size": vocab_size})
    with writer, tempfile.TemporaryDirectory(prefix="crest-build-", dir=config.workdir) as tmp:
        work = Path(tmp)
        if corpus is None:
            t0 = time.perf_counter()
            corpus = tokenize_corpus(config, tokenizer, work / "tokens.u32", progress)
            timings["tokenize"] = time.perf_counter() - t0
        check_corpus(corpus.num_tokens, corpus.max_token, vocab_size, corpus.report)
        stream = open_stream(corpus.path)
        ranking = None if config.ranking_dir is None else RankingCache(config.ranking_dir, stream_digest(corpus.path))
        recorded = corpus.report | {"tokens": corpus.num_tokens}
        if config.screen:
            t0 = time.perf_counter()
            screened = tokenizer if tokenizer is not None else load_tokenizer(config.tokenizer)
            recorded["contamination"] = screen_corpus(corpus.path, screened)
            timings["screen"] = time.perf_counter() - t0
        ngram_stats: dict[str, dict] = {}
        nodes = _count_and_build(stream, corpus.path, work, config, width, writer, timings, ngram_stats,
                                 ranking, progress)
        for n, count in nodes.items():
            ngram_stats[str(n)]["nodes"] = count
        size, timings["index"] = writer.finish(ngram_stats=ngram_stats, num_tokens=corpus.num_tokens,
                                               timings={k: round(v, 3) for k, v in timings.items()},
                                               corpus=recorded)
        del stream
    return BuildResult(config.name, writer.build_id, corpus.num_documents, corpus.num_tokens, writer.rows, size,
                       ngram_stats, {k: round(v, 3) for k, v in timings.items()},
                       round(time.perf_counter() - started, 3), recorded,
                       [p.describe() for p in writer.pending])


def _tokenizer_of(config: BuildConfig, corpus: TokenizedCorpus | None):
    """``(tokenizer or None, fingerprint, vocabulary size)``: not loaded where ``corpus`` already names the last two."""
    if corpus is not None and corpus.tokenizer is not None:
        return None, *corpus.tokenizer
    tokenizer = load_tokenizer(config.tokenizer)
    return tokenizer, tokenizer_fingerprint(tokenizer), len(tokenizer)


def _select(stream, work: Path, config: BuildConfig, ranking: RankingCache | None, timings: dict,
            ngram_stats: dict, progress: bool) -> dict[int, KeptNgrams]:
    """Count and select the top-t of every n (or take them from ``ranking``), recording their stats."""
    kept_by_n: dict[int, KeptNgrams] = {}
    for n in tqdm(range(1, config.max_n + 1), desc="count", unit=" n", disable=not progress):
        t = time.perf_counter()
        kept = None if ranking is None else ranking.load(n, config.top_t, config.min_count)
        if kept is None:
            kept = count_top_t(stream, n, config.top_t, config.min_count, work, config.memory_limit)
            if ranking is not None:
                ranking.save(kept, config.min_count)
        timings["count"] += time.perf_counter() - t
        ngram_stats[str(n)] = {"kept": len(kept), "distinct": kept.distinct, "occurrences": kept.occurrences,
                               "min_kept_count": int(kept.counts[-1]) if len(kept) else 0}
        kept_by_n[n] = kept
    return kept_by_n


class _Copier:
    """The consumer thread that COPYs finished tree partitions in the order they were submitted.

    The writer's connection is used by this thread until :meth:`close` has drained it (after the main thread failed,
    :meth:`abandon` first makes it cancel what is left unwritten); :meth:`raise_failure` re-raises its first error.
    """

    def __init__(self, writer: DatastoreWriter, timings: dict, sizes: dict[int, np.ndarray], bar) -> None:
        self.nodes: dict[int, int] = defaultdict(int)
        self._writer, self._timings, self._sizes, self._bar = writer, timings, sizes, bar
        self._pending: queue.Queue = queue.Queue()
        self._failure: list[BaseException] = []  # the first error of the consumer, re-raised by close()
        self._stop = threading.Event()  # set when the main thread fails: the consumer drains without writing
        self._thread = threading.Thread(target=self._consume, name="copy", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> bool:
        return bool(self._failure)

    def put(self, future, keys: list[bytes]) -> None:
        self._pending.put((future, keys))

    def abandon(self) -> None:
        self._stop.set()

    def close(self) -> None:
        """Wait until everything put is written or cancelled."""
        self._pending.put(None)
        self._thread.join()

    def raise_failure(self) -> None:
        """Re-raise the consumer's first error, if it had one."""
        if self._failure:
            raise self._failure[0]

    def _consume(self) -> None:
        while (item := self._pending.get()) is not None:
            future, keys = item
            if self._failure or self._stop.is_set():
                future.cancel()
                continue
            try:
                self._write(future.result(), keys)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which re-raises it
                self._failure.append(exc)

    def _write(self, res, keys: list[bytes]) -> None:
        t = time.perf_counter()
        self._writer.write([keys[i] for i in res.tree_index.tolist()], res.blobs)
        self._timings["load"] += time.perf_counter() - t
        self._timings["trees"] += res.build_seconds
        self._timings["encode"] += res.encode_seconds
        self.nodes[res.n] += res.nodes
        self._sizes[res.n][res.tree_index] = res.sizes
        self._bar.update(len(res.tree_index))


def _submit_trees(pool: ProcessPoolExecutor, copier: _Copier, stream, stream_path: Path, work: Path,
                  kept_by_n: dict[int, KeptNgrams], config: BuildConfig, width: int, timings: dict) -> None:
    """Tag each n's occurrences and hand its tree partitions to ``pool``, the next n tagged while they build."""
    for n, kept in kept_by_n.items():
        if copier.failed:
            return
        if len(kept) == 0:
            continue
        t = time.perf_counter()
        tags_path = work / f"tags_{n}.npy"
        tag_occurrences(stream, kept, tags_path)
        timings["tag"] += time.perf_counter() - t
        keys = encode_keys(kept.ngrams, width)
        parts = partition_plan(kept, config.max_occurrences)
        for p in range(parts):
            job = TreeJob(str(stream_path), str(tags_path), n, len(kept), parts, p,
                          kept.counts[p::parts], config.depth, config.tree_budget, config.compression)
            copier.put(pool.submit(run_tree_job, job), keys)


def _count_and_build(stream, stream_path: Path, work: Path, config: BuildConfig, width: int,
                     writer: DatastoreWriter, timings: dict, ngram_stats: dict, ranking: RankingCache | None,
                     progress: bool) -> dict[int, int]:
    """Select every n (:func:`_select`), then tag each n's occurrences and build its trees in worker
    processes while the next n is tagged; a consumer thread COPYs finished partitions in order.
    Returns nodes stored per n; with ``ranking``, also stores each tree's size there."""
    kept_by_n = _select(stream, work, config, ranking, timings, ngram_stats, progress)
    sizes = {n: np.zeros(len(kept), dtype=np.int32) for n, kept in kept_by_n.items()}
    bar = tqdm(total=sum(len(k) for k in kept_by_n.values()), desc="trees", unit=" trees", disable=not progress)
    copier = _Copier(writer, timings, sizes, bar)
    try:
        with ProcessPoolExecutor(max_workers=config.workers, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=exit_with_parent, initargs=(os.getpid(),)) as pool:
            try:
                _submit_trees(pool, copier, stream, stream_path, work, kept_by_n, config, width, timings)
            except BaseException:
                copier.abandon()
                pool.shutdown(wait=True, cancel_futures=True)  # queued jobs dropped, workers joined
                raise
    finally:
        # the writer's connection is used by the consumer: it must be idle before anyone aborts
        copier.close()
        bar.close()
    copier.raise_failure()
    if ranking is not None:
        for n, per_tree in sizes.items():
            ranking.save_nodes(n, per_tree)
    return dict(copier.nodes)


def summary_rows(result: BuildResult) -> list[tuple[str, str]]:
    """(label, value) rows of the end-of-build summary."""
    rows = [("datastore", f"{result.name} (build {result.build_id})"),
            ("documents", f"{result.num_documents:,}"), ("tokens", f"{result.num_tokens:,}"),
            ("n-grams stored", f"{result.num_trees:,}"), ("bytes on disk", f"{result.bytes_on_disk:,}"),
            ("bytes per n-gram", f"{result.bytes_per_ngram:.1f}")]
    for n, s in result.ngram_stats.items():
        rows.append((f"n={n}", f"kept {s['kept']:,} of {s['distinct']:,} (min count {s['min_kept_count']}), "
                               f"mean tree {s['nodes'] / max(s['kept'], 1):.1f} nodes"))
    rows += [(f"{stage} s", f"{sec:.1f}") for stage, sec in result.timings.items()]
    rate = result.num_tokens / max(result.wall_seconds, 1e-9)
    rows.append(("wall s", f"{result.wall_seconds:.1f}  ({rate:,.0f} tokens/s)"))
    rep = result.report
    rows.append(("malformed", ", ".join(f"{k}: {v}" for k, v in rep.get("malformed", {}).items()) or "none"))
    if rep.get("duplicates"):
        rows.append(("duplicates", f"{rep['duplicates']:,}"))
    rows += [("note", note) for note in rep.get("notes", [])]
    screen = rep.get("contamination") or {}
    for part, r in screen.get("parts", {}).items():
        rows.append((f"screen {part}", f"{r['contaminated']} of {r['items']} items contaminated (>= "
                                       f"{screen['threshold']:.0%} of their {screen['n']}-grams in the corpus); "
                                       f"{r['shared_any']} share any {screen['n']}-gram"))
    rows += [("not dropped yet", pending) for pending in result.pending_drops]
    return rows


def config_dict(config: BuildConfig) -> dict:
    """JSON-ready form of a config."""
    def plain(v):
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        return str(v) if isinstance(v, Path) else v
    return {k: plain(v) for k, v in asdict(config).items()}
