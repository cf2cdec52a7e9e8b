"""``python -m live compact``: fold decoders' finished outputs into the live layer ``NAME.live`` (or only the new ones
into its delta, ``--delta``), once, e.g. from cron (:mod:`live.compaction`). ``python -m live serve``: keep live layers
compacted on their own (:class:`live.LiveCompactor`, one per datastore), beside the engines, until stopped
(``python -m serving`` starts one beside vLLM). Needs the ``ingest`` extra.
"""

from __future__ import annotations

import argparse
import json
import logging

from toolkit.options import database_options, datastore_name, parse_count
from toolkit.settings import DEFAULTS

__all__ = ["build_parser", "main"]


def _layer_bytes(text: str) -> int:
    value = parse_count(text)
    if value < 1024:
        raise argparse.ArgumentTypeError(f"{text!r}: the live layer's bound must be >= 1024 bytes (e.g. 256M)")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m live", description="The live layer of a datastore.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compact", parents=[database_options()],
                       help="fold decoders' finished outputs into the live layer NAME.live (top-t rule).",
                       description="Keep the newest outputs appended for NAME within half of --max-bytes (evict older "
                                   "ones), count their n-grams, keep the top-t per n and build their trees into the "
                                   "datastore NAME.live (swapped in atomically), whose trees fit in the other half. "
                                   "Drafting services run it on their own (CREST_COMPACT); this runs it once, e.g. "
                                   "from cron. Does nothing while another compaction of NAME runs (one per datastore, "
                                   "across hosts); decoders never wait for it.")
    c.add_argument("--name", type=datastore_name, default=DEFAULTS.datastore,
                   help="the datastore whose outputs to compact (default: %(default)s).")
    c.add_argument("--top-t", type=parse_count, default=DEFAULTS.live_top_t,
                   help="n-grams kept per n, e.g. 200K (default: %(default)s).")
    c.add_argument("--max-bytes", type=_layer_bytes, default=DEFAULTS.live_max_bytes,
                   help="the layer's size bound in bytes, e.g. 256M: half for the outputs kept, half for the trees "
                        "(default: %(default)s).")
    c.add_argument("--delta", action="store_true",
                   help="compact only the outputs appended after the newest one the layer's main build holds, into "
                        "its delta NAME.live.delta, which readers take with NAME.live: a compaction that costs what "
                        "the new outputs cost, whatever the layer's size (drafting services alternate the two on their "
                        "own: CREST_COMPACT_FOLD_TOKENS). Deletes nothing; one delta compaction of NAME at a time, "
                        "beside at most one of the whole layer.")
    c.add_argument("--json", action="store_true", help="print the result as JSON.")
    c.add_argument("--quiet", action="store_true", help="no progress bars.")
    v = sub.add_parser("serve", parents=[database_options()],
                       help="keep live layers compacted, beside the engines that append to them, until stopped.",
                       description="Compact the live layer of each NAME whenever it is due (CREST_COMPACT_OUTPUTS, "
                                   "CREST_COMPACT_AFTER_S, CREST_COMPACT_GAP_S, CREST_COMPACT_FOLD_TOKENS, "
                                   "CREST_LIVE_TOP_T, CREST_LIVE_MAX_BYTES), each compaction a child process at the "
                                   "lowest CPU priority, until SIGTERM or SIGINT; at most one compaction of a layer at "
                                   "a time across the fleet (a second serve of the same NAME waits its turn). "
                                   "python -m serving starts one beside the engine (CREST_COMPACT=1); run it "
                                   "yourself on any host that reaches the database (a host with a free core is best).")
    v.add_argument("--name", type=datastore_name, action="append", metavar="NAME",
                   help="a datastore whose live layer to compact; repeat for several (default: CREST_DATASTORE and "
                        "CREST_DATASTORES).")
    return p


def _serve(args) -> None:
    """Run a compactor per datastore until SIGTERM or SIGINT (their compactions in flight are stopped: the previous
    builds keep serving)."""
    import signal
    import threading

    from toolkit.settings import Settings

    from .compactor import LiveCompactor
    from .policy import CompactionPolicy

    s = Settings.from_env()
    names = args.name or [s.datastore, *(s.datastores or ())]
    policy = CompactionPolicy(outputs=s.compact_outputs, after_s=s.compact_after_s, gap_s=s.compact_gap_s,
                              fold_tokens=s.compact_fold_tokens, top_t=s.live_top_t, max_bytes=s.live_max_bytes)
    url = args.database_url or s.compact_url or s.database_url
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    compactors = [LiveCompactor(name, url, policy) for name in dict.fromkeys(names)]
    print(f"compacting the live layers of {', '.join(c.name for c in compactors)} (SIGTERM or Ctrl-C stops)",
          flush=True)
    try:
        stop.wait()
    finally:
        for compactor in compactors:
            compactor.close()


def _compact(args) -> None:
    from ingest.cli import peak_rss

    from .compaction import compact_delta, compact_live

    compact = compact_delta if args.delta else compact_live
    result = compact(args.name, top_t=args.top_t, max_bytes=args.max_bytes, database_url=args.database_url,
                     progress=not args.quiet)
    if args.json:
        print(json.dumps(result.as_dict() | peak_rss(), indent=2))
        return
    d = result.as_dict()
    if result.busy:
        print(f"another compaction of {d['layer']!r} is running (it holds its compactor lock): nothing done")
        return
    if result.build is None:
        print(f"no outputs appended for {args.name!r} (evicted {d['evicted']}): {d['layer']} unchanged")
        return
    print(f"{d['layer']}: {d['outputs']:,} outputs, {d['tokens']:,} tokens -> {d['ngrams']:,} n-grams, "
          f"{d['bytes_on_disk']:,} bytes (top-t {d['top_t']:,}); evicted {d['evicted']:,} older outputs; "
          f"{d['seconds']:.1f} s")
    for pending in result.build.pending_drops:
        print(f"not dropped yet: {pending}")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (0 ok, 2 bad input, 1 failure, 130 interrupted)."""
    from datastore.errors import BadDatabaseUrl, DatastoreError
    from toolkit.console import EXIT_OK, error, run
    from toolkit.extras import MissingExtra, require

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    def command() -> int:
        try:
            require("duckdb", "ingest", f"python -m live {args.command}")
            (_serve if args.command == "serve" else _compact)(args)
        except KeyboardInterrupt:
            error("interrupted: nothing half-built is visible; the previous live build still serves")
            return 130
        return EXIT_OK

    return run(command, usage=(ValueError, BadDatabaseUrl, MissingExtra), failures=(DatastoreError,))
