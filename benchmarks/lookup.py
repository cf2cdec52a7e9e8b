"""Lookup latency and storage of a built datastore.

Replays real contexts (every position of tokenized chat prompts from the packaged Spec-Bench set,
only read here, never ingested) through ``Datastore.lookup`` and prints p50/p90/p99 per lookup in
milliseconds, beside a bare ``SELECT 1`` round trip on the same kind of connection measured in the
same run, plus bytes per stored n-gram (table + index). Then the shared client
(:class:`datastore.shared.SharedDatastore`, pooled): a cache-miss lookup (its cache disabled: every
lookup is a round trip) and a cache-hit lookup (the same contexts again, cache on). Then the host-local replica
(:mod:`datastore.replica`): written afresh into a temporary folder (seconds, bytes, bytes per n-gram, its size against
the Postgres table's), opened, and the same longest-match lookups through it (:meth:`crest_native.Replica.longest`,
one native call each, in microseconds) with a cold page cache (its pages evicted first, ``posix_fadvise(DONTNEED)``) and
a warm one.

    python -m benchmarks.lookup --name sharegpt [--database-url URL] [--lookups 5000]

Use a unix-socket URL (e.g. ``postgresql:///test?host=/var/run/postgresql&user=postgres``) to
measure over a socket; the embedded server is socket-only.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from datastore import Datastore
from datastore.admin.catalog import datastore_stats
from datastore.connection import connect, resolve_database_url
from evaluation.prompts import load_prompts
from toolkit import load_tokenizer
from toolkit.options import int_in


def _contexts(tokenizer, limit: int) -> list[list[int]]:
    """Every 1..5-token context of Spec-Bench's first turns (the packaged set, chat template applied), in order."""
    out: list[list[int]] = []
    for prompt in load_prompts("spec_bench", tokenizer):
        ids = list(prompt.token_ids)
        out.extend(ids[max(0, i - 5):i] for i in range(1, len(ids) + 1))
        if len(out) >= limit:
            break
    return out[:limit]


def _pct(samples: list[float], unit: str = "ms") -> str:
    """p50, p90 and p99 of ``samples`` (seconds) in ``unit``: ``ms`` (3 decimals) or ``µs`` (2)."""
    scale, digits = {"ms": (1e3, 3), "µs": (1e6, 2)}[unit]
    a = np.array(samples) * scale
    return "  ".join(f"p{q} {np.percentile(a, q):.{digits}f} {unit}" for q in (50, 90, 99))


def _timed(call, items) -> list[float]:
    """Seconds of each ``call(item)``, one after another."""
    out = []
    for item in items:
        t = time.perf_counter()
        call(item)
        out.append(time.perf_counter() - t)
    return out


def replica_figures(url: str, name: str, contexts: list[list[int]], table_bytes: int, rows: int) -> None:
    """Write the datastore's replica into a temporary folder, then time lookups through it, cold and warm."""
    import os
    import tempfile
    from pathlib import Path

    from datastore.registry import resolve_build
    from datastore.replica_file import database_key, identity_of, open_replica, replica_path, write_replica

    with connect(url, autocommit=True) as conn:
        info, db = resolve_build(conn, name), database_key(conn)
    with tempfile.TemporaryDirectory(prefix="crest-replica-") as folder:
        path, identity = replica_path(Path(folder), db, info), identity_of(info, db)
        report = write_replica(url, info, path, identity)
        t = time.perf_counter()
        opened = open_replica(path, identity)
        open_s = time.perf_counter() - t
        arrays = [np.asarray(c, np.uint32) for c in contexts]
        del opened
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the file's pages out of the page cache: a cold start
        os.close(fd)
        replica = open_replica(path, identity)
        cold = _timed(replica.longest, arrays)
        warm = _timed(replica.longest, arrays)
        found = sum(replica.longest(a) is not None for a in arrays)
    print(f"replica written in {report.seconds:.1f} s: {report.bytes:,} bytes, {report.bytes / rows:.1f} per n-gram, "
          f"{report.bytes / table_bytes:.2f}x the Postgres table and index; opened in {1e3 * open_s:.1f} ms")
    print(f"replica longest match, cold page cache ({len(cold)}): {_pct(cold, 'µs')}")
    print(f"replica longest match, warm page cache ({len(warm)}): {_pct(warm, 'µs')}")
    print(f"replica hit rate {found / len(arrays):.3f}")


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="sharegpt", help="datastore name.")
    p.add_argument("--database-url", default=None, help="libpq URL (default: $DATABASE_URL or the embedded server).")
    p.add_argument("--lookups", type=int_in(1), default=5000, help="timed lookups.")
    return p


def main() -> None:
    args = build_parser().parse_args()
    url = resolve_database_url(args.database_url)
    tok = load_tokenizer()
    contexts = _contexts(tok, args.lookups)
    with connect(url, autocommit=True) as conn:
        for _ in range(200):
            conn.execute("SELECT 1", prepare=True).fetchall()
        base = _timed(lambda _: conn.execute("SELECT 1", prepare=True).fetchall(), contexts)
    with Datastore.open(args.name, tokenizer=tok, database_url=url) as ds:
        for c in contexts[:200]:
            ds.lookup(c)
        times, hits, depth = [], 0, []
        for c in contexts:
            t = time.perf_counter()
            m = ds.lookup(c)
            times.append(time.perf_counter() - t)
            if m is not None:
                hits += 1
                depth.append(len(m.ngram))
        t = time.perf_counter()
        for i in range(0, len(contexts), 64):
            ds.lookup_batch(contexts[i:i + 64])
        batch_ms = (time.perf_counter() - t) / len(contexts) * 1e3
    from datastore.shared import SharedDatastore

    with SharedDatastore.open(args.name, tokenizer=tok, database_url=url, cache_bytes=0, listen=False,
                              replicas=False) as shared:
        for c in contexts[:200]:
            shared.lookup(c)
        miss = _timed(shared.lookup, contexts)
    with SharedDatastore.open(args.name, tokenizer=tok, database_url=url, listen=False, replicas=False) as shared:
        for c in contexts:
            shared.lookup(c)  # fills the cache
        hit = _timed(shared.lookup, contexts)
    s = datastore_stats(url, args.name)
    print(f"datastore {args.name}: {s['rows']:,} n-grams, {s['bytes_total']:,} bytes "
          f"(table {s['bytes_table']:,} + index {s['bytes_index']:,})")
    print(f"bytes per stored n-gram (table + index): {s['bytes_per_ngram']:.1f}")
    print(f"SELECT 1 round trip     ({len(base)}): {_pct(base)}")
    print(f"longest-match lookup    ({len(times)}): {_pct(times)}")
    print(f"batched lookup (64/query): {batch_ms:.3f} ms per context")
    print(f"shared client, cache miss ({len(miss)}): {_pct(miss)}")
    print(f"shared client, cache hit  ({len(hit)}): {_pct(hit)}")
    print(f"hit rate {hits / len(times):.3f}, mean matched n {np.mean(depth):.2f}")
    replica_figures(url, args.name, contexts, s["bytes_total"], s["rows"])


if __name__ == "__main__":
    main()
