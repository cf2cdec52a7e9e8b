"""The vLLM hook's own ``propose`` outside vLLM: :class:`serving.vllm_proposer.CrestProposer` called as vLLM's model
runner calls it, with vLLM-shaped arrays (``token_ids_cpu``: ``[rows, max_model_len]`` int32, rewritten in place;
``num_tokens_no_spec``: int32; ``sampled_token_ids``), ``--concurrency`` requests at a time replaying the report half's
greedy references (``python -m evaluation references``): each step every row accepts the longest prefix of its chain
that
matches its reference, plus the bonus token, as vLLM's rejection sampler would; a finished request's row is refilled
from the queue (the batch stays full). Timed: each ``propose`` call (wall, ms), its p50 and p99, with the replica mapped
(the default) or with every step a round trip (``--no-replica``); the cut is fixed at ``CREST_MIN_SCORE``'s default
(there is no engine to fit a step cost to; ``--adaptive`` fits one to the calls' spacing, to time its refits). No
vLLM is imported: this isolates the hook from the engine, whose own figures ``python -m benchmarks.vllm_serving
--accounting`` gives. ``--flush-mb`` reads that many MiB between two calls, as an engine's forward pass streams the
model's weights through the caches (SmolLM2-135M fp32: 540 MB), so the hook runs on cold caches as it does inside the
engine.

    python -m benchmarks.proposer_step [--concurrency 1 8 32] [--sets spec_bench humaneval] [--flush-mb 540]
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from toolkit.options import int_in

from ._harness import parser, references

MAX_MODEL_LEN = 4096
_RUNS = itertools.count()


def _config(k: int, tokenizer_dir: str, vocab: int):
    """The parts of vLLM's ``VllmConfig`` the proposer reads."""
    model = SimpleNamespace(max_model_len=MAX_MODEL_LEN, tokenizer=tokenizer_dir, get_vocab_size=lambda: vocab)
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k), model_config=model)


def agreed(chain: list[int], continuation: list[int]) -> list[int]:
    """The longest prefix of ``chain`` that ``continuation`` (the target's next tokens) starts with: the draft tokens
    a greedy verifier accepts."""
    n = 0
    for drafted, target in zip(chain, continuation):
        if drafted != target:
            break
        n += 1
    return chain[:n]


