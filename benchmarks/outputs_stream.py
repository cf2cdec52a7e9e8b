"""The process-wide output index under a long request stream: its size stays within its bound and the process's
resident memory stops growing.

One :class:`drafting.service.DraftingService` (the native core, no datastore: only the request's own tokens and
the index of finished outputs draft, so the memory measured is theirs) serves requests one after another for
``--minutes`` minutes: each replays a greedy reference (``benchmarks/references.py``: Spec-Bench turns 1 and 2,
HumanEval, in turn), chains of ``--budget`` tokens, and its output goes into the index when it finishes. Every
pass over the references shifts every token id by a different offset (modulo the vocabulary), so each pass
feeds new sequences rather than repeats, which an automaton would store once.

Printed every ``--every`` seconds: requests served, the index's size (its byte model, at most ``--outputs-mb``),
the outputs it holds, its evictions, what its arrays hold allocated, the process's resident set (RSS) and the
accept length of the last interval. At the end: the RSS growth from the first report after the first eviction to
the last one.

    .venv/bin/python benchmarks/outputs_stream.py [--minutes 30] [--outputs-mb 64] [--budget 8]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _refs import load_references, references_option  # noqa: E402
from crest_native import MAX_BUDGET  # noqa: E402
from toolkit.options import float_in, int_in, positive_float  # noqa: E402

VOCAB = 49152  # SmolLM2's vocabulary


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--minutes", type=positive_float, default=30.0, help="how long the stream runs.")
    ap.add_argument("--outputs-mb", type=float_in(0), default=64.0, help="the output index's bound, MiB.")
    ap.add_argument("--budget", type=int_in(1, MAX_BUDGET), default=8, help="chain length drafted per step.")
    ap.add_argument("--every", type=positive_float, default=60.0, help="seconds between reports.")
    references_option(ap)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    from drafting import DraftingService, MergedMethod
    from evaluation.simulate import replay

    refs = [r for name in ("spec_bench", "spec_bench_turn2", "humaneval")
            for r in load_references(name, args.references)]
    service = DraftingService(MergedMethod(None, vocab_size=VOCAB, outputs_bytes=int(args.outputs_mb * 2**20)),
                              vocab_size=VOCAB)
    proc = psutil.Process()
    start = last = time.monotonic()
    served = tokens = steps = 0
    interval_tokens = interval_steps = 0
    rss_after_evict: list[float] = []
    print(f"output index bound {args.outputs_mb:g} MiB; {len(refs)} references a pass; budget {args.budget}")
    print(f"{'minute':>6} {'requests':>9} {'index MiB':>9} {'outputs':>8} {'evictions':>9} {'alloc MiB':>9} "
          f"{'RSS MiB':>8} {'accept':>6}")
    for p in itertools.count():
        for r in refs:
            shift = (7919 * p) % VOCAB
            prompt = [(t + shift) % VOCAB for t in r.prompt]
            output = [(t + shift) % VOCAB for t in r.output]
            res = replay(service, prompt, output, args.budget, chain=True)
            served += 1
            interval_tokens += len(res.output_ids) - 1
            interval_steps += len(res.steps)
            now = time.monotonic()
            if now - last >= args.every or now - start >= 60 * args.minutes:
                info = service.outputs_info()
                rss = proc.memory_info().rss / 2**20
                if info["evictions"]:
                    rss_after_evict.append(rss)
                print(f"{(now - start) / 60:>6.1f} {served:>9,} {info['bytes'] / 2**20:>9.1f} {info['outputs']:>8,} "
                      f"{info['evictions']:>9} {info['allocated'] / 2**20:>9.1f} {rss:>8.0f} "
                      f"{interval_tokens / max(interval_steps, 1):>6.2f}", flush=True)
                tokens, steps = tokens + interval_tokens, steps + interval_steps
                interval_tokens = interval_steps = 0
                last = now
                if now - start >= 60 * args.minutes:
                    growth = rss_after_evict[-1] - rss_after_evict[0] if len(rss_after_evict) > 1 else float("nan")
                    print(f"{served:,} requests, {tokens:,} tokens in {(now - start) / 60:.1f} min; index within "
                          f"{args.outputs_mb:g} MiB at every report; RSS growth after the first eviction: "
                          f"{growth:+.0f} MiB ({rss_after_evict[0] if rss_after_evict else float('nan'):.0f} -> "
                          f"{rss_after_evict[-1] if rss_after_evict else float('nan'):.0f} MiB)")
                    return


if __name__ == "__main__":
    main()
