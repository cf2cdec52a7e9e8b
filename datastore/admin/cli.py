"""``python -m datastore {list,stats,replica,drop,vacuum,migrate,grant-reader,revoke-reader,grant-appender}``: inspect
and manage stored datastores.

``list`` and ``stats`` only read; ``replica`` writes this host's replica of a build (what a drafting process does the
first time it serves it, :mod:`datastore.replica`; run it ahead so that an engine's first steps read one), reading
the build with a reader's rights. ``migrate`` brings the registry schema to the revision this package reads
(builds do it too); ``drop`` removes a datastore's builds (at once out of the registry; each table when no
session holds it) and ``vacuum`` drops the tables left for later; ``grant-reader`` / ``revoke-reader`` give
and take back a least-privilege role's right to look datastores up; ``grant-appender`` lets a decoder's role
append finished outputs to the live layer (``INSERT`` on ``live_outputs``) and fold its verdicts into the fleet's
online calibration fits (``calibration_fits``), nothing else.

Exit codes: 0 done, 1 the command could not be carried out, 2 bad input (:mod:`toolkit.console`).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from toolkit.console import EXIT_FAILED, EXIT_OK, clause, error, run, table_console
from toolkit.options import database_options, datastore_name, int_in

from ..errors import BadDatabaseUrl, DatastoreError, DatastoreNotFound


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (one subcommand each; every option checked here)."""
    p = argparse.ArgumentParser(prog="python -m datastore", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    db = [database_options()]
    ls = sub.add_parser("list", parents=db, help="list datastores.")
    ls.add_argument("--all", action="store_true", help="include building, failed, retired and dropped builds.")
    ls.add_argument("--json", action="store_true", help="print JSON.")
    st = sub.add_parser("stats", parents=db,
                        help="per-n counts, rows, bytes on disk, bytes per n-gram, mean tree size.")
    st.add_argument("--name", type=datastore_name, required=True, help="datastore name.")
    st.add_argument("--json", action="store_true", help="print JSON.")
    rp = sub.add_parser("replica", parents=db,
                        help="write this host's replica of a datastore's ready build, unless it is there (one writer "
                             "per host); print what was done.")
    rp.add_argument("--name", type=datastore_name, required=True,
                    help="datastore name (a live layer's builds are datastores too: NAME.live, NAME.live.delta).")
    rp.add_argument("--build", type=int_in(1), default=None, metavar="ID",
                    help="only this build (its registry id); fails when it is no longer the ready one (default: the "
                         "ready build).")
    rp.add_argument("--folder", type=Path, default=None, metavar="DIR",
                    help="the host's replica folder (default: $CREST_REPLICAS, else <CREST_CACHE>/replicas).")
    rp.add_argument("--json", action="store_true",
                    help="print JSON: path, build, written (null, or entries, unreadable, bytes, seconds).")
    dr = sub.add_parser("drop", parents=db,
                        help="drop every build of a datastore (each table when no session holds it).")
    dr.add_argument("name", type=datastore_name, help="datastore name.")
    sub.add_parser("vacuum", parents=db,
                   help="drop the tables that left the registry but were still in use when they did.")
    mg = sub.add_parser("migrate", parents=db, help="bring the registry schema to this package's revision.")
    mg.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 unless the database is at this package's revision and the models "
                         "match the migrations (alembic check).")
    gr = sub.add_parser("grant-reader", parents=db,
                        help="let a role look datastores up (SELECT only), now and after every rebuild.")
    gr.add_argument("role", help="the Postgres role to grant.")
    gr.add_argument("--name", type=datastore_name, default=None,
                    help="only this datastore, which must have been built (default: every datastore, present and "
                         "future).")
    gr.add_argument("--future", action="store_true", help="allow a --name that has never been built yet.")
    gr.add_argument("--create", action="store_true", help="create the role (LOGIN, no password) if it does not exist.")
    rv = sub.add_parser("revoke-reader", parents=db, help="take back what grant-reader gave a role.")
    rv.add_argument("role", help="the Postgres role.")
    rv.add_argument("--name", type=datastore_name, default=None,
                    help="only this datastore's grant (default: every grant of the role).")
    ga = sub.add_parser("grant-appender", parents=db,
                        help="let a decoder's role append finished outputs to the live layer (INSERT only) "
                             "and fold into the fleet's online calibration fits.")
    ga.add_argument("role", help="the Postgres role to grant.")
    ga.add_argument("--create", action="store_true", help="create the role (LOGIN, no password) if it does not exist.")
    return p


def _table(title: str, columns: list[str], rows: list[list[str]], right: tuple[str, ...] = ()) -> None:
    from rich.table import Table

    t = Table(title=title, show_header=bool(columns))
    for col in columns or ["", ""]:
        t.add_column(col, justify="right" if col in right else "left", overflow="fold")
    for row in rows:
        t.add_row(*row)
    table_console().print(t)