def run(proposer, refs: list[tuple[list[int], list[int]]], concurrency: int, flush: np.ndarray | None = None,
        step: Callable[[int, int], None] | None = None, by_id: bool = True) -> dict:
    """Serve ``refs`` ``concurrency`` at a time through ``proposer.propose``; returns the call times (s), the accept
    length, the steps (calls), the rows' steps, the tokens the rows took (accepted draft tokens and bonus tokens), and
    the draft tokens proposed and accepted. ``flush``: an array read through between two calls (``None``: none).
    ``step``: called after each step with the rows it verified and their tokens (sampled and draft), as an engine's
    forward pass would take them (``None``: nothing). ``by_id``: each call is handed the step by request id first, as
    our plugin's runner hook hands it (:meth:`serving.vllm_proposer.CrestProposer.observe`; timed with the call);
    else the proposer keys the rows by their tokens, as without the plugin."""
    from serving.runner_hook import EngineView

    tokens = np.zeros((concurrency, MAX_MODEL_LEN), np.int32)
    lengths = np.zeros(concurrency, np.int32)
    queue = list(refs)
    rows: list[list | None] = [None] * concurrency  # per row: [reference output, position]
    sampled: list[list[int]] = [[] for _ in range(concurrency)]
    ids = [""] * concurrency  # each row's request id, as vLLM's input_batch.req_ids holds them
    finished: set[str] = set()
    told: set[str] = set()
    made = iter(range(1 << 62))
    run_id = next(_RUNS)  # request ids are unique across runs on one proposer, as vLLM's are

    def fill(i: int) -> None:
        prompt, out = queue.pop(0)
        tokens[i, :len(prompt) + 1] = prompt + out[:1]  # the prefill sampled out[0]
        lengths[i] = len(prompt) + 1
        rows[i] = [out, 1]
        sampled[i] = out[:1]
        if ids[i]:
            finished.add(ids[i])
        ids[i] = f"req-{run_id}-{next(made)}"

    for i in range(min(concurrency, len(queue))):
        fill(i)
    times, steps, accepted, drafted, drafts_accepted = [], 0, 0, 0, 0
    while rows:
        if flush is not None:
            flush.sum()
        t = time.perf_counter()
        if by_id:
            proposer.observe(EngineView(list(ids), sampled, tokens, lengths, finished, lambda _: None, None, told))
            finished = set()
        drafts = proposer.propose(sampled, lengths, tokens)
        times.append(time.perf_counter() - t)
        verified = [(i, len(drafts[i])) for i, row in enumerate(rows) if row is not None]
        for i, row in enumerate(rows):
            sampled[i] = []
            if row is None:
                continue
            out, pos = row
            drafted += len(drafts[i])
            n = len(agreed(drafts[i], out[pos:]))
            drafts_accepted += n
            new = out[pos:pos + n + 1]
            tokens[i, lengths[i]:lengths[i] + len(new)] = new
            lengths[i] += len(new)
            row[1] = pos + len(new)
            sampled[i] = new
            steps += 1
            accepted += len(new)
            if row[1] >= len(out):
                rows[i] = None
                sampled[i] = []  # the row is gone (vLLM drops it) ...
                if queue:
                    fill(i)  # ... or holds the next request
        holes = [i for i, row in enumerate(rows) if row is None]
        finished.update(ids[i] for i in holes)
        for hole in holes:  # vLLM condenses its batch: its last rows move into the holes, and the batch shrinks
            while rows and rows[-1] is None:
                del rows[-1], sampled[-1], ids[-1]
            if hole < len(rows) and rows[hole] is None:
                rows[hole], sampled[hole], ids[hole] = rows[-1], sampled[-1], ids[-1]
                tokens[hole], lengths[hole] = tokens[len(rows) - 1], lengths[len(rows) - 1]
                del rows[-1], sampled[-1], ids[-1]
        if step is not None:
            step(len(verified), sum(1 + n for _, n in verified))
    if by_id and finished:  # the last requests' ends, as the runner hook hands them in a step that proposes nothing
        proposer.finish(finished)
    return {"times": times, "accept": accepted / max(steps, 1), "steps": len(times), "row_steps": steps,
            "tokens": accepted, "drafted": drafted, "drafts_accepted": drafts_accepted}


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = parser(__doc__)
    ap.add_argument("--concurrency", nargs="+", type=int_in(1), default=[1, 8, 32],
                    help="requests at once (default: 1 8 32).")
    ap.add_argument("--sets", nargs="+", default=["spec_bench", "humaneval"],
                    help="evaluation sets replayed, report half (default: spec_bench humaneval).")
    ap.add_argument("--k", type=int_in(1), default=8, help="num_speculative_tokens (default: 8).")
    ap.add_argument("--datastore", default="sharegpt", help="the datastore drafted from (default: sharegpt).")
    ap.add_argument("--no-replica", action="store_true", help="every step a round trip (CREST_REPLICAS=off).")
    ap.add_argument("--adaptive", action="store_true",
                    help="cut to a step-cost curve fitted on the calls' spacing, as in an engine (CREST_ADAPTIVE=1), "
                         "so the curve's refits are timed too; the flush (--flush-mb) is then the step's cost, flat "
                         "in its tokens, so the cut is not the engine's (default: the fixed cut).")
    ap.add_argument("--by-rows", action="store_true",
                    help="key the rows by their tokens, as the proposer does where our vLLM plugin is not loaded "
                         "(default: the step handed over by request id, as the plugin hands it).")
    ap.add_argument("--flush-mb", type=int_in(0), default=0, metavar="MIB",
                    help="MiB read between two calls, as a forward pass streams the weights (default: 0; SmolLM2-135M "
                         "fp32 in vLLM: 540).")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from datastore.shared import SharedDatastore
    from decoder.model import export_checkpoint
    from serving.vllm_proposer import CrestProposer
    from toolkit import load_tokenizer
    from toolkit.settings import Settings

    tok = load_tokenizer()
    checkpoint = str(export_checkpoint())
    flush = np.ones((args.flush_mb << 20) // 8) if args.flush_mb else None
    print(f"k {args.k}, datastore {args.datastore}, {'round trip' if args.no_replica else 'replica'}, "
          f"{'rows keyed by their tokens' if args.by_rows else 'by request id'}, "
          f"{'adaptive' if args.adaptive else 'fixed'} cut, "
          f"{args.flush_mb} MiB read between calls; ms per call")
    print(f"{'set':<11} {'conc':>4} {'steps':>6} {'p50':>7} {'p90':>7} {'p99':>7} {'mean':>7} {'accept':>6}")
    for name in args.sets:
        refs = [(r.prompt, r.output) for r in references(name, args.references)]
        for c in args.concurrency:
            # no engine here to fit a step cost to: the fixed cut (CREST_MIN_SCORE's default, as vLLM's first steps
            # use), unless --adaptive
            env = Settings.from_env()
            settings = replace(env, datastore=args.datastore, live=False, adaptive=args.adaptive,
                               replicas="off" if args.no_replica else env.replicas)
            proposer = CrestProposer(_config(args.k, checkpoint, len(tok)), settings)
            lookups = proposer.service.catalog.shared
            client = lookups.client if lookups is not None else None
            if isinstance(client, SharedDatastore) and client.replicas is not None:
                client.replicas.wait_ready(600)
            run(proposer, refs[:max(c, 8)], c, by_id=not args.by_rows)  # warm-up: connections, the page cache
            res = run(proposer, refs, c, flush, by_id=not args.by_rows)
            ms = np.asarray(res["times"]) * 1e3
            print(f"{name:<11} {c:>4} {res['steps']:>6} {np.median(ms):>7.3f} {np.percentile(ms, 90):>7.3f} "
                  f"{np.percentile(ms, 99):>7.3f} {ms.mean():>7.3f} {res['accept']:>6.2f}", flush=True)
            proposer.close()


if __name__ == "__main__":
    main()
