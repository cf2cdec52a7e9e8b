"""Load and faults on one shared datastore: many drafting clients at once, a rebuild swapped in mid-run, and
(``--restart``) Postgres restarted mid-run. Loopback only; stops by itself.

Each client is a decoding stream: per step one longest-match lookup of a real context (windows of the
Spec-Bench prompts, only read here, never ingested), then a bare ``SELECT 1`` on its own connection for
comparison, then ``--step-ms`` of "forward pass" before the next step. Clients run as threads spread over
``--procs`` processes, each process with one :class:`datastore.shared.SharedDatastore` (its pool and tree
cache shared by its threads, as in a serving process; ``--cache-mb 0``, the default, sends every lookup
to the server, the hardest case).

Phase ``rebuild`` (default): at least ``--seconds`` of load; at a sixth of it the same datastore name is
rebuilt from the same corpus slice (in a process at ``nice`` 10, as on a serving host) and swapped in; the
load goes on at least 5 s past the swap. Printed: lookups/s, lookup and ``SELECT 1`` p50/p99/max (ms),
errors (lookups that raised), and how long after the swap's notification reached a listener each process
served the new build (negative: before; a client whose lookup finds the old table gone follows at once).

Phase ``restart`` (``--restart``): the clients draft through :class:`drafting.source.DatastoreSource`
(fall back, then reopen every 0.5 s); at a third of the run Postgres restarts (``--restart-cmd``, default
``pg_ctlcluster 15 main restart``; the embedded server is restarted with its own ``pg_ctl``). Printed: steps
that fell back, seconds from the server being back until each process drafts from the datastore again, errors.

    python -m benchmarks.load --database-url postgresql://postgres@127.0.0.1:5432/test --clients 16 64
    python -m benchmarks.load --embedded --clients 16 64
    python -m benchmarks.load --database-url ... --clients 16 --restart
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import subprocess
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, cast

import numpy as np

from toolkit.options import float_in, int_in, positive_float

NAME = "crest-load"


def _build(url: str, name: str, limit: int) -> int:
    from ingest import BuildConfig, build_datastore

    return build_datastore(BuildConfig(name=name, limit=limit, top_t=500_000, database_url=url),
                           progress=False).build_id


def _build_niced(url: str, name: str, limit: int) -> int:
    os.nice(10)  # as a rebuild on a serving host would run: the lookups keep their cores
    return _build(url, name, limit)


def _build_in_child(url: str, name: str, limit: int) -> int:
    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as ex:
        return ex.submit(_build_niced, url, name, limit).result()


def _contexts(n: int) -> list[list[int]]:
    from toolkit import load_tokenizer

    from .lookup import _contexts as spec_bench_contexts

    return spec_bench_contexts(load_tokenizer(), n)


def _client_proc(url: str, name: str, threads: int, stop, step_s: float, cache_mb: float, fallback: bool,
                 contexts: list, seed: int, out) -> None:
    """One serving process: ``threads`` clients sharing one SharedDatastore of datastore ``name``, until ``stop`` (an
    event) is set; sends its samples to ``out``."""
    import psycopg
    from psycopg_pool import ConnectionPool, PoolTimeout

    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource
    from toolkit import load_tokenizer

    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)  # a restart's reconnect attempts: counted below
    tok = load_tokenizer()
    conns = min(threads, 4)  # per process, for lookups and for SELECT 1 alike (max_connections is 100)
    opener = lambda: SharedDatastore.open(name, tokenizer=tok, database_url=url, pool_size=conns,  # noqa: E731
                                          cache_bytes=int(cache_mb * 2**20))
    bare = ConnectionPool(url, min_size=conns, max_size=conns, kwargs={"autocommit": True}, open=True)
    client = source = None
    if fallback:
        source = DatastoreSource(opener, retry_s=0.5)
    else:
        client = opener()
        client.wait_listening()
    lock = threading.Lock()
    res: dict[str, Any] = {"lookup_s": [], "select1_s": [], "errors": 0, "error_kinds": {}, "error_messages": {},
                           "fallback_steps": 0, "builds": {}, "answered_at": [], "fell_back_at": []}

    def work(i: int) -> None:
        rng = np.random.default_rng(seed * 1000 + i)
        while not stop.is_set():
            ctx = contexts[int(rng.integers(len(contexts)))]
            t0 = time.perf_counter()
            try:
                # exactly one of the two is open: the source with fallback, else the bare client
                (cast(DatastoreSource, source).lookup_batch([ctx]) if fallback
                 else cast(SharedDatastore, client).lookup_batch([ctx]))
            except Exception as exc:  # noqa: BLE001 - counted: the figure this benchmark exists for
                with lock:
                    res["errors"] += 1
                    res["error_kinds"][type(exc).__name__] = res["error_kinds"].get(type(exc).__name__, 0) + 1
                    res["error_messages"].setdefault(type(exc).__name__, str(exc)[:300])  # the first of each kind
                time.sleep(step_s)
                continue
            lat = time.perf_counter() - t0
            now = time.time()
            live = cast(DatastoreSource, source).client if fallback else client
            with lock:
                res["lookup_s"].append(lat)
                if fallback and live is None:
                    res["fallback_steps"] += 1
                    res["fell_back_at"].append(now)
                else:
                    res["answered_at"].append(now)
                    build = cast(SharedDatastore, live).info.id
                    res["builds"].setdefault(str(build), now)
            try:
                t1 = time.perf_counter()
                with bare.connection(timeout=2.0) as conn:
                    conn.execute("SELECT 1", prepare=True).fetchall()
                with lock:
                    res["select1_s"].append(time.perf_counter() - t1)
            except (psycopg.Error, PoolTimeout):
                pass  # the server restarts: measured again once it is back
            time.sleep(step_s)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    bare.close()
    if fallback:
        assert source is not None
        res["faults"] = dict(source.faults)
        source.close()
    else:
        assert client is not None
        res["stats"] = client.stats()
        client.close()
    res["answered_at"] = res["answered_at"][-200_000:]
    out.put(res)


def _swap_listener(url: str, name: str, seen: list, stop: threading.Event) -> None:
    """Records when each swap of the load datastore ``name`` is notified (the swap's commit)."""
    import psycopg

    from datastore.registry import SWAP_CHANNEL

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'LISTEN "{SWAP_CHANNEL}"')
        while not stop.is_set():
            for note in conn.notifies(timeout=0.2):
                if note.payload == name:
                    seen.append(time.time())


