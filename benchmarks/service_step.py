"""One drafting step for a whole batch, outside any engine: :class:`drafting.DraftingService` (the merged drafter) with
``--batch`` requests in flight (default 32), datastore included, read from the host-local replica or by the round trip.

The requests replay the greedy references (``python -m evaluation references``; the report half of each set): every
step follows every unfinished request of the batch and drafts for it in one ``step``, each request accepts the longest
prefix of its
draft that matches its reference plus the bonus token, as a verifier would, and moves on. Timed: each ``step``
(wall, ms). Printed per set, form (``chain``, as vLLM verifies; ``tree``) and lookup path (``replica``: the mapped
replica, one native call a step; ``trip``: the round trip, with a tree cache of ``--cache-mb``): step p50/p99, the
round trip's share, the tree cache's hit rate, the accept length and a digest of every draft (with ``--text repeat``
the paths replay the same requests: equal digests are bit-identical drafts; ``--batch`` as large as the report half
replays all of it).

``--text repeat`` (default) replays the same references in every configuration, after an untimed pass that warms the
server's buffers with them; ``--text novel`` gives each configuration its own references (the report half split
between them, no warm pass), so no run looks up text any run looked up before, as in an engine, whose cache hits are
few. Spec-Bench draws on ShareGPT, HumanEval on the code datastore. Time it alone: the two cores are shared with the
server.

    python -m benchmarks.service_step [--batch 32] [--budget 8] [--min-score 0.1] [--text novel]
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from pathlib import Path

import numpy as np

from crest_native import MAX_BUDGET
from toolkit.options import float_in, int_in

from ._harness import parser, references


def run_set(service, refs: list[tuple[list[int], list[int]]], batch: int, budget: int, chain: bool,
            min_score: float) -> dict:
    """Replays ``refs[:batch]`` together, as :func:`evaluation.simulate.replay` replays one; returns the step
    times (s), the accept length (tokens per request step, bonus included) and a digest of every draft (token ids,
    parents and scores, bit for bit: two lookup paths over the same references draft alike exactly when they match)."""
    from drafting.accept import accept_greedy, reference_predictions

    live: dict[int, list] = {}  # request id -> [reference, position, tokens committed since its last step]
    for rid, (prompt, out) in enumerate(refs[:batch]):
        service.start_request(rid, prompt + out[:1])  # the prefill committed out[0]
        live[rid] = [np.asarray(out, dtype=np.int64), 1, []]
    times, steps, tokens = [], 0, 0
    digest = hashlib.sha256()
    while live:
        t = time.perf_counter()
        drafts = service.step(list(live), [min(budget, len(ref) - pos - 1) for ref, pos, _ in live.values()],
                              tokens=[new for _, _, new in live.values()], chain=chain, min_score=min_score).drafts
        times.append(time.perf_counter() - t)
        for (rid, state), draft in zip(list(live.items()), drafts):
            for part in (draft.token_ids, draft.parents, draft.scores):
                digest.update(np.ascontiguousarray(part).tobytes())
            ref, pos, _ = state
            path, _ = accept_greedy(draft, reference_predictions(draft.depths, ref, pos))
            n = min(len(path) + 1, len(ref) - pos)
            state[1:] = [pos + n, ref[pos:pos + n].tolist()]
            steps, tokens = steps + 1, tokens + n
            if state[1] >= len(ref):
                service.stop_request(rid)
                del live[rid]
    return {"times": times, "accept": tokens / max(steps, 1), "digest": digest.hexdigest()[:16]}


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = parser(__doc__)
    ap.add_argument("--sets", nargs="+", default=["spec_bench", "humaneval"],
                    help="evaluation sets replayed, report half (default: spec_bench humaneval).")
    ap.add_argument("--batch", type=int_in(1), default=32, help="requests in flight.")
    ap.add_argument("--budget", type=int_in(1, MAX_BUDGET), default=8,
                    help="draft tokens per request (the proposer's k).")
    ap.add_argument("--min-score", type=float_in(0, 1), default=0.1, help="the cut (the proposer's CREST_MIN_SCORE).")
    ap.add_argument("--paths", nargs="+", choices=["replica", "trip"], default=["replica", "trip"],
                    help="lookup paths to run: the host-local replica, the round trip (default: both).")
    ap.add_argument("--cache-mb", nargs="+", type=float_in(0), default=[64.0],
                    help="the round trip's tree cache bounds to run (0: every lookup goes to the server).")
    ap.add_argument("--text", choices=["repeat", "novel"], default="repeat",
                    help="repeat: every run replays the same references (warmed); novel: each run its own.")
    ap.add_argument("--datastore", default="sharegpt", help="Spec-Bench's datastore.")
    ap.add_argument("--code-datastore", default="code", help="HumanEval's datastore.")
    return ap


def _service(name: str, tok, path: str, cache_mb: float, replicas: Path):
    """A fresh merged drafter over datastore ``name``, reading it as ``path`` says (its replica ready first)."""
    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource, DraftingService

    client = SharedDatastore.open(name, tokenizer=tok, cache_bytes=int(cache_mb * 2**20),
                                  replicas=replicas if path == "replica" else False)
    if client.replicas is not None and not client.replicas.wait_ready(600):
        raise SystemExit(f"the replica of {name!r} was not ready within 10 minutes")
    client.lookup_batch([[1, 2]])  # opens the pool's connections

    def connect(c: SharedDatastore = client) -> SharedDatastore:
        return c

    return DraftingService(DatastoreSource(connect), vocab_size=len(tok)), client


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from toolkit import load_tokenizer
    from toolkit.settings import Settings

    refs = {name: [(r.prompt, r.output) for r in references(name, args.references)] for name in args.sets}
    tok = load_tokenizer()
    datastores = {"spec_bench": args.datastore, "humaneval": args.code_datastore}
    replicas = Settings.from_env().replicas_dir or Path(tempfile.mkdtemp(prefix="crest-replicas-"))
    runs = [(chain, path, mb) for chain in (True, False) for path in args.paths
            for mb in (args.cache_mb if path == "trip" else [0.0])]
    print(f"batch {args.batch}, budget {args.budget}, min score {args.min_score}, text {args.text}")
    print(f"{'set':<11} {'form':<6} {'path':<8} {'cache MiB':>9} {'steps':>6} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'lookup':>7} {'hits':>6} {'accept':>7} {'drafts digest':>16}")
    for name, rs in refs.items():
        parts = [rs[k::len(runs)] for k in range(len(runs))] if args.text == "novel" else [rs] * len(runs)
        if args.text == "repeat":  # warm the server's buffers with the same lookups, untimed (a fresh client)
            warm, client = _service(datastores[name], tok, "trip", 0.0, replicas)
            run_set(warm, rs, args.batch, args.budget, True, args.min_score)
            client.close()
        for (chain, path, mb), part in zip(runs, parts):
            service, client = _service(datastores[name], tok, path, mb, replicas)
            res = run_set(service, part, args.batch, args.budget, chain, args.min_score)
            st, ms = service.retrieval.stats, np.asarray(res["times"]) * 1e3
            hits = client.stats().get("cache_hit_rate", 0.0) if path == "trip" else 0.0
            share = st.lookup_s / max(service.stats.step_s, 1e-12)
            print(f"{name:<11} {'chain' if chain else 'tree':<6} {path:<8} {mb:>9.0f} {len(ms):>6} "
                  f"{np.median(ms):>7.3f} {np.percentile(ms, 99):>7.3f} {share:>7.0%} {hits:>6.0%} "
                  f"{res['accept']:>7.2f} {res['digest']:>16}", flush=True)
            client.close()


if __name__ == "__main__":
    main()
