"""``python -m datastore {list,stats,drop,migrate,grant-reader,grant-appender}``: inspect and manage stored datastores.

``list`` and ``stats`` only read. ``migrate`` brings the registry schema to the
revision this package reads (builds do it too); ``drop`` removes builds;
``grant-reader`` lets a least-privilege role look datastores up; ``grant-appender`` lets a decoder's role
append finished outputs to the live layer (``INSERT`` on ``live_outputs``, nothing else).
"""

from __future__ import annotations

import argparse
import json
import sys

from .errors import DatastoreError
from .options import database_options

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m datastore", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    db = [database_options()]
    ls = sub.add_parser("list", parents=db, help="list datastores")
    ls.add_argument("--all", action="store_true", help="include building, failed and retired builds")
    ls.add_argument("--json", action="store_true", help="print JSON")
    st = sub.add_parser("stats", parents=db, help="per-n counts, rows, bytes on disk, bytes per n-gram, mean tree size")
    st.add_argument("--name", required=True, help="datastore name")
    st.add_argument("--json", action="store_true", help="print JSON")
    dr = sub.add_parser("drop", parents=db, help="drop every build of a datastore and its tables")
    dr.add_argument("name", help="datastore name")
    mg = sub.add_parser("migrate", parents=db, help="bring the registry schema to this package's revision")
    mg.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 unless the database is at this package's revision and the models "
                         "match the migrations (alembic check)")
    gr = sub.add_parser("grant-reader", parents=db,
                        help="let a role look datastores up (SELECT only), now and after every rebuild")
    gr.add_argument("role", help="the Postgres role to grant")
    gr.add_argument("--name", default=None, help="only this datastore (default: every datastore, present and future)")
    gr.add_argument("--create", action="store_true", help="create the role (LOGIN, no password) if it does not exist")
    ga = sub.add_parser("grant-appender", parents=db,
                        help="let a decoder's role append finished outputs to the live layer (INSERT only)")
    ga.add_argument("role", help="the Postgres role to grant")
    ga.add_argument("--create", action="store_true", help="create the role (LOGIN, no password) if it does not exist")
    return p


def _table(title: str, rows: list[tuple[str, str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title, show_header=False)
    for label, value in rows:
        t.add_row(label, value)
    Console().print(t)


def _list(url: str, args) -> None:
    from .catalog import list_datastores

    items = list_datastores(url, args.all)
    if args.json:
        print(json.dumps(items, default=str, indent=2))
        return
    for d in items:
        size = f"{d['bytes_on_disk']:,} B" if d["bytes_on_disk"] else "-"
        print(f"{d['name']:<24} build {d['id']:<5} {d['state']:<9} {d['ngrams']:>12,} n-grams  {size:>16}"
              + (f"  ({d['error']})" if d["error"] else ""))
    if not items:
        print("no datastores; build one with `python -m ingest build`")


def _stats(url: str, args) -> None:
    from .catalog import datastore_stats

    s = datastore_stats(url, args.name)
    if args.json:
        print(json.dumps(s, default=str, indent=2))
        return
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


def _drop(url: str, args) -> None:
    from .catalog import drop_datastore

    print(f"dropped {drop_datastore(url, args.name)} build(s) of {args.name!r}")


def _migrate(url: str, args) -> None:
    from .connection import connect
    from .schema import SCHEMA_REVISION, check_models, require_schema, schema_revision, upgrade

    if args.check:
        with connect(url) as conn:
            require_schema(conn)
        check_models(url)
        print(f"registry schema is at revision {SCHEMA_REVISION} and matches the models")
        return
    with connect(url) as conn:
        before = schema_revision(conn)
    upgrade(url)
    print(f"registry schema is already at revision {SCHEMA_REVISION}" if before == SCHEMA_REVISION
          else f"registry schema: {before or 'none'} -> {SCHEMA_REVISION}")


def _grant(url: str, args) -> None:
    from .grants import grant_reader

    tables = grant_reader(url, args.role, args.name, create=args.create)
    what = f"datastore {args.name!r}" if args.name else "every datastore"
    print(f"role {args.role!r} may read {what} (SELECT only; later builds grant their own tables); "
          f"tables granted now: {', '.join(tables) or 'none yet'}")


def _grant_appender(url: str, args) -> None:
    from .grants import grant_appender

    grant_appender(url, args.role, create=args.create)
    print(f"role {args.role!r} may append outputs to the live layer (INSERT on live_outputs only)")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (0 ok, 1 a datastore error or a failed check, 2 usage)."""
    import psycopg
    from alembic.util.exc import AutogenerateDiffsDetected

    from .connection import resolve_database_url
    from .grants import RoleNotFound

    args = _parser().parse_args(argv)
    commands = {"list": _list, "stats": _stats, "drop": _drop, "migrate": _migrate, "grant-reader": _grant,
                "grant-appender": _grant_appender}
    try:
        commands[args.command](resolve_database_url(args.database_url), args)
    except (DatastoreError, RoleNotFound, AutogenerateDiffsDetected) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except psycopg.errors.InsufficientPrivilege as exc:
        print(f"error: this role may not {args.command} here: {exc}".rstrip(), file=sys.stderr)
        return 1
    return 0
