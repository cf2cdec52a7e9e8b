"""The live layer's automatic compaction (:class:`live.LiveCompactor`), measured on this machine.

1. Freshness: the time from a request's end in one decoding process to the first draft that uses its output in
   another. Process A hands an output to its :class:`live.LiveWriter` (what the merged drafter
   does when a request stops) every ``--every`` seconds on average (uniform in 0.5x..1.5x); process B drafts, through
   the real step (a :class:`drafting.DraftingService` reading the host replicas, live layer only, so every drafted
   token is the layer's), for each output's probe: a 5-token context of that output found in no earlier output, whose
   next token B's draft must start with. Both processes run a compactor with the default :class:`CompactionPolicy`
   (one compacts at a time, under the advisory lock), as two vLLM proposers would. Printed: p50, p90, p99, max.
   With ``--main-tokens``, the layer's main build first holds that many tokens of other outputs (ShareGPT
   conversations standing in, folded by ``python -m live compact``; their 5-grams are kept out of the probes), so each
   run measures the delta (``python -m live compact --delta``: the policy's default) beside a main build of that
   size; with ``--fold-tokens 0`` every compaction rebuilds the whole layer instead, as before the delta;
   ``--delta-tokens`` starts each run with a delta of that size (one near the fold: the largest a delta compaction
   gets). With ``--through feed``, B drafts from its output index instead, fed every process's outputs from the live
   layer's table (:class:`live.OutputFeed`): no compaction between A's output and B's draft.
2. Compaction cost against the layer's size: ``python -m live compact`` (what the compactor runs) on outputs of
   ``--sizes`` tokens (ShareGPT conversations standing in for outputs), twice (the layer's first fold, and the next
   one, which starts from the top-t that fitted): wall time, builds, peak RSS (the largest sum of the
   resident sets of the command's process tree, sampled every 20 ms; and its main process's ``VmHWM``), n-grams, bytes
   on disk.

Runs against ``DATABASE_URL`` (or the embedded server), under the datastore name ``--name``, removed afterwards.

    python -m benchmarks.live_layer [--outputs 40] [--every 1.0] [--main-tokens 0 1M 4M 16M]
        [--delta-tokens 0] [--fold-tokens N] [--through layer] [--sizes 100K 1M 4M] [--out FILE | --table]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import subprocess
import sys
import time

import numpy as np

from benchmarks._harness import finish, parser
from toolkit.options import int_in, parse_count, positive_float
from toolkit.settings import DEFAULTS

PROBE = 5  # context tokens of a probe (the datastore's largest n)


def _documents(tokenizer, tokens: int, skip: int = 0) -> list[np.ndarray]:
    """ShareGPT conversations, tokenized, until ``tokens`` tokens (after the first ``skip`` conversations)."""
    from ingest.sources import iter_documents

    _, batches = iter_documents("sharegpt", None, tokenizer=tokenizer)
    out: list[np.ndarray] = []
    total, seen = 0, 0
    for batch in batches:
        texts = batch.column(0).to_pylist()
        seen += len(texts)
        if seen <= skip:
            continue
        for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
            out.append(np.asarray(ids, dtype=np.uint32))
            total += len(ids)
            if total >= tokens:
                return out
    return out


def _gram_keys(tokens: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each 5-gram of ``tokens`` (``[n - 4]`` uint64; collisions only ever drop a probe)."""
    key = np.zeros(max(len(tokens) - PROBE + 1, 0), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(PROBE):
            key = key * np.uint64(1_000_003) + tokens[j:len(tokens) - PROBE + 1 + j].astype(np.uint64)
    return key


def _probes(outputs: list[np.ndarray], elsewhere: np.ndarray | None = None) -> tuple[list[np.ndarray],
                                                                                     list[tuple[list[int], int]]]:
    """The outputs that hold a 5-token context found nowhere else in ``outputs`` (nor among the 5-gram keys
    ``elsewhere``: the main build's outputs), and per output that context and the token after it (so the layer's tree
    of that context is this output's alone; a conversation repeated in the corpus has none and is left out)."""
    from collections import Counter

    grams = [[tuple(int(t) for t in out[j:j + PROBE]) for j in range(len(out) - PROBE)] for out in outputs]
    counts = Counter(g for gs in grams for g in gs)
    taken = [np.zeros(len(gs), bool) if elsewhere is None or not len(gs) else
             np.isin(_gram_keys(out)[:len(gs)], elsewhere) for out, gs in zip(outputs, grams)]
    kept, probes = [], []
    for out, gs, seen in zip(outputs, grams, taken):
        pick = next((j for j in range(len(gs) // 2, len(gs)) if counts[gs[j]] == 1 and not seen[j]), None)
        if pick is not None:
            kept.append(out)
            probes.append((list(gs[pick]), int(out[pick + PROBE])))
    return kept, probes


def _drafter(name: str, probes: list[tuple[list[int], int]], fold_tokens: int, through: str, inbox,
             outbox) -> None:
    """Process B: drafts each announced probe every 20 ms until its draft starts with the probe's next token, from
    the live layer's trees (``through="layer"``) or from its output index fed the fleet's outputs (``"feed"``)."""
    from datastore.layers import live_name
    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource, DraftingService
    from live import CompactionPolicy, LiveCompactor, LiveOutputs, OutputFeed
    from toolkit import load_tokenizer

    tok = load_tokenizer()
    source = DatastoreSource(lambda: SharedDatastore.open(name, tokenizer=tok, live=live_name(name)))
    service = DraftingService(source, vocab_size=len(tok), sources=("live",) if through == "layer" else ("outputs",))
    compactor = LiveCompactor(name, policy=CompactionPolicy(fold_tokens=fold_tokens))  # as live serve runs one
    feed = OutputFeed(service, LiveOutputs(name)) if through == "feed" else None
    lookups = source.client
    replicas = getattr(lookups, "replicas", None)
    if replicas is not None:
        replicas.wait_ready(600)  # the main build's replica is written before the clock starts
    outbox.put("ready")
    pending: dict[int, float] = {}
    done = 0
    while done < len(probes):
        while not inbox.empty():
            i = inbox.get()
            pending[i] = time.time()
        for i in list(pending):
            context, want = probes[i]
            service.start_request(i, context)
            got = service.step([i], [1], chain=True).chains().token_ids[0]
            service.stop_request(i)
            if got[:1] == [want]:
                outbox.put((i, time.time()))
                del pending[i]
                done += 1
        time.sleep(0.02)
    st = service.retrieval.stats
    outbox.put({"replica_steps": st.replica_steps, "round_trip_steps": st.round_trip_steps})
    if feed is not None:
        feed.close()
    compactor.close()
    service.close()


def freshness(name: str, outputs: list[np.ndarray], every: float, fold_tokens: int, elsewhere: np.ndarray | None,
              seed: int = 0, through: str = "layer") -> dict:
    """Process A (this one) appends ``outputs`` one by one; returns the latencies to process B's drafts, seconds."""
    from live import CompactionPolicy, LiveCompactor, LiveWriter

    outputs, probes = _probes(outputs, elsewhere)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    b = ctx.Process(target=_drafter, args=(name, probes, fold_tokens, through, inbox, outbox))
    b.start()
    assert outbox.get(timeout=900) == "ready"
    writer = LiveWriter(name, origin="bench-live-A")
    # A's own, as the live serve beside every engine runs one
    compactor = LiveCompactor(name, policy=CompactionPolicy(fold_tokens=fold_tokens))
    rng = random.Random(seed)
    ended: dict[int, float] = {}
    try:
        for i, out in enumerate(outputs):
            time.sleep(every * rng.uniform(0.5, 1.5))
            ended[i] = time.time()  # the request ends: its output goes to the writer
            writer.append(out.tolist())
            inbox.put(i)
            print(f"\r  output {i + 1}/{len(outputs)} appended", end="", file=sys.stderr, flush=True)
        seen: dict[int, float] = {}
        while len(seen) < len(outputs):
            i, t = outbox.get(timeout=600)
            seen[i] = t
        steps = outbox.get(timeout=60)  # B's steps: from the replicas, or by the round trip (a replica being written)
        print(file=sys.stderr)
    finally:
        b.join(60)
        writer.close()
        compactor.close()
    lat = np.array([seen[i] - ended[i] for i in range(len(outputs))])
    runs = [r for r in compactor.runs if r.result and r.result.get("build_id")]
    return {"outputs": len(outputs), "every_s": every, "fold_tokens": fold_tokens, "through": through,
            "p50_s": float(np.percentile(lat, 50)), "p90_s": float(np.percentile(lat, 90)),
            "p99_s": float(np.percentile(lat, 99)), "max_s": float(lat.max()),
            "compactions_by_A": {k: len([r for r in runs if r.kind == k]) for k in ("delta", "fold")},
            "drafter_steps": steps,
            "compaction_s_by_A": [(r.kind, round(r.seconds, 2)) for r in runs]}


def fill_main(name: str, docs: list[np.ndarray], tokens: int, delta_tokens: int) -> tuple[dict, np.ndarray | None]:
    """Fold ``tokens`` tokens of ``docs`` (as outputs) into ``name``'s live layer's main build, then compact the next
    ``delta_tokens`` tokens into its delta, by hand; returns what was done and the 5-gram keys of those outputs
    (``None`` for none: an empty layer)."""
    from datastore.admin.catalog import empty_live_layer
    from datastore.connection import connect, resolve_database_url
    from live.compaction import compact_delta, compact_live
    from live.store import encode_output

    url = resolve_database_url(None)
    empty_live_layer(url, name, wait_s=120)
    done: dict = {"tokens": 0, "delta_tokens": 0}
    kept: list[np.ndarray] = []
    for key, want, compact in (("tokens", tokens, compact_live), ("delta_tokens", delta_tokens, compact_delta)):
        batch, total = [], 0
        for d in docs[len(kept):]:
            if total >= want:
                break
            batch.append(d)
            total += len(d)
        if not batch:
            continue
        with connect(url, autocommit=True) as conn, conn.cursor().copy(
                "COPY live_outputs (name, tokens, num_tokens, origin) FROM STDIN") as cp:
            for d in batch:
                cp.write_row((name, encode_output(d.tolist()), len(d), "bench-before"))
        res = compact(name, database_url=url)
        kept += batch
        done |= {key: total, f"{key}_compact_s": round(res.seconds, 1), f"{key}_ngrams": res.as_dict()["ngrams"]}
    return done, np.unique(np.concatenate([_gram_keys(d) for d in kept])) if kept else None


class TreeRss:
    """Samples the summed resident set of process ``pid`` and its descendants every 20 ms on a thread; ``peak``,
    bytes."""

    def __init__(self, pid: int) -> None:
        import threading

        import psutil

        self.peak = 0
        self._root = psutil.Process(pid)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._done.wait(0.02):
            try:
                procs = [self._root, *self._root.children(recursive=True)]
                total = 0
                for p in procs:
                    try:
                        total += p.memory_info().rss
                    except psutil.NoSuchProcess:
                        pass
            except psutil.NoSuchProcess:
                return
            self.peak = max(self.peak, total)

    def stop(self) -> None:
        """Stop sampling."""
        self._done.set()
        self._thread.join()


def compaction_cost(name: str, docs: list[np.ndarray], tokens: int) -> dict:
    """Compact outputs of ``tokens`` tokens (the first of ``docs``) into ``name``'s live layer in a child process."""
    from datastore.admin.catalog import empty_live_layer
    from datastore.connection import connect, resolve_database_url
    from datastore.layers import live_name
    from live.store import encode_output

    url = resolve_database_url(None)
    empty_live_layer(url, name, wait_s=120)  # its builds counted from none
    kept, total = [], 0
    for d in docs:
        if total >= tokens:
            break
        kept.append(d)
        total += len(d)
    with connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM live_outputs WHERE name = %s", [name])
        with conn.cursor().copy("COPY live_outputs (name, tokens, num_tokens, origin) FROM STDIN") as cp:
            for d in kept:
                cp.write_row((name, encode_output(d.tolist()), len(d), "bench"))
    max_bytes = max(1024, int(total * 4 * 2 * 1.2))  # nothing evicted
    runs = []
    for _ in range(2):  # the first fold of the layer, then the next (under the same bound: from the top-t that fitted)
        t0 = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "live", "compact", "--name", name, "--max-bytes",
                                  str(max_bytes), "--json", "--quiet"], stdout=subprocess.PIPE,
                                 env=dict(os.environ, DATABASE_URL=url))
        assert child.stdout is not None
        sampler = TreeRss(child.pid)
        out = child.stdout.read()
        sampler.stop()
        if child.wait() != 0:
            raise RuntimeError(f"python -m live compact failed with exit code {child.returncode}")
        runs.append((time.perf_counter() - t0, sampler.peak, json.loads(out)))
    (wall, peak, result), (again, _, _) = runs
    with connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM datastores WHERE name = %s", [live_name(name)]).fetchone()
    return {"outputs": len(kept), "tokens": total, "wall_s": round(wall, 2), "again_wall_s": round(again, 2),
            "builds": None if row is None else int(row[0]), "top_t": result["top_t"],
            "compact_s": result["seconds"], "peak_rss_mib": round(peak / 2**20, 1),
            "process_peak_rss_mib": round(result["process_peak_rss_bytes"] / 2**20, 1),
            "ngrams": result["ngrams"], "bytes_on_disk": result["bytes_on_disk"]}


def build_parser() -> argparse.ArgumentParser:
    ap = parser(__doc__, out="live_layer.json", refs=False)
    ap.add_argument("--name", default="bench-live", help="datastore name used (and removed) (default: %(default)s).")
    ap.add_argument("--outputs", type=int_in(2), default=40, help="outputs timed for freshness (default: 40).")
    ap.add_argument("--every", type=positive_float, default=1.0,
                    help="mean seconds between two requests' ends in process A (default: 1.0).")
    ap.add_argument("--main-tokens", type=parse_count, nargs="+", default=[0],
                    help="the live layer's main build's size in tokens before each freshness run, e.g. 1M 4M 16M "
                         "(default: 0, an empty layer).")
    ap.add_argument("--delta-tokens", type=parse_count, default=0,
                    help="tokens of other outputs compacted into the delta before each freshness run, e.g. 240K (a "
                         "delta near the fold: its compactions' cost bounds freshness) (default: 0).")
    ap.add_argument("--fold-tokens", type=int_in(0), default=DEFAULTS.compact_fold_tokens,
                    help="the compactors' CREST_COMPACT_FOLD_TOKENS (default: %(default)s; 0: no delta, every "
                         "compaction rebuilds the whole layer).")
    ap.add_argument("--through", choices=("layer", "feed"), default="layer",
                    help="what B drafts from: the live layer's trees (layer), or its output index, fed every "
                         "process's outputs by a live.OutputFeed (feed) (default: layer).")
    ap.add_argument("--sizes", type=parse_count, nargs="*", default=[100_000, 1_000_000, 4_000_000],
                    help="live-layer sizes in tokens for the compaction cost (default: 100K 1M 4M; none: skip).")
    return ap


def measure(args: argparse.Namespace) -> dict:
    """Build the base datastore, run the freshness and compaction measurements, drop what it made."""
    from datastore.admin.catalog import drop_datastore
    from datastore.connection import connect, resolve_database_url
    from datastore.errors import DatastoreNotFound
    from datastore.layers import delta_name, live_name
    from ingest import BuildConfig, build_datastore
    from toolkit import load_tokenizer

    tok = load_tokenizer()
    url = resolve_database_url(None)
    print(f"base datastore {args.name!r}: 50 ShareGPT conversations", file=sys.stderr)
    build_datastore(BuildConfig(name=args.name, limit=50, top_t=10_000, database_url=url), progress=False)
    figures: dict = {"freshness": [], "compaction": []}
    try:
        # the outputs' conversations (a margin of 10K tokens each: 400K at the default 40), then the largest size's
        docs = _documents(tok, max(args.sizes + args.main_tokens) + args.delta_tokens + 10_000 * args.outputs, skip=50)
        outputs = [d[:400] for d in docs[:args.outputs] if len(d) > 50]  # the first 400 tokens of each
        for main_tokens in args.main_tokens:
            main, keys = fill_main(args.name, docs[args.outputs:], main_tokens, args.delta_tokens)
            fr = freshness(args.name, outputs, args.every, args.fold_tokens, keys, through=args.through)
            fr.update(main=main, every_s=args.every, fold_tokens=args.fold_tokens, through=args.through)
            figures["freshness"].append(fr)
        for size in args.sizes:
            row = compaction_cost(args.name, docs[args.outputs:], size)
            figures["compaction"].append(row)
    finally:
        with connect(url, autocommit=True) as conn:
            conn.execute("DELETE FROM live_outputs WHERE name = %s", [args.name])
        for n in (args.name, live_name(args.name), delta_name(args.name)):
            try:
                drop_datastore(url, n)
            except DatastoreNotFound:
                pass
    return figures


def report(figures: dict) -> None:
    """Print one line per freshness run and per compaction size."""
    for fr in figures["freshness"]:
        main = fr["main"]
        print(f"freshness, main build {main['tokens']:,} tokens (folded in {main.get('tokens_compact_s', 0)} s), "
              f"delta {main['delta_tokens']:,} tokens before the run, "
              f"{fr['outputs']} outputs, one every {fr['every_s']:.1f} s on average, fold at {fr['fold_tokens']:,} "
              f"tokens, B drafting through the {fr['through']}: "
              f"p50 {fr['p50_s']:.2f} s, p90 {fr['p90_s']:.2f} s, p99 {fr['p99_s']:.2f} s, max "
              f"{fr['max_s']:.2f} s; A compacted {fr['compactions_by_A']} ({fr['compaction_s_by_A']} s); B's steps "
              f"{fr['drafter_steps']}")
    for row in figures["compaction"]:
        print(f"compaction of {row['outputs']:,} outputs, {row['tokens']:,} tokens: {row['wall_s']:.1f} s wall "
              f"(python -m live compact {row['compact_s']:.1f} s; the next fold {row['again_wall_s']:.1f} s; "
              f"{row['builds']} builds in all, top-t {row['top_t']:,}), peak RSS {row['peak_rss_mib']:.0f} MiB "
              f"(its main process {row['process_peak_rss_mib']:.0f}), "
              f"{row['ngrams']:,} n-grams, {row['bytes_on_disk']:,} bytes on disk")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    finish(args, lambda: measure(args), report, "freshness", "compaction")


if __name__ == "__main__":
    main()
