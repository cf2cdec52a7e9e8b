"""The live layer on a request stream: accept length over a stream of requests where later ones resemble
earlier ones, served by TWO decoder processes that share one live layer, against SuffixDecoding's
in-process global tree of responses.

Streams (held-out halves, by replay of the saved greedy outputs, ``benchmarks/references.py``):

- ``chat``: each Spec-Bench question's first turn, followed by its second turn (asked after the model's
  own first answer) where it has one;
- ``code``: the HumanEval prompts in order (they share helpers and idioms).

Requests alternate between decoder process A and B. Every ``--window`` requests, each process hands its
finished outputs to its :class:`datastore.admin.live_writer.LiveWriter` (an INSERT-only role would do), the stream
waits for the writes, and ``ingest.live.compact_live`` folds them into the live layer (the datastore
``<name>.live``), which both processes then read (a compaction exactly every window: the layer's best case). Drafters:

- ``ours``: merged, calibrated, back-off lookup, no live layer;
- ``ours+live``: the same plus the live layer shared by A and B; ``ours+live-own``: each process has a
  live layer of its own outputs only (so ``ours+live`` > ``ours+live-own`` is what A and B gain from
  each other);
- ``ours+auto``: the shared live layer kept fresh by the processes' own compactors (:class:`drafting.LiveCompactor`,
  default policy, one compacting at a time) with no compaction step in the stream; each request takes ``--pace``
  seconds of wall time (a stand-in for its decoding), so the layer lags the stream by what compaction really takes;
- ``suffix``: SuffixDecoding with ONE global tree that sees every earlier response at once (its best case:
  one process serving the whole stream); ``suffix-2proc``: one global tree per process.

    .venv/bin/python benchmarks/stream.py [--budgets 3 8] [--window 8]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _refs import REPO, half, load_references, references_option, require_clean_datastore  # noqa: E402
from crest_native import MAX_BUDGET  # noqa: E402
from datastore.live import LIVE_MAX_BYTES, LIVE_TOP_T  # noqa: E402
from evaluation.simulate import replay  # noqa: E402
from peers import SuffixMethod  # noqa: E402
from toolkit.options import int_in, positive_float  # noqa: E402


def streams(which: str, references: Path) -> dict[str, list]:
    """The request streams: ``name -> [Reference, ...]`` in serving order, from the references in ``references``."""
    out = {}
    chat = half(load_references("spec_bench", references), which)
    second = {r.id.split("/")[0]: r for r in load_references("spec_bench_turn2", references)}
    out["chat"] = [x for r in chat for x in ([r, second[r.id]] if r.id in second else [r])]
    out["code"] = half(load_references("humaneval", references), which)
    return out


def _worker(conn, datastore: str, live_name_for: str | None, pace: float | None = None) -> None:
    """One decoder process: a DraftingService (calibrated, optional live layer), replays what it is sent; with ``pace``
    (seconds a request takes), its live layer is compacted by its own compactor and followed as it is swapped in."""
    from datastore.admin.live_writer import LiveWriter
    from datastore.live import live_name
    from datastore.shared import SharedDatastore
    from drafting import CompactionPolicy, DatastoreSource, DraftingService, LiveCompactor, MergedMethod
    from toolkit import load_tokenizer

    tok = load_tokenizer()
    layer = None if live_name_for is None else live_name(live_name_for)  # read with the datastore, once it is built
    source = DatastoreSource(lambda: SharedDatastore.open(datastore, tokenizer=tok, live=layer, replicas=False))
    writer = None if live_name_for is None else LiveWriter(live_name_for, origin=f"stream-{live_name_for}")
    compactor = None
    if pace is not None and live_name_for is not None:
        compactor = LiveCompactor(live_name_for, policy=CompactionPolicy())
    method = MergedMethod(source, vocab_size=len(tok), live_writer=writer, compactor=compactor)
    service = DraftingService(method, vocab_size=len(tok))
    while True:
        msg = conn.recv()
        if msg is None:
            break
        kind, payload = msg
        if kind == "live":  # the layer exists now (or was rebuilt): follow it before the next requests
            if source.client is not None:
                cast(SharedDatastore, source.client).refresh()
            conn.send(True)
            continue
        refs, budget, chain, record = payload
        method.live_writer = writer if record else None
        got = []
        for r in refs:
            t0 = time.perf_counter()
            res = replay(service, r.prompt, r.output, budget=budget, chain=chain)
            got.append((len(res.output_ids) - 1, len(res.steps)))
            if pace is not None:
                time.sleep(max(0.0, pace - (time.perf_counter() - t0)))
        if writer is not None:
            writer.flush(60)
        conn.send(got)
    if writer is not None:
        writer.close()
    if compactor is not None:
        compactor.close()


def _run_ours(stream, args, budget: int, chain: bool, mode: str, tag: str, datastore: str) -> list[tuple[int, int]]:
    """Replay ``stream`` on two worker processes; ``mode``: ``none`` | ``shared`` | ``own`` live layer, or ``auto``
    (shared, compacted by the workers' own compactors)."""
    from datastore.admin.catalog import empty_live_layer
    from datastore.connection import resolve_database_url
    from ingest.live import compact_live

    by_mode: dict[str, list[str | None]] = {"none": [None, None], "shared": [f"stream-{tag}"] * 2,
                                            "own": [f"stream-{tag}-a", f"stream-{tag}-b"],
                                            "auto": [f"stream-{tag}-auto"] * 2}
    names = by_mode[mode]
    for n in set(filter(None, names)):  # an earlier run's layer holds this stream's outputs: every run starts empty
        empty_live_layer(resolve_database_url(None), n, wait_s=120)
    ctx = mp.get_context("fork")
    pipes, procs = [], []
    for layer in names:
        a, b = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(b, datastore, layer, args.pace if mode == "auto" else None), daemon=True)
        p.start()
        pipes.append(a)
        procs.append(p)
    results: list[tuple[int, int]] = [None] * len(stream)  # type: ignore[list-item]
    try:
        for start in range(0, len(stream), args.window):
            idx = list(range(start, min(start + args.window, len(stream))))
            for w in (0, 1):
                mine = [i for i in idx if i % 2 == w]
                pipes[w].send(("replay", ([stream[i] for i in mine], budget, chain, mode != "none")))
            for w in (0, 1):
                for i, got in zip([i for i in idx if i % 2 == w], pipes[w].recv()):
                    results[i] = got
            if mode in ("shared", "own") and start + args.window < len(stream):
                for n in sorted(set(cast(list[str], names))):  # mode != "none": every worker has a layer
                    compact_live(n, top_t=args.live_top_t, max_bytes=args.live_max_bytes)
                for w in (0, 1):
                    pipes[w].send(("live", None))
                    pipes[w].recv()
    finally:
        for a, p in zip(pipes, procs):
            a.send(None)
            p.join(30)
    return results


