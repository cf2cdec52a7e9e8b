"""``python -m datastore {list,stats,drop}``: inspect and manage stored datastores."""

from __future__ import annotations

import argparse
import json
import sys

from .catalog import datastore_stats, drop_datastore, list_datastores
from .client import DatastoreNotFound
from .connection import DatabaseUnavailable, resolve_database_url
from .writer import BuildConflict

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m datastore", description=__doc__)
    p.add_argument("--database-url", default=None,
                   help="libpq URL (default: $DATABASE_URL, else the embedded Postgres)")
    sub = p.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="list datastores")
    ls.add_argument("--all", action="store_true", help="include building, failed and retired builds")
    ls.add_argument("--json", action="store_true", help="print JSON")
    st = sub.add_parser("stats", help="per-n counts, rows, bytes on disk, bytes per n-gram, mean tree size")
    st.add_argument("--name", required=True, help="datastore name")
    st.add_argument("--json", action="store_true", help="print JSON")
    dr = sub.add_parser("drop", help="drop every build of a datastore and its tables")
    dr.add_argument("name", help="datastore name")
    return p


def _table(title: str, rows: list[tuple[str, str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, show_header=False)
    for label, value in rows:
        t.add_row(label, value)
    Console().print(t)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (0 ok, 1 not found or unavailable, 2 usage)."""
    args = _parser().parse_args(argv)
    try:
        url = resolve_database_url(args.database_url)
        if args.command == "list":
            items = list_datastores(url, args.all)
            if args.json:
                print(json.dumps(items, default=str, indent=2))
            else:
                for d in items:
                    size = f"{d['bytes_on_disk']:,} B" if d["bytes_on_disk"] else "-"
                    print(f"{d['name']:<24} build {d['id']:<5} {d['state']:<9} {d['ngrams']:>12,} n-grams  {size:>16}"
                          + (f"  ({d['error']})" if d["error"] else ""))
                if not items:
                    print("no datastores; build one with `python -m ingest build`")
        elif args.command == "stats":
            s = datastore_stats(url, args.name)
            if args.json:
                print(json.dumps(s, default=str, indent=2))
            else:
                rows = [("datastore", f"{s['name']} (build {s['id']}, table {s['table']})"),
                        ("tokenizer", s["tokenizer"]), ("corpus tokens", f"{s['tokens']:,}"),
                        ("rows", f"{s['rows']:,}"), ("bytes table", f"{s['bytes_table']:,}"),
                        ("bytes index", f"{s['bytes_index']:,}"), ("bytes total", f"{s['bytes_total']:,}"),
                        ("bytes per n-gram", f"{s['bytes_per_ngram']:.1f}"),
                        ("mean tree nodes", f"{s['mean_tree_nodes']:.1f}")]
                for n, v in s["per_n"].items():
                    rows.append((f"n={n}", f"{v['rows']:,} rows of {v['distinct_in_corpus'] or 0:,} distinct, "
                                           f"min count {v['min_kept_count']}, {v['mean_tree_nodes']:.1f} nodes, "
                                           f"{v['mean_blob_bytes']:.1f} B/blob"))
                _table("datastore stats", rows)
        else:
            count = drop_datastore(url, args.name)
            print(f"dropped {count} build(s) of {args.name!r}")
    except (DatastoreNotFound, DatabaseUnavailable, BuildConflict) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
