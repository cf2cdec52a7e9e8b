"""Would a cache of the hottest n-grams' parsed trees, prefetched at start, answer more lookups than the LRU tree
cache? Measured by replay, not assumed.

For every step of the merged drafter's replay (the fit half of each set, budget 4, chains: what vLLM asks for),
the datastore's longest stored suffix of the context is what a lookup must return. A prefetched hot set answers
that lookup without a round trip only when that n-gram is among the N most frequent of the datastore (and the
client knows it is the longest stored one: a filter of every stored key, a few MB, would tell it). The N-th
count is estimated from a uniform sample of the datastore's rows (``TABLESAMPLE``), so the script prints, for
several N, the share of steps whose longest stored n-gram counts at least that much (the hot set's best case),
the hot set's parsed size, and the LRU cache's measured hit rate on the same steps.

    .venv/bin/python benchmarks/hot_cache.py [--datastore sharegpt] [--code-datastore code] [--sample 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _refs import half, load_references, references_option  # noqa: E402
from toolkit.options import percent  # noqa: E402

SIZES = (10_000, 100_000, 1_000_000)


def sampled_counts(name: str, percent: float) -> tuple[np.ndarray, np.ndarray, int]:
    """``(root counts, parsed bytes, rows)`` of a uniform sample of a datastore's trees."""
    from psycopg import sql

    from datastore.codec import decode_tree
    from datastore.connection import connect, resolve_database_url

    with connect(resolve_database_url(None), autocommit=True) as conn:
        row = conn.execute("SELECT trees_table, num_trees FROM datastores WHERE name = %s AND state = 'ready'",
                           [name]).fetchone()
        if row is None:
            raise SystemExit(f"no ready datastore {name!r}: build it first (python -m ingest build --name {name})")
        table, rows = row
        blobs = conn.execute(sql.SQL("SELECT tree FROM {} TABLESAMPLE SYSTEM (%s)").format(sql.Identifier(table)),
                             [percent]).fetchall()
    trees = [decode_tree(b) for (b,) in blobs]
    return (np.array([t.root_count for t in trees]),
            np.array([t.token_ids.nbytes + t.parents.nbytes + t.counts.nbytes + 200 for t in trees]), int(rows))


def replay_counts(name: str, datastore: str, references: Path) -> tuple[np.ndarray, float]:
    """Per replayed step, the root count of the context's longest stored n-gram (0: none); and the LRU hit rate."""
    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource, DraftingService, MergedMethod
    from evaluation.simulate import replay
    from toolkit import load_tokenizer

    tok = load_tokenizer()
    client = SharedDatastore.open(datastore, tokenizer=tok, replicas=False)
    counts: list[int] = []
    source = DatastoreSource(lambda: client)
    original = source.retrieve_batch

    def recording(contexts, back_off):
        found = original(contexts, back_off)
        counts.extend(f.candidates[0].tree.root_count if f.candidates else 0 for f in found)
        return found

    source.retrieve_batch = recording  # type: ignore[method-assign]
    service = DraftingService(MergedMethod(source, vocab_size=len(tok)), vocab_size=len(tok))
    for r in half(load_references(name, references), "fit"):
        replay(service, r.prompt, r.output, 4, chain=True)
    hit = client.stats()["cache_hit_rate"]
    client.close()
    return np.array(counts), hit


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--datastore", default="sharegpt", help="Spec-Bench's datastore (default: sharegpt).")
    ap.add_argument("--code-datastore", default="code", help="HumanEval's datastore (default: code).")
    ap.add_argument("--sample", type=percent, default=1.0, help="percent of each datastore's rows sampled.")
    references_option(ap)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    for name, ds in (("spec_bench", args.datastore), ("humaneval", args.code_datastore)):
        roots, sizes, rows = sampled_counts(ds, args.sample)
        steps, lru = replay_counts(name, ds, args.references)
        order = np.sort(roots)[::-1]
        print(f"{name} ({ds}, {rows:,} n-grams; {len(roots):,} sampled; {len(steps):,} steps, "
              f"{np.mean(steps > 0):.0%} with a stored match): LRU tree cache hit rate {lru:.1%}")
        for n in SIZES:
            at = min(int(n * len(roots) / rows), len(order) - 1)  # the N-th count, estimated from the sample
            threshold = order[at]
            top = roots >= threshold
            print(f"  hot set of the {n:>9,} most frequent (count >= {threshold:,}): would answer "
                  f"{np.mean(steps >= threshold):.1%} of steps; parsed size {n * sizes[top].mean() / 2**20:,.0f} MiB")


if __name__ == "__main__":
    main()
