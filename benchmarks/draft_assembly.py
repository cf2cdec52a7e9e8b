"""Draft assembly cost: the N-gram trie's build time per 1,000 prompt tokens, and the merged drafter's step (its
``propose``; of it the round trip and the native core).

Replays the saved plain-greedy outputs (``python -m evaluation replay`` saves them)
with the merged drafter, so only drafting is timed, no model forward passes.

    python benchmarks/draft_assembly.py [--datastore sharegpt] [--set spec_bench] [--limit 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from crest_native import MAX_BUDGET
from datastore import Datastore
from drafting import DatastoreSource, DraftingService, MergedMethod
from drafting.drafters.ngram_trie import NGramTrie
from evaluation.prompts import load_prompts
from evaluation.replay import reference_store  # references saved by `python -m evaluation replay`
from evaluation.simulate import replay
from toolkit import load_tokenizer
from toolkit.options import int_in


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--datastore", default="sharegpt", help="datastore name (default: sharegpt).")
    ap.add_argument("--database-url", default=None, help="libpq URL (default: DATABASE_URL or embedded).")
    ap.add_argument("--set", dest="prompt_set", default="spec_bench", help="prompt set (default: spec_bench).")
    ap.add_argument("--limit", type=int_in(1), default=2, help="prompts per category (default: 2).")
    ap.add_argument("--budget", type=int_in(1, MAX_BUDGET), default=3, help="draft nodes per step (default: 3).")
    return ap


def main() -> None:
    args = build_parser().parse_args()

    tok = load_tokenizer()
    prompts = load_prompts(args.prompt_set, tok, limit=args.limit)
    per_k = []
    for p in prompts:
        best = min(_time_build(p.token_ids) for _ in range(5))
        per_k.append(1e3 * best / len(p.token_ids) * 1000)
    lengths = [len(p.token_ids) for p in prompts]
    print(f"trie build: {statistics.median(per_k):.2f} ms per 1,000 prompt tokens (median over {len(prompts)} "
          f"prompts of {min(lengths)}..{max(lengths)} tokens; max {max(per_k):.2f})")

    store = reference_store("SmolLM2-135M-Instruct", "float32", args.prompt_set, 128)
    source = DatastoreSource(lambda: Datastore.open(args.datastore, tokenizer=tok, database_url=args.database_url))
    method = MergedMethod(source, vocab_size=len(tok))
    drafter = DraftingService(method, vocab_size=len(tok))
    total = []
    for p in prompts:
        ref = store.get(p.id, p.token_ids)
        if ref is None:
            continue
        total += [step.draft_s for step in replay(drafter, p.token_ids, ref, args.budget).steps]
    if not total:
        raise SystemExit("no saved references: run `python -m evaluation replay --set ...` first")
    q = lambda xs, f: 1e3 * float(np.quantile(xs, f))  # noqa: E731
    st, parts = drafter.stats, method.stats
    print(f"draft assembly per step over {len(total)} steps (ms): "
          f"p50 {q(total, .5):.3f}, p90 {q(total, .9):.3f}, p99 {q(total, .99):.3f}; of the mean "
          f"{1e3 * st.step_s / st.steps:.3f}: round trip {1e3 * parts.lookup_s / st.steps:.3f}, "
          f"native core {1e3 * parts.core_s / st.steps:.3f}")


def _time_build(ids) -> float:
    t0 = time.perf_counter()
    NGramTrie().extend(ids)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
