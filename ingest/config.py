"""What a build is asked (:class:`BuildConfig`) and what it produced (:class:`BuildResult`): the types both
engines share (:mod:`ingest.build`, :mod:`ingest.spark`), in a module of their own so neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from datastore.codec import Compression
from toolkit.tokenizer import DEFAULT_MODEL


@dataclass(frozen=True)
class BuildConfig:
    """Parameters of one build (see ``python -m ingest build --help``).

    Attributes:
        name: datastore name. source/path/limit/glob/text_field/chat_field: the corpus (see
            :func:`ingest.sources.iter_documents`; ``code`` and ``chat`` take several paths, ``chat``
            glob patterns too).
        top_t: n-grams kept per n (CREST combined top-t), >= 1.
        max_n: largest n (1..8). min_count: drop rarer n-grams.
        depth: continuation tokens per tree (1..32). tree_budget: nodes per tree (1..1024).
        tokenizer: model spec for the tokenizer. compression: zstd | lz4 | none.
        database_url: None -> DATABASE_URL -> embedded server.
        workdir: scratch space for the token stream and spills (a temp dir if None).
        max_occurrences: occurrences per tree-building partition (bounds each worker's memory).
        memory_limit: DuckDB's memory limit for counting.
        workers: tree-building worker processes (>= 1).
        ranking_dir: keep each n's ranking (and tree sizes) here and reuse it on a later build of
            the same token stream when only top-t changes (see :mod:`ingest.ranking`); ``None``: off.
        engine: ``duckdb`` (this machine: DuckDB counting, worker processes) or ``spark`` (one Spark
            job, :mod:`ingest.spark`); both store identical rows.
        spark_master: the Spark master URL (``local[*]``: every core here). spark_conf: extra Spark
            settings, ``(key, value)`` pairs (``spark-submit --conf``).
        screen: screen the corpus against the evaluation sets and record the result with the build
            (:mod:`ingest.contamination`; ``--engine duckdb`` only); a live layer's compaction, whose corpus is the
            model's own outputs, turns it off.
    """

    name: str = "sharegpt"
    source: str = "sharegpt"
    path: Path | tuple[Path, ...] | None = None
    limit: int | None = None
    glob: str = "**/*.py"
    text_field: str = "content"
    chat_field: str | None = None
    top_t: int = 2_000_000
    max_n: int = 5
    min_count: int = 1
    depth: int = 10
    tree_budget: int = 64
    tokenizer: str = DEFAULT_MODEL
    compression: Compression = "zstd"
    database_url: str | None = None
    workdir: Path | None = None
    max_occurrences: int = 4_000_000
    memory_limit: str = "4GB"
    workers: int = 2
    ranking_dir: Path | None = None
    engine: str = "duckdb"
    spark_master: str = "local[*]"
    spark_conf: tuple[tuple[str, str], ...] = ()
    screen: bool = True

    def __post_init__(self) -> None:
        checks = [(self.top_t >= 1, "--top-t must be >= 1"), (1 <= self.max_n <= 8, "--max-n must be in 1..8"),
                  (1 <= self.depth <= 32, "--depth must be in 1..32"),
                  (1 <= self.tree_budget <= 1024, "--tree-budget must be in 1..1024"),
                  (self.min_count >= 1, "--min-count must be >= 1"),
                  (self.limit is None or self.limit >= 1, "--limit must be >= 1"),
                  (self.compression in ("zstd", "lz4", "none"), "--compression must be zstd, lz4 or none"),
                  (self.workers >= 1, "--workers must be >= 1"),
                  (self.engine in ("duckdb", "spark"), "--engine must be duckdb or spark"),
                  (self.engine == "duckdb" or self.ranking_dir is None,
                   "--ranking-dir works with --engine duckdb only")]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def params(self) -> dict:
        """The parameters recorded with the build."""
        return {"top_t": self.top_t, "max_n": self.max_n, "min_count": self.min_count, "depth": self.depth,
                "tree_budget": self.tree_budget, "compression": self.compression, "limit": self.limit}


@dataclass
class BuildResult:
    """What a build produced (also printed as the summary table).

    ``timings`` are seconds per stage; trees and encode are summed over worker processes and
    overlap with counting and loading, so ``wall_seconds`` (start to ready, tokenizer load
    included) is the end-to-end figure. ``pending_drops``: the earlier builds' tables that left the registry
    but were still in use, so not dropped yet (what waits on what: :class:`datastore.admin.ddl.PendingDrop`).
    """

    name: str
    build_id: int
    num_documents: int
    num_tokens: int
    num_trees: int
    bytes_on_disk: int
    ngram_stats: dict
    timings: dict
    wall_seconds: float
    report: dict = field(default_factory=dict)
    pending_drops: list[str] = field(default_factory=list)

    @property
    def bytes_per_ngram(self) -> float:
        """Table + index bytes per stored n-gram."""
        return self.bytes_on_disk / max(self.num_trees, 1)