def _restart(url: str, cmd: str | None) -> float:
    """Restart the server; returns the seconds it took."""
    t = time.time()
    if cmd:
        subprocess.run(cmd, shell=True, check=True, capture_output=True)
    else:
        from datastore.connection import restart_embedded

        restart_embedded()
    return time.time() - t


def _pct(a, q) -> float:
    return float(np.percentile(np.asarray(a) * 1e3, q)) if len(a) else float("nan")


def run(url: str, clients: int, args, contexts, restart_cmd: str | None, embedded: bool) -> dict:
    procs = min(clients, args.procs)
    per = [clients // procs + (i < clients % procs) for i in range(procs)]
    ctx = mp.get_context("spawn")
    out, done = ctx.Queue(), ctx.Event()
    workers = [ctx.Process(target=_client_proc, args=(url, args.name, n, done, args.step_ms / 1e3, args.cache_mb,
                                                      args.restart, contexts, i, out))
               for i, n in enumerate(per)]
    swaps: list[float] = []
    stop = threading.Event()
    if not args.restart:
        threading.Thread(target=_swap_listener, args=(url, args.name, swaps, stop), daemon=True).start()
    t0 = time.time()
    for w in workers:
        w.start()
    event = {}
    if args.restart:
        time.sleep(args.seconds / 3)
        event["restart_at"] = time.time()
        event["restart_s"] = _restart(url, None if embedded else restart_cmd)
        time.sleep(max(0.0, t0 + args.seconds - time.time()))
    else:  # the rebuild starts early, as it competes with the clients for the cores
        time.sleep(args.seconds / 6)
        t = time.time()
        event["build_id"] = _build_in_child(url, args.name, args.limit)  # the GIL stays free for the swap listener
        event["rebuild_s"] = time.time() - t
        time.sleep(max(0.0, t0 + args.seconds - time.time(), 5.0))  # the load goes on >= 5 s after the swap
    done.set()
    load_s = time.time() - t0
    results = [out.get() for _ in workers]
    for w in workers:
        w.join()
    stop.set()
    wall = time.time() - t0
    lookups = [x for r in results for x in r["lookup_s"]]
    row = {"clients": clients, "procs": procs, "seconds": load_s, "lookups": len(lookups),
           "lookups_per_s": len(lookups) / load_s, "wall_s": wall,
           "lookup_ms": {q: _pct(lookups, q) for q in (50, 99, 100)},
           "select1_ms": {q: _pct([x for r in results for x in r["select1_s"]], q) for q in (50, 99, 100)},
           "errors": sum(r["errors"] for r in results),
           "error_kinds": [r["error_kinds"] for r in results if r["error_kinds"]],
           "error_messages": {k: v for r in results for k, v in r["error_messages"].items()}} | event
    if args.restart:
        up = event["restart_at"] + event["restart_s"]  # the server accepts connections again
        last = [max(r["fell_back_at"], default=event["restart_at"]) for r in results]
        back = [min((t for t in r["answered_at"] if t > t_last), default=None) for r, t_last in zip(results, last)]
        row["fallback_steps"] = sum(r["fallback_steps"] for r in results)
        row["recovered_after_s"] = [None if b is None else round(b - up, 3) for b in back]
        row["faults"] = [r["faults"] for r in results]
    else:
        swap_at = swaps[-1] if swaps else None
        new = str(event["build_id"])
        row["saw_new_build_after_ms"] = [None if swap_at is None or new not in r["builds"]
                                         else round(1e3 * (r["builds"][new] - swap_at), 1) for r in results]
        row["cache_hit_rate"] = float(np.mean([r["stats"]["cache_hit_rate"] for r in results]))
    return row


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--database-url", help="a Postgres server (libpq URL).")
    where.add_argument("--embedded", action="store_true", help="the embedded server (the default for new users).")
    ap.add_argument("--clients", nargs="+", type=int_in(1), default=[16, 64], help="concurrent drafting clients.")
    ap.add_argument("--seconds", type=positive_float, default=60.0, help="seconds of load per run.")
    ap.add_argument("--procs", type=int_in(1), default=4, help="client processes (clients are spread over them).")
    ap.add_argument("--step-ms", type=float_in(0), default=10.0, help="ms each client waits between lookups.")
    ap.add_argument("--cache-mb", type=float_in(0), default=0.0, help="each process's tree cache, MiB (0: none).")
    ap.add_argument("--limit", type=int_in(1), default=3000, help="ShareGPT conversations in the load datastore.")
    ap.add_argument("--restart", action="store_true", help="restart Postgres mid-run instead of rebuilding.")
    ap.add_argument("--restart-cmd", default="pg_ctlcluster 15 main restart", help="restarts the server.")
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here.")
    ap.add_argument("--name", default=NAME,
                    help=f"the load datastore, built and rebuilt under this name and left in place (default: {NAME}).")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    from datastore.connection import resolve_database_url

    url = resolve_database_url(None if args.embedded else args.database_url)
    t = time.time()
    _build(url, args.name, args.limit)
    print(f"load datastore {args.name!r} ({args.limit} conversations) built in {time.time() - t:.0f} s", flush=True)
    contexts = _contexts(5000)
    rows = []
    for c in args.clients:
        row = run(url, c, args, contexts, args.restart_cmd, args.embedded)
        rows.append(row)
        lk, s1 = row["lookup_ms"], row["select1_ms"]
        print(f"{c:>3} clients, {row['seconds']:.0f} s: {row['lookups_per_s']:,.0f} lookups/s  "
              f"lookup p50 {lk[50]:.3f} p99 {lk[99]:.3f} "
              f"max {lk[100]:.1f} ms | SELECT 1 p50 {s1[50]:.3f} p99 {s1[99]:.3f} max {s1[100]:.1f} ms | "
              f"errors {row['errors']}", flush=True)
        for kind, message in row["error_messages"].items():
            print(f"     first {kind}: {message}", flush=True)
        if args.restart:
            print(f"     restart took {row['restart_s']:.1f} s; {row['fallback_steps']} steps fell back; "
                  f"processes drafting again {row['recovered_after_s']} s after the server was back; "
                  f"faults {row['faults']}")
        else:
            print(f"     rebuild took {row['rebuild_s']:.0f} s; processes served the new build "
                  f"{row['saw_new_build_after_ms']} ms after its swap was notified")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
