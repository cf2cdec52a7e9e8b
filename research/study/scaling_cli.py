"""``python -m research.study corpus-size``: accept length against corpus size, with what each size costs to build and
look up.

Per corpus (code: the standard library, 3x, all of this interpreter's Python source, scored on HumanEval;
sharegpt: 10%, 33%, 100% of ShareGPT, scored on Spec-Bench), per size and top-t: tokenize and build in child
processes (wall time, stages, peak RSS), refuse a build whose corpus holds a scored prompt, replay the report half
(datastore alone and merged; trees and chains), time lookups through Postgres and the replica. Writes
``study_corpus_size_builds.csv``, ``study_corpus_size_accept.csv`` (pooled and per category) and one PNG per corpus
to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import time
from dataclasses import asdict, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from datastore.connection import resolve_database_url
from evaluation.prompts import load_prompts
from ingest.cli import parse_count
from toolkit.options import datastore_name, int_in
from toolkit.tokenizer import DEFAULT_MODEL, cache_dir, load_tokenizer, tokenizer_fingerprint

from .corpus import EVAL_SETS
from .plots import plot_corpus_size
from .scaling import AcceptRow, BuildRow, ScalingGrid, Tokenized, run_size, tokenize_size
from .sizes import CORPUS_SIZES, SizePoint, corpus_ladder

__all__ = ["add_parser", "run_corpus_size"]


def _scaled(text: str) -> int | None:
    """argparse type: a top-t (``2M``), or ``0`` / ``off`` for no scaled line."""
    return None if text.strip().lower() in ("0", "off") else parse_count(text)


def add_parser(kinds, parents: list[argparse.ArgumentParser]) -> None:
    """Register the ``corpus-size`` subcommand on ``kinds`` (the subparsers of ``python -m research.study``)."""
    s = kinds.add_parser("corpus-size", parents=parents, description=__doc__,
                         help="accept length against corpus tokens (code 1x/3x/all, ShareGPT 10/33/100%%), with "
                              "build cost, bytes and lookup latency per size.")
    d = ScalingGrid()
    s.add_argument("--corpus", nargs="+", choices=tuple(CORPUS_SIZES), default=list(CORPUS_SIZES),
                   help="corpora (default: code sharegpt).")
    s.add_argument("--sizes", nargs="+", default=None,
                   help="only these sizes, e.g. 1x 3x or 10%% (default: every size of each corpus: code 1x 3x all, "
                        "sharegpt 10%% 33%% 100%%).")
    s.add_argument("--top-t", nargs="*", type=parse_count, default=list(d.top_t),
                   help="fixed top-t values, n-grams kept per n (default: 2M).")
    s.add_argument("--scaled-top-t", type=_scaled, default=d.scaled_top_t,
                   help="top-t at a corpus's largest size; smaller sizes keep proportionally fewer n-grams; 0 or "
                        "off: no scaled line (default: 2M).")
    s.add_argument("--tree-budgets", nargs="*", type=int_in(1, 1024), default=list(d.tree_budgets),
                   help="draft-tree budgets replayed, nodes per step (default: 8 16).")
    s.add_argument("--chain-budgets", nargs="*", type=int_in(1, 1024), default=list(d.chain_budgets),
                   help="chain budgets replayed, tokens per step (default: 4 8).")
    s.add_argument("--lookups", type=int_in(1), default=d.lookups,
                   help="contexts timed per lookup path (default: %(default)s).")
    s.add_argument("--seed", type=int, default=0, help="seed of the 3x code subset (default: 0).")
    s.add_argument("--keep", action="store_true", help="keep the datastores built (default: drop each once measured).")
    s.add_argument("--limit", type=int_in(1), default=None, help="prompts per category (default: all of the half).")
    s.add_argument("--corpus-limit", type=parse_count, default=None,
                   help="read at most N documents of each size, e.g. 2K (default: all; for quick looks and tests).")
    s.add_argument("--workdir", type=Path, default=None,
                   help="folder for the tokenized sizes (kept for later runs) and replicas (default: "
                        "<cache>/study/sizes).")
    s.add_argument("--name-prefix", type=datastore_name, default="size",
                   help="datastores are named <prefix>-<corpus>-<size>-t<top-t> (default: %(default)s).")


def _write(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        if rows:
            w = csv.DictWriter(fh, fieldnames=list(asdict(rows[0])))
            w.writeheader()
            w.writerows(asdict(r) for r in rows)
    return path


def _ladder(name: str, args, console: Console, workdir: Path, fp: str) -> list[tuple[SizePoint, Tokenized]]:
    """The sizes of corpus ``name`` to run, each with its tokenized corpus (tokenized now unless cached)."""
    def folder(point: SizePoint) -> Path:
        cap = f"-limit{args.corpus_limit}" if args.corpus_limit else ""
        return workdir / f"{point.corpus}-{point.label.replace('%', 'pct')}-s{args.seed}{cap}-{fp}"

    def capped(point: SizePoint) -> SizePoint:
        if args.corpus_limit is None:
            return point
        limit = min(point.config.limit or args.corpus_limit, args.corpus_limit)
        return replace(point, config=replace(point.config, limit=limit),
                       rule=f"{point.rule}, its first {limit:,} documents")

    if name == "sharegpt":  # the fractions are of the whole corpus's records: tokenize it first
        whole = capped(corpus_ladder("sharegpt", sharegpt_records=1)[-1])
        records = tokenize_size(whole, folder(whole)).corpus.num_documents
        points = [capped(p) for p in corpus_ladder("sharegpt", sharegpt_records=records)]
    else:
        points = [capped(p) for p in corpus_ladder(name, seed=args.seed)]
    chosen = [p for p in points if args.sizes is None or p.label in args.sizes]
    out = []
    for point in chosen:
        console.print(f"[dim]{point.corpus} {point.label}: {point.rule}[/dim]")
        t0 = time.perf_counter()
        tok = tokenize_size(point, folder(point))
        console.print(f"  {tok.corpus.num_tokens:,} tokens in {tok.corpus.num_documents:,} documents "
                      + ("(cached)" if tok.cached else f"(tokenized in {time.perf_counter() - t0:.0f} s, peak RSS "
                                                       f"{tok.peak_tree_bytes / 2**30:.2f} GiB)"))
        out.append((point, tok))
    return out


def run_corpus_size(args, console: Console, references) -> int:
    """Run the study for each requested corpus. ``references(spec, eval_set, prompts)`` gives the saved greedy
    outputs (generating the missing ones). Returns the exit status."""
    grid = ScalingGrid(top_t=tuple(args.top_t), scaled_top_t=args.scaled_top_t,
                       tree_budgets=tuple(args.tree_budgets), chain_budgets=tuple(args.chain_budgets),
                       lookups=args.lookups, keep=args.keep)
    url = resolve_database_url(args.database_url)
    tokenizer = load_tokenizer(None)
    workdir = Path(args.workdir or Path(cache_dir()) / "study" / "sizes")
    fp = tokenizer_fingerprint(tokenizer)[:12]
    builds: list[BuildRow] = []
    accepts: list[AcceptRow] = []
    started = time.perf_counter()
    for name in args.corpus:
        eval_set = EVAL_SETS[name]
        prompts = load_prompts(eval_set, tokenizer, data_dir=args.data_dir, limit=args.limit, half="report")
        refs = references(DEFAULT_MODEL, eval_set, prompts)
        ladder = _ladder(name, args, console, workdir, fp)
        if not ladder:
            continue
        console.rule(f"{name}: {len(ladder)} sizes, scored on the report half of {eval_set} ({len(prompts)} prompts)")
        largest = max(tok.corpus.num_tokens for _, tok in ladder)  # the scaled top-t's base: the largest size run
        for point, tok in ladder:
            b, a = run_size(point, tok, largest, eval_set, prompts, refs, grid, url=url, tokenizer=tokenizer,
                            workdir=workdir, prefix=args.name_prefix, log=console.print)
            builds += b
            accepts += a
        mine = [r for r in accepts if r.corpus == name]
        png = plot_corpus_size(mine, args.out / f"study_corpus_size_{name}.png",
                               f"{name}: accept length against corpus size, report half of {eval_set} "
                               f"({len(prompts)} prompts)")
        console.print(f"wrote {png}")
    b_csv = _write(args.out / "study_corpus_size_builds.csv", builds)
    a_csv = _write(args.out / "study_corpus_size_accept.csv", accepts)
    console.print(_table(builds, accepts))
    console.print(f"wrote {b_csv} and {a_csv}; study done in {time.perf_counter() - started:.0f} s")
    return 0


def _table(builds: list[BuildRow], accepts: list[AcceptRow]) -> Table:
    """Per build: tokens, top-t, cost, and the merged drafter's accept length at each shape."""
    shapes = sorted({(r.shape, r.budget) for r in accepts}, key=lambda s: (s[0] != "tree", s[1]))
    table = Table(title="corpus size: cost and accept length (merged / datastore alone)")
    for col in ("corpus", "size", "tokens", "top-t", "wall s", "tok/s", "peak GiB", "MB", "B/n-gram", "pg p50 ms",
                "replica p50 ms", *(f"{s} {b}" for s, b in shapes)):
        table.add_column(col, justify="right")
    for b in builds:
        cells = []
        for shape, budget in shapes:
            got = {r.method: r.accept_length for r in accepts if (r.corpus, r.size, r.top_t, r.shape, r.budget,
                                                                  r.category) ==
                   (b.corpus, b.size, b.top_t, shape, budget, "all")}
            cells.append(f"{got.get('merged', 0):.2f} / {got.get('datastore', 0):.2f}")
        table.add_row(b.corpus, b.size, f"{b.tokens:,}", f"{b.top_t:,}", f"{b.wall_s:.0f}", f"{b.tokens_per_s:,}",
                      f"{b.peak_rss_bytes / 2**30:.2f}", f"{b.bytes / 1e6:,.0f}", f"{b.bytes_per_ngram:.1f}",
                      f"{b.lookup_pg_p50_ms:.3f}", f"{b.lookup_replica_p50_ms:.4f}", *cells)
    return table
