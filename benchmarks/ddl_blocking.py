"""What an idle reader's open transaction does to lookups while a datastore is dropped.

A session opens ``BEGIN; SELECT ... FROM <the datastore's table>`` and stays idle in that transaction, as a
forgotten ``psql`` or a pooled connection that never committed would. Meanwhile new clients open the
datastore and look up a context, again and again, and each round's seconds are recorded:

- ``usual``: no DDL, the latency of a new client's open + lookup;
- ``datastore drop`` (ours, :func:`datastore.admin.catalog.drop_datastore`): the datastore leaves the registry at
  once, and the held table is reported and left for ``datastore vacuum``;
- ``plain DROP TABLE``: what a drop without the registry step and ``lock_timeout`` does (Postgres's lock
  queue: the ``DROP`` waits behind the idle reader, every later lookup waits behind the ``DROP``), capped by
  the lookups' own ``statement_timeout`` and, here, a 10 s cap on the ``DROP``.

Printed: per phase, how long the DDL command took, and the new clients' rounds, p50 / max (ms) and how many
raised. The datastore is a small build of the packaged ShareGPT file's first conversations
(``--name``, default ``ddl-bench``), dropped at the end.

    python benchmarks/ddl_blocking.py [--database-url URL] [--seconds 4] [--name ddl-bench]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import psycopg
from psycopg import sql

from datastore import Datastore
from datastore.admin.catalog import datastore_stats, drop_datastore, vacuum_datastores
from datastore.connection import connect, resolve_database_url
from datastore.errors import DatastoreError
from ingest import BuildConfig, build_datastore
from ingest.sources import default_sharegpt_path
from toolkit import load_tokenizer
from toolkit.options import positive_float

NAME = "ddl-bench"


def _rounds(url: str, name: str, tokenizer, context: list[int], stop: threading.Event,
            out: list[tuple[float, bool]]) -> None:
    """New clients of datastore ``name``, one after another: (seconds of open + lookup, whether it raised) per
    round."""
    while not stop.is_set():
        t = time.perf_counter()
        try:
            with Datastore.open(name, tokenizer=tokenizer, database_url=url) as ds:
                ds.lookup(context)
            failed = False
        except DatastoreError:
            failed = True
        out.append((time.perf_counter() - t, failed))
        time.sleep(0.02)


def _phase(url: str, name: str, tokenizer, context: list[int], seconds: float,
           ddl) -> tuple[float, list[tuple[float, bool]]]:
    """Run ``ddl`` (or nothing) while new clients look up ``name`` for ``seconds``; returns (ddl seconds, rounds)."""
    stop, rounds = threading.Event(), list[tuple[float, bool]]()
    thread = threading.Thread(target=_rounds, args=(url, name, tokenizer, context, stop, rounds), daemon=True)
    thread.start()
    time.sleep(0.3)
    t = time.perf_counter()
    if ddl is not None:
        ddl()
    took = time.perf_counter() - t
    time.sleep(max(seconds - took, 0.5))
    stop.set()
    thread.join(30)
    return took, rounds


def _build(url: str, name: str) -> str:
    build_datastore(BuildConfig(name=name, path=default_sharegpt_path(), limit=20, top_t=200, max_n=3,
                                database_url=url), progress=False)
    return datastore_stats(url, name)["table"]


def _hold(url: str, table: str):
    conn = connect(url, application_name="idle-reader")
    conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))  # BEGIN implied; left open
    return conn


def _plain_drop(url: str, table: str, cap: float) -> None:
    with connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET statement_timeout = {}").format(sql.Literal(f"{round(cap * 1000)}ms")))
        try:
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(table)))
        except psycopg.errors.QueryCanceled:
            print(f"  plain DROP TABLE gave up after its {cap:g} s cap (still behind the idle reader)")


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--database-url", default=None, help="builder's URL (default: DATABASE_URL).")
    ap.add_argument("--seconds", type=positive_float, default=4.0, help="seconds of lookups per phase (default: 4).")
    ap.add_argument("--name", default=NAME, help=f"the datastore built, looked up and dropped (default: {NAME}).")
    ap.add_argument("--drop-cap", type=positive_float, default=10.0,
                    help="seconds the plain DROP TABLE may wait behind the idle reader before it gives up (default: "
                         "10).")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    url = resolve_database_url(args.database_url)
    tokenizer = load_tokenizer()
    context = tokenizer.encode("How do I sort a list in Python?")
    rows = []
    name = args.name
    table = _build(url, name)
    rows.append(("usual (no DDL)", *_phase(url, name, tokenizer, context, args.seconds, None)))
    holder = _hold(url, table)
    try:
        rows.append(("datastore drop (ours)", *_phase(url, name, tokenizer, context, args.seconds,
                                                      lambda: drop_datastore(url, name))))
    finally:
        holder.close()
    vacuum_datastores(url)
    table = _build(url, name)
    holder = _hold(url, table)
    try:
        rows.append(("plain DROP TABLE", *_phase(url, name, tokenizer, context, args.seconds,
                                                 lambda: _plain_drop(url, table, args.drop_cap))))
    finally:
        holder.close()
    drop_datastore(url, name)
    print("| phase | DDL s | new-client rounds | p50 ms | max ms | raised |")
    print("|---|---|---|---|---|---|")
    for label, took, rounds in rows:
        ms = [1e3 * s for s, _ in rounds]
        print(f"| {label} | {took:.2f} | {len(rounds)} | {statistics.median(ms):.1f} | {max(ms):.1f} | "
              f"{sum(f for _, f in rounds)} |")


if __name__ == "__main__":
    main()