def _run_suffix(stream, budget: int, chain: bool, processes: int) -> list[tuple[int, int]]:
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    from drafting import DraftingService
    from toolkit import load_tokenizer

    vocab = len(load_tokenizer())
    drafters = [DraftingService(SuffixMethod(SuffixDecodingCache(max_tree_depth=24)), vocab_size=vocab)
                for _ in range(processes)]
    out = []
    for i, r in enumerate(stream):
        res = replay(drafters[i % processes], r.prompt, r.output, budget=budget, chain=chain)
        out.append((len(res.output_ids) - 1, len(res.steps)))
    return out


def _summary(got: list[tuple[int, int]], parts: int = 4) -> dict:
    tok, steps = sum(t for t, _ in got), sum(s for _, s in got)
    size = -(-len(got) // parts)
    quarters = [got[i:i + size] for i in range(0, len(got), size)]
    return {"accept_length": tok / max(steps, 1),
            "by_part": [sum(t for t, _ in q) / max(sum(s for _, s in q), 1) for q in quarters]}


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--budgets", nargs="+", type=int_in(1, MAX_BUDGET), default=[3, 8],
                    help="draft nodes per step (default: 3 8).")
    ap.add_argument("--forms", nargs="+", choices=("tree", "chain"), default=["tree", "chain"],
                    help="draft forms replayed (default: tree chain).")
    ap.add_argument("--half", choices=("report", "fit", "all"), default="report",
                    help="which prompts make the streams (default: report).")
    ap.add_argument("--streams", nargs="+", choices=("chat", "code"), default=["chat", "code"],
                    help="request streams: Spec-Bench's two turns, or HumanEval (default: chat code).")
    ap.add_argument("--window", type=int_in(1), default=8, help="requests between two compactions of the live layer.")
    ap.add_argument("--datastore", default="sharegpt", help="the chat stream's datastore.")
    ap.add_argument("--code-datastore", default="code", help="the code stream's datastore.")
    ap.add_argument("--live-top-t", type=int_in(1), default=LIVE_TOP_T,
                    help="n-grams per n kept by each compaction of the live layer (default: 200000).")
    ap.add_argument("--live-max-bytes", type=int_in(1), default=LIVE_MAX_BYTES,
                    help="the live layer's byte bound at compaction (default: 268435456).")
    ap.add_argument("--methods", nargs="+",
                    default=["ours", "ours+live", "ours+live-own", "ours+auto", "suffix", "suffix-2proc"],
                    help="drafters run on the streams (default: all six).")
    ap.add_argument("--pace", type=positive_float, default=1.0,
                    help="ours+auto: wall seconds each request takes, its decoding's stand-in (default: 1.0).")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "stream.json",
                    help="the results' JSON file (default: results/stream.json).")
    ap.add_argument("--table", action="store_true", help="only print an earlier run's --out.")
    references_option(ap)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    if args.table:
        return _print(json.loads(args.out.read_text()))
    rows = []
    gated = (("chat", args.datastore, "spec_bench"), ("code", args.code_datastore, "humaneval"))
    for name, datastore, eval_set in gated:
        if name in args.streams:  # the corpus must not hold the stream's prompts
            scored = half(load_references(eval_set, args.references), args.half)
            require_clean_datastore(datastore, eval_set, [r.id for r in scored])
    for name, stream in streams(args.half, args.references).items():
        if name not in args.streams:
            continue
        for budget in args.budgets:
            for form in args.forms:
                chain = form == "chain"
                for m in args.methods:
                    t0 = time.perf_counter()
                    if m.startswith("suffix"):
                        got = _run_suffix(stream, budget, chain, 2 if m == "suffix-2proc" else 1)
                    else:
                        mode = {"ours": "none", "ours+live": "shared", "ours+live-own": "own", "ours+auto": "auto"}[m]
                        got = _run_ours(stream, args, budget, chain, mode, name,
                                        args.code_datastore if name == "code" else args.datastore)
                    row = {"stream": name, "requests": len(stream), "budget": budget, "form": form, "method": m,
                           **_summary(got), "seconds": time.perf_counter() - t0}
                    rows.append(row)
                    print(f"{name} budget {budget} {form} {m}: {row['accept_length']:.3f} "
                          f"(by quarter {' '.join(f'{x:.2f}' for x in row['by_part'])}; {row['seconds']:.0f} s)",
                          flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    _print(rows)
    print(f"wrote {args.out}")


def _print(rows: list[dict]) -> None:
    methods = list(dict.fromkeys(r["method"] for r in rows))
    print(f"{'stream':<6} {'budget':>6} {'form':<5} " + " ".join(f"{m:>14}" for m in methods)
          + "  live/ours  live/suffix")
    for key in dict.fromkeys((r["stream"], r["budget"], r["form"]) for r in rows):
        got = {r["method"]: r["accept_length"] for r in rows if (r["stream"], r["budget"], r["form"]) == key}
        cells = " ".join(f"{got.get(m, float('nan')):>14.3f}" for m in methods)
        live, ours, suf = got.get("ours+live"), got.get("ours"), got.get("suffix")
        r1 = f"{live / ours:.3f}" if live and ours else "-"
        r2 = f"{live / suf:.3f}" if live and suf else "-"
        print(f"{key[0]:<6} {key[1]:>6} {key[2]:<5} {cells}  {r1:>9}  {r2:>11}")


if __name__ == "__main__":
    main()
