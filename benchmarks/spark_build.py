"""The same build on both engines, in one run: seconds per stage, tokens/s, peak RSS, the Spark/DuckDB wall ratio, and
whether the two datastores hold identical rows (same keys, same blobs) and per-n statistics.

Each build runs alone, one after the other, as ``python -m ingest build --json --quiet`` in a child process
(so each Spark build starts its own JVM, as a user's would). Builds go to datastores named
``<name>-<engine>`` (``--name``, default ``bench``; dropped at the end unless ``--keep``).

    python -m benchmarks.spark_build [--masters local[2] local[1]] [--path FILE] [--limit N] [--top-t 2M] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import cast

import psycopg

from datastore.admin.catalog import drop_datastore
from datastore.connection import resolve_database_url

from ._child import run_sampled

REPO = Path(__file__).resolve().parents[1]
LOCAL_ONLY = ("digest", "packages", "contamination")
"""What only the single-node build records in its corpus report: the Spark engine runs no contamination screen
(docs/building.md), so its builds are refused for scoring."""


def builds(args) -> list[tuple[str, str, list[str]]]:
    """``(label, datastore, command line)`` of each build: DuckDB, then Spark on each master (``python -m ingest
    build`` in a child process)."""
    flags = (["--top-t", args.top_t] + (["--limit", args.limit] if args.limit else [])
             + (["--path", args.path] if args.path else []))
    runs = [("duckdb", ["--engine", "duckdb"])] + [(f"spark {m}", ["--engine", "spark", "--spark-master", m])
                                                   for m in args.masters]
    out = []
    for label, engine in runs:
        name = f"{args.name}-" + label.replace(" ", "-").replace("[", "").replace("]", "").replace("*", "all")
        out.append((label, name, [sys.executable, "-m", "ingest", "build", "--json", "--quiet", "--name", name,
                                  *flags, *engine]))
    return out


def _build(name: str, command: list[str]) -> tuple[dict, float, int, int]:
    """Run one build; returns its JSON summary, wall seconds, and the peak RSS (bytes) of the largest
    process and of the whole process tree (the JVM and Python workers included), sampled every 0.2 s."""
    out, wall, largest, tree = run_sampled(command, cwd=REPO)
    if out.returncode != 0:
        sys.exit(f"build {name} failed:\n{out.stderr[-4000:]}")
    if out.stderr.strip():
        print(f"  (stderr of {name}: {out.stderr.strip()[-500:]})")
    try:
        return json.loads(out.stdout), wall, largest, tree
    except json.JSONDecodeError:
        sys.exit(f"build {name} printed more than its JSON summary:\n{out.stdout[:2000]}")


def _one_row(cur: psycopg.Cursor) -> tuple:
    """The row a query returns; exits when there is none."""
    row = cur.fetchone()
    if row is None:
        raise SystemExit("a query returned no row")
    return row


def _compare(url: str, a: int, b: int) -> tuple[int, int, int, int]:
    """(only in a, only in b, blobs that differ, rows) between two builds' tables."""
    with psycopg.connect(url) as conn:
        tables = {i: _one_row(conn.execute("SELECT trees_table FROM datastores WHERE id = %s", [i]))[0]
                  for i in (a, b)}
        return cast(tuple[int, int, int, int], _one_row(conn.execute(
            f"SELECT count(*) FILTER (WHERE y.key IS NULL), count(*) FILTER (WHERE x.key IS NULL), "
            f'count(*) FILTER (WHERE x.tree <> y.tree), count(*) '
            f'FROM "{tables[a]}" x FULL JOIN "{tables[b]}" y USING (key)'
        )))


def _shared(report: dict) -> dict:
    """A corpus report without what only the single-node engine records (:data:`LOCAL_ONLY`)."""
    return {k: v for k, v in report.items() if k not in LOCAL_ONLY}


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--masters", nargs="+", default=["local[2]"], help="Spark masters to time (default: local[2]).")
    p.add_argument("--path", default=None, help="ShareGPT JSON to build from (default: the packaged corpus).")
    p.add_argument("--limit", default=None, help="documents to read (default: all).")
    p.add_argument("--top-t", default="2M", help="n-grams kept per n (default: 2M).")
    p.add_argument("--keep", action="store_true", help="keep the datastores built.")
    p.add_argument("--name", default="bench",
                   help="the datastores' name prefix: NAME-duckdb, NAME-spark-local2 ... (default: bench).")
    return p


def main() -> None:
    args = build_parser().parse_args()
    url = resolve_database_url(None)
    os.environ["DATABASE_URL"] = url
    results = {}
    runs = builds(args)
    try:
        for label, name, command in runs:
            r, wall, largest, tree = _build(name, command)
            results[label] = (name, r, wall)
            stages = ", ".join(f"{k} {v:.1f}" for k, v in r["timings"].items())
            print(f"{label:<16} wall {wall:7.1f} s  {r['tokens'] / wall:9,.0f} tokens/s  peak RSS largest process "
                  f"{largest / 2**30:.2f} GiB, process tree {tree / 2**30:.2f} GiB  stages (s): {stages}")
        base_name, base, base_wall = results["duckdb"]
        print(
            f"\ncorpus: {base['documents']:,} documents, {base['tokens']:,} tokens; {base['ngrams']:,} n-grams stored")
        for label, (_, r, wall) in results.items():
            if label == "duckdb":
                continue
            only_duck, only_spark, differ, rows = _compare(url, base["build_id"], r["build_id"])
            same_stats = r["ngram_stats"] == base["ngram_stats"] and _shared(r["corpus"]) == _shared(base["corpus"])
            print(f"{label}: {wall / base_wall:.2f}x the DuckDB wall time; rows {rows:,}: only DuckDB {only_duck}, "
                  f"only Spark {only_spark}, blobs differing {differ}; per-n stats and report identical: {same_stats}")
    finally:
        if not args.keep:
            for name, _, _ in results.values():
                drop_datastore(url, name)


if __name__ == "__main__":
    main()
