"""Memory of drafting processes that share one host-local replica: PSS (proportional set size: shared pages split among
the processes that map them), USS (private pages) and RSS, of one process alone and of each of ``--processes`` drafting
at once, per datastore.

Each process is a merged drafter over the datastore's replica (:mod:`datastore.replica`; written once on this host,
untimed, before the runs), replaying the report half of a set's greedy references (``python -m evaluation references``)
as
:mod:`benchmarks.service_step` does, ``--batch`` requests at a time; when every process is done (a barrier), each reads
its own ``/proc/self/smaps`` (the whole process and the replica's mapping). A replica's pages are in the page cache once
and mapped by every process, so each of N processes' PSS holds a 1/N share of them; what one process adds is its
private memory, which must not grow with the datastore's size.

    python -m benchmarks.replica_memory [--processes 4] [--datastores sharegpt code] [--datastore sharegpt]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
from pathlib import Path

from toolkit.options import int_in

from ._harness import parser, references

SETS = {"sharegpt": "spec_bench", "code": "humaneval"}
"""Each corpus and the set replayed on it."""


def memory(path: str) -> dict:
    """This process's ``Rss``, ``Pss`` and private (USS) kB, and those of the mapping of file ``path``, from
    ``/proc/self/smaps``."""
    total = {"rss": 0, "pss": 0, "uss": 0}
    mapped = {"rss": 0, "pss": 0}
    current = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if not head:
            continue
        if not head[0].endswith(":"):  # a mapping's first line: address perms offset dev inode [path]
            current = head[5] if len(head) > 5 else None
            continue
        if len(head) < 2 or not head[1].isdigit():  # not a size (VmFlags, ...)
            continue
        key, value = head[0][:-1], int(head[1])
        for k, field in (("rss", "Rss"), ("pss", "Pss")):
            if key == field:
                total[k] += value
                if current == path:
                    mapped[k] += value
        if key in ("Private_Clean", "Private_Dirty"):
            total["uss"] += value
    return {**{k: v / 1024 for k, v in total.items()}, **{f"replica_{k}": v / 1024 for k, v in mapped.items()}}


def worker(datastore: str, set_name: str, batch: int, folder: Path, barrier, results) -> None:
    """One drafting process: the merged drafter over the replica, replaying the set's report half."""
    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource, DraftingService
    from toolkit import load_tokenizer

    from .service_step import run_set

    tok = load_tokenizer()
    client = SharedDatastore.open(datastore, tokenizer=tok)
    if client.replicas is None or not client.replicas.wait_ready(600):
        raise SystemExit(f"no replica of {datastore!r} (CREST_REPLICAS=off?)")
    service = DraftingService(DatastoreSource(lambda: client), vocab_size=len(tok))
    refs = [(r.prompt, r.output) for r in references(set_name, folder)]
    for start in range(0, len(refs), batch):
        run_set(service, refs[start:start + batch], batch, 8, True, 0.1)
    stores = client.stores()
    if stores is None or service.retrieval.stats.round_trip_steps:
        raise SystemExit(f"the replica of {datastore!r} went away mid-run: steps drafted by the round trip")
    barrier.wait()  # every process has drafted: the replica's pages are shared by all of them now
    results.put(memory(stores.datastore.path) | {"steps": service.retrieval.stats.replica_steps})
    barrier.wait()  # no process leaves (unmapping its pages) before every one has measured
    client.close()


def run(datastore: str, set_name: str, processes: int, batch: int, references: Path) -> list[dict]:
    """``processes`` drafting processes over ``datastore``'s replica at once, replaying ``set_name``; each one's
    memory."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(datastore, set_name, batch, references, barrier, results))
             for _ in range(processes)]
    for p in procs:
        p.start()
    got = [results.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            raise SystemExit(f"a drafting process of {datastore!r} failed (exit {p.exitcode})")
    return got


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = parser(__doc__)
    ap.add_argument("--processes", type=int_in(2), default=4, help="processes drafting at once (default: 4).")
    ap.add_argument("--datastores", nargs="+", choices=list(SETS), default=list(SETS),
                    help="corpora drafted from, each with its set: sharegpt (Spec-Bench), code (HumanEval) "
                         "(default: both).")
    ap.add_argument("--datastore", default="sharegpt",
                    help="the sharegpt corpus's datastore (default: sharegpt).")
    ap.add_argument("--code-datastore", default="code", help="the code corpus's datastore (default: code).")
    ap.add_argument("--batch", type=int_in(1), default=8, help="requests in flight per process (default: 8).")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from datastore.shared import SharedDatastore
    from toolkit import load_tokenizer

    tok = load_tokenizer()
    print("MiB per process: PSS (replica's share) / USS / RSS; steps drafted")
    for corpus in args.datastores:
        name = args.code_datastore if corpus == "code" else args.datastore
        with SharedDatastore.open(name, tokenizer=tok) as client:  # the host's replica, written once, untimed
            if client.replicas is None or not client.replicas.wait_ready(600):
                raise SystemExit(f"no replica of {name!r}")
            size = Path(client.stores().datastore.path).stat().st_size / 2**20
        alone = run(name, SETS[corpus], 1, args.batch, args.references)[0]
        together = run(name, SETS[corpus], args.processes, args.batch, args.references)
        print(f"{name} (replica {size:,.0f} MiB)")
        for label, rows in (("alone", [alone]), (f"{args.processes} at once", together)):
            for r in rows:
                print(f"  {label:<12} PSS {r['pss']:8.1f} ({r['replica_pss']:7.1f})  USS {r['uss']:8.1f}  "
                      f"RSS {r['rss']:8.1f}  steps {r['steps']}")
        worst = max(r["pss"] for r in together)
        print(f"  largest PSS of {args.processes} at once minus one alone: {worst - alone['pss']:+.1f} MiB; "
              f"private memory (USS) alone {alone['uss']:.1f} MiB, at most {max(r['uss'] for r in together):.1f} "
              "at once")


if __name__ == "__main__":
    main()
