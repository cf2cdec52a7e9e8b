"""The node scores refitted online on the engine's verdicts (``csrc/online.hpp``, issue 81): accept length over a
stream of requests with the shipped calibration frozen, refitted online from it, and refitted from a flat start (a new
tenant whose datastore has no calibration); and a fleet of two processes that share one fit through the database.

**Stream.** Each set's ``--half`` replayed in file order (:func:`evaluation.simulate.replay`: the steps of a lossless
greedy run), one drafter per variant, ``merged`` as :mod:`benchmarks.peers` drafts it (the chat sets from ShareGPT,
HumanEval from the standard library): ``frozen`` (``online_strength=0``), ``online`` (the default: the shipped
calibration as the prior), ``flat`` (:meth:`drafting.Calibration.flat`: every node a coin flip until the verdicts say
otherwise) and ``flat-warmed``, the converged flat start: a fresh drafter (its output index empty) from the fit a flat
start learnt on the set's other half (replayed before, not scored; handed over as a fleet's fit is,
:meth:`drafting.DraftingService.fold_fit`). A step is scored with what the steps before it taught, never its own,
and nothing learnt on a scored prompt is scored again. Printed: accept length over the stream and per ``--window``
requests, and the flat start's convergence: the first request from which every window's accept length is at least 95%
of the converged one's over the same requests.

**Fleet** (``--fleet``): the stream split in two halves, process A (a forked child) replays the first with a
:class:`live.FitFeed` folding its verdicts into ``calibration_fits`` (under a name of this run's, removed after), then
process B starts, takes the fleet's fit at its first fold and replays the second half; beside it, B alone (from the
shipped prior). Printed: B's accept length over its first ``--window`` requests and over its half, both ways.

    python -m benchmarks.online_fit --sets bfcl spec_bench humaneval --budget 8
    python -m benchmarks.online_fit --sets bfcl --fleet
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
import uuid

from crest_native import MAX_BUDGET
from evaluation.references import Reference
from evaluation.simulate import replay
from toolkit.options import int_in

from ._harness import finish, parser, references, require_clean

VARIANTS = ("frozen", "online", "flat", "flat-warmed")
OTHER_HALF = {"report": "fit", "fit": "report"}


def _datastore(name: str, args) -> str:
    return args.code_datastore if name == "humaneval" else args.datastore


def _drafter(variant: str, datastore: str, fleet_name: str | None = None, share: int | None = None):
    """``merged`` with the calibration ``variant`` (:data:`VARIANTS`); ``fleet_name``: its fit shared under that
    name; ``share``: its ``online_share`` (default: the fleet's, given a name)."""
    from datastore.shared import SharedDatastore
    from drafting import Calibration, DatastoreCatalog, DatastoreSource, DraftingService
    from live import SHARE
    from toolkit import load_tokenizer

    tok = load_tokenizer()
    source = DatastoreSource(lambda: SharedDatastore.open(datastore, tokenizer=tok, replicas=False))
    calibration = Calibration.load().flat() if variant.startswith("flat") else Calibration.load()
    return DraftingService(DatastoreCatalog(source, fleet_name or datastore), vocab_size=len(tok),
                           calibration=calibration, online_strength=0.0 if variant == "frozen" else None,
                           online_share=share if share is not None else SHARE if fleet_name else None)


def _replay(service, refs: list[Reference], budget: int, chain: bool) -> list[tuple[int, int]]:
    """``(tokens, steps)`` of each request, in order."""
    out = []
    for r in refs:
        res = replay(service, r.prompt, r.output, budget=budget, chain=chain)
        out.append((len(res.output_ids) - 1, len(res.steps)))
    return out


def _rate(rows: list[tuple[int, int]] | list[list[int]]) -> float:
    return sum(r[0] for r in rows) / max(sum(r[1] for r in rows), 1)


def converged_at(rows: list[tuple[int, int]], converged: list[tuple[int, int]], window: int) -> int | None:
    """The first request from which every ``window`` of requests of ``rows`` has at least 95% of ``converged``'s accept
    length over the same requests (``None``: none such)."""
    starts = range(0, max(len(rows) - window + 1, 1))
    ok = [_rate(rows[s:s + window]) >= 0.95 * _rate(converged[s:s + window]) for s in starts]
    for s in starts:
        if all(ok[s:]):
            return s
    return None


def _fleet_child(datastore: str, fleet_name: str, refs: list[Reference], budget: int, chain: bool, out) -> None:
    """Process A: the first half, its verdicts folded into the fleet's fit (closing the feed folds the last)."""
    from live import FitFeed

    service = _drafter("online", datastore, fleet_name)
    feed = FitFeed(service)
    try:
        rows = _replay(service, refs, budget, chain)
        feed.close()
        out.put((rows, service.fit()[2]))
    finally:
        service.close()


def _fleet(name: str, args, refs: list[Reference]) -> dict:
    from datastore.connection import connect, resolve_database_url
    from live import FitFeed

    datastore, chain = _datastore(name, args), args.form == "chain"
    fleet_name = f"bench-online-{uuid.uuid4().hex[:8]}"
    half = len(refs) // 2
    ctx = mp.get_context("fork")
    q: mp.Queue = ctx.Queue()
    try:
        a = ctx.Process(target=_fleet_child, args=(datastore, fleet_name, refs[:half], args.budget, chain, q))
        a.start()
        rows_a, folded = q.get(timeout=3600)
        a.join(60)
        b = _drafter("online", datastore, fleet_name)
        feed = FitFeed(b)
        feed.flush(60)  # B's first fold: the fleet's fit
        adopted = b.fit()[2]
        rows_b = _replay(b, refs[half:], args.budget, chain)
        feed.close()
        b.close()
        alone = _drafter("online", datastore)
        rows_alone = _replay(alone, refs[half:], args.budget, chain)
        alone.close()
    finally:
        with connect(resolve_database_url(None), autocommit=True) as conn:
            conn.execute("DELETE FROM calibration_fits WHERE name = %s", [fleet_name])
    w = args.window
    return {"set": name, "a_requests": half, "a_accept": _rate(rows_a), "a_folded": folded, "b_adopted": adopted,
            "b_requests": len(refs) - half, "b_first": _rate(rows_b[:w]), "alone_first": _rate(rows_alone[:w]),
            "b_all": _rate(rows_b), "alone_all": _rate(rows_alone)}


def measure(args) -> dict:
    out: dict = {"budget": args.budget, "form": args.form, "window": args.window, "half": args.half, "stream": [],
                 "fleet": []}
    for name in args.sets:
        refs = references(name, args.references, args.half)
        require_clean(_datastore(name, args), name, [r.id for r in refs])
        if args.fleet:
            out["fleet"].append(_fleet(name, args, refs))
            continue
        got: dict[str, list] = {}
        for variant in VARIANTS:
            if variant == "flat-warmed" and args.half not in OTHER_HALF:
                continue
            service = _drafter(variant, _datastore(name, args))
            if variant == "flat-warmed":  # the fit a flat start learnt on the other half, nothing else of that run
                warm = _drafter(variant, _datastore(name, args), share=1 << 40)
                _replay(warm, references(name, args.references, OTHER_HALF[args.half]), args.budget,
                        args.form == "chain")
                (key,) = warm.fits()
                service.fold_fit(key, warm.fold_fit(key, None))
                warm.close()
            t0 = time.perf_counter()
            rows = got[variant] = _replay(service, refs, args.budget, args.form == "chain")
            wall = time.perf_counter() - t0
            outcomes = service.fit()[2]
            service.close()
            out["stream"].append({"set": name, "variant": variant, "requests": len(rows), "accept": _rate(rows),
                                  "windows": [_rate(rows[s:s + args.window]) for s in range(0, len(rows), args.window)],
                                  "verdicts": outcomes, "ms_per_step": 1e3 * wall / max(sum(r[1] for r in rows), 1),
                                  "rows": rows})
            print(f"{name} {variant}: {out['stream'][-1]['accept']:.3f} ({len(rows)} requests, {outcomes:,} verdicts "
                  f"learnt)", flush=True)
        if "flat-warmed" in got:
            out["stream"][-2]["converged_at"] = converged_at(got["flat"], got["flat-warmed"], args.window)
    return out


def print_tables(doc: dict) -> None:
    w = doc["window"]
    if doc["stream"]:
        print(f"\naccept length, {doc['form']} {doc['budget']}, the {doc['half']} half in file order; per {w} requests")
        print(f"{'set':<12}{'variant':<12}{'all':>7}  {'vs frozen':>9}  {'95% at':>7}  windows")
        frozen = {r["set"]: r["accept"] for r in doc["stream"] if r["variant"] == "frozen"}
        for r in doc["stream"]:
            at = "" if "converged_at" not in r else "never" if r["converged_at"] is None else str(r["converged_at"])
            print(f"{r['set']:<12}{r['variant']:<12}{r['accept']:>7.3f}  {r['accept'] / frozen[r['set']]:>9.3f}  "
                  f"{at:>7}  {' '.join(f'{v:.2f}' for v in r['windows'])}")
    if doc["fleet"]:
        print(f"\nfleet of two: B's accept length, {doc['form']} {doc['budget']}, with the fit A folded and alone")
        print(f"{'set':<12}{'A reqs':>7}{'A folded':>10}{'B adopted':>11}{'B first ' + str(w):>12}"
              f"{'alone':>8}{'B half':>9}{'alone':>8}")
        for r in doc["fleet"]:
            print(f"{r['set']:<12}{r['a_requests']:>7}{r['a_folded']:>10,}{r['b_adopted']:>11,}{r['b_first']:>12.3f}"
                  f"{r['alone_first']:>8.3f}{r['b_all']:>9.3f}{r['alone_all']:>8.3f}")


def build_parser() -> argparse.ArgumentParser:
    ap = parser(__doc__, out="online_fit.json")
    ap.add_argument("--sets", nargs="+", default=["bfcl", "spec_bench", "humaneval"],
                    help="the streams (default: bfcl spec_bench humaneval).")
    ap.add_argument("--half", choices=("report", "fit", "all"), default="report",
                    help="which prompts of each set (default: report; the settings were chosen on the fit halves).")
    ap.add_argument("--budget", type=int_in(1, MAX_BUDGET), default=8,
                    help="draft tokens or nodes a step (default: 8).")
    ap.add_argument("--form", choices=("chain", "tree"), default="chain", help="default: chain.")
    ap.add_argument("--window", type=int_in(1), default=20, help="requests per window (default: 20).")
    ap.add_argument("--fleet", action="store_true", help="the fleet of two instead of the stream (module docstring).")
    ap.add_argument("--datastore", default="sharegpt", help="the chat sets' datastore (default: sharegpt).")
    ap.add_argument("--code-datastore", default="code", help="HumanEval's datastore (default: code).")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    finish(args, lambda: measure(args), print_tables, "stream", "fleet")


if __name__ == "__main__":
    main()
