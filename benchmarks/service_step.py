"""One drafting step for a whole batch, outside any engine: :class:`drafting.service.DraftingService` with
``--batch`` requests in flight (default 32), datastore included.

The requests replay the greedy references (``benchmarks/references.py``; the held-out half of each set):
every step drafts for every unfinished request of the batch in one ``propose``
(one batched datastore lookup), each request accepts the longest prefix of its draft that matches its
reference plus the bonus token, as a verifier would, and moves on. Timed: each ``propose`` (wall, ms).
Printed per set and form (``chain``, as vLLM verifies; ``tree``): step p50/p99, the datastore lookup's
share, the tree cache's hit rate and the accept length, with a cold client cache per run (``--cache-mb``; 0
sends every lookup to the server) and the server's buffers warmed by an untimed pass of the same lookups.
Spec-Bench draws on ShareGPT, HumanEval on the code datastore. Time it alone: the two cores are shared with
the server.

    .venv/bin/python benchmarks/service_step.py [--batch 32] [--budget 8] [--min-score 0.1] [--cache-mb 64 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from _refs import half, load_references, references_option  # noqa: E402
from drafting.lifecycle import MAX_BUDGET  # noqa: E402
from toolkit.options import float_in, int_in  # noqa: E402


def run_set(service, refs: list[tuple[list[int], list[int]]], batch: int, budget: int, chain: bool) -> dict:
    """Replays ``refs[:batch]`` together, as :func:`evaluation.simulate.replay` replays one; returns the step
    times (s) and the accept length (tokens per request step, bonus included)."""
    from drafting.accept import accept_greedy, reference_predictions

    live: dict[int, list[Any]] = {}  # request id -> [reference, position, the request's tokens so far]
    for rid, (prompt, out) in enumerate(refs[:batch]):
        service.start_request(rid, prompt + out[:1])  # the prefill committed out[0]
        live[rid] = [np.asarray(out, dtype=np.int64), 1, prompt + out[:1]]
    times, steps, tokens = [], 0, 0
    while live:
        t = time.perf_counter()
        drafts = service.propose([(rid, seq, min(budget, len(ref) - pos - 1)) for rid, (ref, pos, seq) in live.items()],
                                 chain=chain)
        times.append(time.perf_counter() - t)
        for (rid, state), draft in zip(list(live.items()), drafts):
            ref, pos, seq = state
            path, _ = accept_greedy(draft, reference_predictions(draft.depths, ref, pos))
            n = min(len(path) + 1, len(ref) - pos)
            service.add_tokens(rid, ref[pos:pos + n].tolist())
            seq += ref[pos:pos + n].tolist()
            state[1] = pos + n
            steps, tokens = steps + 1, tokens + n
            if state[1] >= len(ref):
                service.stop_request(rid)
                del live[rid]
    return {"times": times, "accept": tokens / max(steps, 1)}


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--sets", nargs="+", default=["spec_bench", "humaneval"],
                    help="evaluation sets replayed, report half (default: spec_bench humaneval).")
    ap.add_argument("--batch", type=int_in(1), default=32, help="requests in flight.")
    ap.add_argument("--budget", type=int_in(1, MAX_BUDGET), default=8,
                    help="draft tokens per request (the proposer's k).")
    ap.add_argument("--min-score", type=float_in(0, 1), default=0.1, help="the cut (the proposer's CREST_MIN_SCORE).")
    ap.add_argument("--cache-mb", nargs="+", type=float_in(0), default=[64.0, 0.0], help="tree cache bounds to run.")
    ap.add_argument("--datastore", default="sharegpt", help="Spec-Bench's datastore.")
    ap.add_argument("--code-datastore", default="code", help="HumanEval's datastore.")
    references_option(ap)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource
    from drafting.service import DraftingService
    from toolkit import load_tokenizer

    refs = {name: [(r.prompt, r.output) for r in half(load_references(name, args.references), "report")]
            for name in args.sets}
    tok = load_tokenizer()
    datastores = {"spec_bench": args.datastore, "humaneval": args.code_datastore}
    for name, rs in refs.items():  # warm the server's buffers with the same lookups, untimed (a fresh client)
        with SharedDatastore.open(datastores[name], tokenizer=tok, cache_bytes=0) as warm:
            def reuse(c: SharedDatastore = warm) -> SharedDatastore:
                return c

            run_set(DraftingService(DatastoreSource(reuse), min_score=args.min_score), rs, args.batch, args.budget,
                    True)
    print(f"batch {args.batch}, budget {args.budget}, min score {args.min_score}")
    print(f"{'set':<11} {'form':<6} {'cache MiB':>9} {'steps':>6} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'lookup':>7} {'hits':>6} {'accept':>7}")
    for name, rs in refs.items():
        for chain in (True, False):
            for mb in args.cache_mb:
                client = SharedDatastore.open(datastores[name], tokenizer=tok, cache_bytes=int(mb * 2**20))

                def connect(c: SharedDatastore = client) -> SharedDatastore:
                    return c

                service = DraftingService(DatastoreSource(connect), min_score=args.min_score)
                client.lookup_batch([rs[0][0][-5:]])  # opens the pool's connections
                res = run_set(service, rs, args.batch, args.budget, chain)
                st, ms = service.stats, np.asarray(res["times"]) * 1e3
                hits = client.stats().get("cache_hit_rate", 0.0)
                print(f"{name:<11} {'chain' if chain else 'tree':<6} {mb:>9.0f} {len(ms):>6} "
                      f"{np.median(ms):>7.2f} {np.percentile(ms, 99):>7.2f} "
                      f"{st.lookup_s / max(st.step_s, 1e-12):>7.0%} {hits:>6.0%} {res['accept']:>7.2f}", flush=True)
                client.close()


if __name__ == "__main__":
    main()