def _list(url: str, args) -> None:
    from .catalog import list_datastores

    items = list_datastores(url, args.all)
    if args.json:
        print(json.dumps(items, default=str, indent=2))
        return
    if not items:
        print("no datastores; build one with `python -m ingest build`")
        return
    _table("datastores", ["name", "build", "state", "n-grams", "bytes on disk", "completed", "error"],
           [[d["name"], str(d["id"]), d["state"], f"{d['ngrams']:,}",
             f"{d['bytes_on_disk']:,}" if d["bytes_on_disk"] else "-",
             f"{d['completed_at']:%Y-%m-%d %H:%M}" if d["completed_at"] else "-", d["error"] or ""] for d in items],
           right=("build", "n-grams", "bytes on disk"))


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
    screen = (s["corpus"] or {}).get("contamination") or {}
    if not screen:
        rows.append(("screen", "none recorded: evaluation sets are not scored on it (ingest.contamination)"))
    for part, r in screen.get("parts", {}).items():
        rows.append((f"screen {part}", f"{r['contaminated']} of {r['items']} contaminated (>= {screen['threshold']:.0%}"
                                       f" of their {screen['n']}-grams), {r['shared_any']} share any"))
    _table("datastore stats", [], [list(r) for r in rows])


def _replica(url: str, args) -> None:
    import psycopg

    from crest_native import ReplicaError
    from toolkit.settings import Settings

    from ..connection import connect
    from ..registry import resolve_build, server_error
    from ..replica_file import database_key, host_replica, identity_of, replica_path

    folder = args.folder if args.folder is not None else Settings.from_env().replicas_dir
    if folder is None:
        raise ReplicasOff("replicas are off here (CREST_REPLICAS=off); name a folder with --folder DIR")
    with connect(url) as conn:
        info = resolve_build(conn, args.name, args.build)
        database = database_key(conn)
    path = replica_path(folder, database, info)
    try:
        _, report = host_replica(url, info, path, identity_of(info, database))
    except psycopg.Error as exc:
        raise server_error(info.name, exc) from exc
    except ReplicaError:
        raise
    except OSError as exc:  # the folder: not one, or not this user's to write
        raise ReplicaError(f"cannot write the replica under {folder} ({exc}); name a folder this user may write "
                           "with --folder DIR") from exc
    if args.json:  # written: the WriteReport's fields, which datastore.replica_file.write_in_child reads back
        print(json.dumps({"path": str(path), "build": info.id, "written": None if report is None else asdict(report)}))
    elif report is None:
        print(f"{path}: the replica of datastore {info.name!r} build {info.id} is there")
    else:
        print(f"{path}: wrote the replica of datastore {info.name!r} build {info.id}: {report.entries:,} n-grams "
              f"({report.unreadable:,} unreadable), {report.bytes:,} bytes, {report.seconds:.1f} s")


class ReplicasOff(ValueError):
    """``replica`` without ``--folder`` where ``CREST_REPLICAS=off``."""


def _drop(url: str, args) -> None:
    from .catalog import drop_datastore

    res = drop_datastore(url, args.name)
    print(f"dropped datastore {args.name!r}: {res.builds} build(s) out of the registry, {len(res.dropped)} table(s) "
          f"dropped")
    for pending in res.pending:
        print(f"not dropped yet: {pending.describe()}")


def _vacuum(url: str, args) -> None:
    from .catalog import vacuum_datastores

    dropped, pending = vacuum_datastores(url)
    print(f"dropped {len(dropped)} table(s) of builds that no longer serve" + (f": {', '.join(dropped)}" if dropped
                                                                                else ""))
    for p in pending:
        print(f"not dropped yet: {p.describe()}")


def _migrate(url: str, args) -> None:
    from ..connection import connect
    from ..registry import SCHEMA_REVISION
    from ..schema import require_schema, schema_revision
    from .migrate import check_models, upgrade

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

    tables = grant_reader(url, args.role, args.name, create=args.create, future=args.future)
    what = f"datastore {args.name!r}" if args.name else "every datastore"
    print(f"role {args.role!r} may read {what} (SELECT only; later builds grant their own tables); "
          f"tables granted now: {', '.join(tables) or 'none yet'}")


def _revoke(url: str, args) -> None:
    from .grants import revoke_reader

    tables = revoke_reader(url, args.role, args.name)
    what = f"datastore {args.name!r}" if args.name else "any datastore"
    print(f"role {args.role!r} may no longer read {what}; tables revoked: {', '.join(tables) or 'none'}")


def _grant_appender(url: str, args) -> None:
    from .grants import grant_appender

    grant_appender(url, args.role, create=args.create)
    print(f"role {args.role!r} may append outputs to the live layer (INSERT on live_outputs only)")


COMMANDS = {"list": _list, "stats": _stats, "replica": _replica, "drop": _drop, "vacuum": _vacuum, "migrate": _migrate,
            "grant-reader": _grant, "revoke-reader": _revoke, "grant-appender": _grant_appender}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (0 ok, 1 a datastore error or a failed check, 2 bad input)."""
    args = build_parser().parse_args(argv)

    def command() -> int:
        import psycopg

        from ..connection import resolve_database_url

        try:
            COMMANDS[args.command](resolve_database_url(args.database_url), args)
        except psycopg.errors.InsufficientPrivilege as exc:
            error(f"this role may not {args.command} here: {clause(exc)}")
            return EXIT_FAILED
        return EXIT_OK

    from crest_native import ReplicaError
    from toolkit.extras import MissingExtra

    from .grants import RoleNotFound, UnknownDatastore

    return run(command, usage=(BadDatabaseUrl, DatastoreNotFound, RoleNotFound, UnknownDatastore, MissingExtra,
                               ReplicasOff),
               failures=(DatastoreError, ReplicaError))
