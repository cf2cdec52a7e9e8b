"""``python -m research.study storage``: accept length against datastore bytes, for chat and code; ``python -m
research.study
corpus-size``: accept length against corpus size (:mod:`research.study.scaling_cli`).

Per corpus: tokenize it once (cached), replay the evaluation set's plain-greedy
references (generated once, cached) through REST over corpus fractions, CREST
single-n and combined datastores over a top-t grid, and the merged drafter; write
``study_storage_<corpus>.csv``, ``study_tree_sizes_<corpus>.csv`` and two PNG plots
to ``--out``, and print each point's cost and the targets' verdicts.
"""

from __future__ import annotations

import argparse
import csv
import logging
import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from datastore.connection import resolve_database_url
from datastore.errors import BadDatabaseUrl, DatastoreError, DatastoreNotFound
from evaluation.contamination import Contaminated, NotScreened
from evaluation.prompts import MT_BENCH, load_prompts
from ingest.cli import parse_count
from ingest.errors import SourceError
from research.hf_bench.store import reference_store
from toolkit.console import EXIT_USAGE, error, run, table_console
from toolkit.extras import MissingExtra
from toolkit.options import database_options, datastore_name, existing_dir, int_in, model_spec
from toolkit.tokenizer import DEFAULT_MODEL, load_tokenizer

from .corpus import CORPORA, EVAL_SETS, prepare_corpus
from .plots import plot_storage, plot_tree_sizes
from .runner import StudyGrid, StudyRow, run_corpus
from .scaling_cli import add_parser, run_corpus_size
from .summary import assess


def _fraction(text: str) -> float:
    try:
        value = float(text.rstrip("%")) / (100.0 if text.endswith("%") else 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction; write e.g. 0.5 or 50%") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text}: a corpus fraction must be in (0, 1] (or 0%..100%)")
    return value


def study_options() -> argparse.ArgumentParser:
    """The options every study takes: reference length, output folder, evaluation sets."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--max-new-tokens", type=int_in(1), default=128, help="reference length, tokens (default: 128).")
    p.add_argument("--out", type=Path, default=Path("results"), help="folder for CSV and PNG files (default: results).")
    p.add_argument("--data-dir", type=existing_dir, default=None,
                   help="folder with spec_bench/ and humaneval/ (default: $CREST_EVAL_DATA, else the sets shipped "
                        "in the package).")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m research.study`` parser (subcommands ``storage`` and ``corpus-size``)."""
    parser = argparse.ArgumentParser(prog="python -m research.study",
                                     description="Studies over datastore configurations.")
    kinds = parser.add_subparsers(dest="study", required=True)
    s = kinds.add_parser("storage", parents=[database_options(), study_options()],
                         help="accept length against bytes on disk: REST, CREST single-n/combined, merged.",
                         description=__doc__)
    d = StudyGrid()
    s.add_argument("--corpus", nargs="+", choices=CORPORA, default=list(CORPORA),
                   help="corpora: sharegpt (scored on Spec-Bench's MT-Bench categories) and code (the interpreter's "
                        "stdlib + site-packages, scored on HumanEval) (default: both).")
    s.add_argument("--top-t", nargs="+", type=parse_count, default=list(d.combined_top_t),
                   help="top-t grid of the combined datastores, n <= --max-n (CREST §5.4; default: 1K 2K ... 512K).")
    s.add_argument("--single-top-t", nargs="*", type=parse_count, default=list(d.single_top_t),
                   help="top-t grid of the single-n datastores (CREST §5.3; default: 1K 4K 16K 64K 256K).")
    s.add_argument("--single-n", nargs="*", type=int_in(1, 8), default=list(d.single_n),
                   help="n of the single-n datastores (default: 1 2 3 4 5).")
    s.add_argument("--combined-m", nargs="*", type=int_in(2, 8), default=list(d.combined_m),
                   help="m of the combined lines (n <= m), each 2..8; the largest is also drafted from by the merged "
                        "drafter (CREST §5.4; default: 2 3 5).")
    s.add_argument("--rest-fractions", nargs="+", type=_fraction, default=list(d.rest_fractions),
                   help="corpus prefixes indexed for REST, e.g. 1%% 2%% or 0.5 (default: 1%% 2%% 4%% ... 64%% 100%%).")
    s.add_argument("--budget", type=int_in(1, 1024), default=d.budget,
                   help="draft nodes verified per step, 1..1024 (default: 64, REST's and CREST's tree size).")
    s.add_argument("--no-merged", action="store_true", help="skip the merged drafter's line.")
    s.add_argument("--limit", type=int_in(1), default=None, help="prompts per category (default: all).")
    s.add_argument("--corpus-limit", type=parse_count, default=None,
                   help="index only the corpus's first N documents, e.g. 2K (default: all; for quick looks).")
    s.add_argument("--workdir", type=Path, default=None,
                   help="folder for tokenized corpora, REST indexes and rankings (default: <cache>/study).")
    s.add_argument("--name-prefix", type=datastore_name, default="study",
                   help="datastore names are <prefix>-<corpus>-full and -point (default: %(default)s).")
    s.add_argument("--model", type=model_spec, default=None,
                   help="target model: local dir, .gguf or hub id (default: SmolLM2-135M-Instruct).")
    s.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="dtype of the reference runs (default: float32).")
    s.add_argument("--quiet", action="store_true", help="no progress bars.")
    add_parser(kinds, [database_options(), study_options()])
    return parser


def _references(args, spec: str, eval_set: str, prompts, console: Console) -> list[list[int]]:
    """Saved plain-greedy outputs, generating the missing ones with the target (loaded only then)."""
    store = reference_store(spec, args.dtype, eval_set, args.max_new_tokens)
    missing = [p for p in prompts if store.get(p.id, p.token_ids) is None]
    if missing:
        from decoder.model import load_target
        from research.hf_bench.replay import references_for

        console.print(f"generating {len(missing)} plain-greedy references for {eval_set} (cached for later runs)")
        target = load_target(args.model, dtype=args.dtype)
        t0 = time.perf_counter()
        references_for(target, missing, store, args.max_new_tokens)
        console.print(f"  references took {time.perf_counter() - t0:.0f} s")
    refs = []
    for p in prompts:
        ref = store.get(p.id, p.token_ids)
        if ref is None:  # references_for saved every missing one: only a concurrent writer gets here
            raise LookupError(f"no saved reference for {p.id} in {store.path}; run the study again")
        refs.append(ref)
    return refs


_COLUMNS = [f for f in StudyRow.__dataclass_fields__ if f != "per_n_nodes"]


def _write_csv(path: Path, rows: list[StudyRow]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=_COLUMNS)
        w.writeheader()
        for r in rows:
            d = asdict(r)
            w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items() if k in _COLUMNS})
    return path


def _write_tree_sizes(path: Path, rows: list[StudyRow]) -> Path:
    """Mean tree nodes per n for every CREST size (CREST Table 2)."""
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["method", "top_t", "n", "mean_tree_nodes"])
        for r in rows:
            for n, m in sorted(r.per_n_nodes.items()):
                if r.method in ("crest-single", "crest-combined"):
                    w.writerow([r.method, r.top_t, n, round(m, 2)])
    return path


def _row_line(r: StudyRow) -> str:
    what = {"rest": f"{100 * r.fraction:g}% of corpus", "trie": "prompt only"}.get(
        r.method, f"{'n=' if r.method == 'crest-single' else 'n<='}{r.n} t={r.top_t:,}")
    build = "cached" if r.method == "rest" and r.build_s == 0 else f"{r.build_s:.1f} s"
    return (f"{r.method:>14} {what:>22}: {r.bytes / 1e6:9.2f} MB  accept {r.accept_length:.3f}  "
            f"({r.steps} steps)  build {build:>8}  replay {r.replay_s:6.1f} s")


def _tree_size_table(rows: list[StudyRow], name: str) -> Table:
    """Mean stored tree nodes per n (rows) at each single-n top-t (columns): CREST Table 2."""
    singles = [r for r in rows if r.method == "crest-single"]
    tops = sorted({r.top_t for r in singles})
    table = Table(title=f"mean token tree size (nodes) per n, {name}")
    table.add_column("n")
    for t in tops:
        table.add_column(f"t={t:,}", justify="right")
    for n in sorted({r.n for r in singles}):
        got = {r.top_t: r.mean_tree_nodes for r in singles if r.n == n}
        table.add_row(str(n), *(f"{got[t]:.1f}" if t in got else "-" for t in tops))
    return table


def main(argv: list[str] | None = None) -> int:
    """Run the storage study for each requested corpus; returns the exit status (0 ok, 2 bad input or
    an unusable corpus or database, 1 a datastore that cannot serve)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = table_console()

    if args.study == "corpus-size":
        args.model, args.dtype = None, "float32"  # the default target's references
        return run(lambda: run_corpus_size(args, console, lambda spec, eval_set, prompts: _references(
            args, spec, eval_set, prompts, console)), usage=(BadDatabaseUrl, DatastoreNotFound, FileNotFoundError,
                                                             MissingExtra, Contaminated, NotScreened, SourceError),
            failures=(DatastoreError,))
    return run(lambda: _run(args, console), usage=(BadDatabaseUrl, DatastoreNotFound, FileNotFoundError, MissingExtra),
               failures=(DatastoreError,))


def _run(args, console: Console) -> int:
    try:
        grid = StudyGrid(combined_top_t=tuple(args.top_t), single_top_t=tuple(args.single_top_t),
                         single_n=tuple(args.single_n), combined_m=tuple(args.combined_m),
                         rest_fractions=tuple(args.rest_fractions), budget=args.budget, merged=not args.no_merged)
    except ValueError as exc:
        error(exc)
        return EXIT_USAGE
    url = resolve_database_url(args.database_url)
    spec = args.model or DEFAULT_MODEL
    tokenizer = load_tokenizer(args.model)
    started = time.perf_counter()
    for name in args.corpus:
        try:
            _run_one(args, name, grid, url, spec, tokenizer, console)
        except ValueError as exc:  # an unreadable or empty corpus, a grid the full build cannot serve
            error(f"in the {name} study: {exc}")
            return EXIT_USAGE
    console.print(f"study done in {time.perf_counter() - started:.0f} s")
    return 0


def _run_one(args, name: str, grid: StudyGrid, url: str, spec: str, tokenizer, console: Console) -> None:
    """The study of one corpus: measure, write the CSVs and plots, print the verdicts."""
    t0 = time.perf_counter()
    eval_set = EVAL_SETS[name]
    prompts = load_prompts(eval_set, tokenizer, data_dir=args.data_dir, limit=args.limit,
                           categories=MT_BENCH if eval_set == "spec_bench" else None)
    refs = _references(args, spec, eval_set, prompts, console)
    corpus = prepare_corpus(name, tokenizer, spec, root=args.workdir, limit=args.corpus_limit,
                            progress=not args.quiet)
    console.rule(f"{name}: {corpus.tokenized.num_tokens:,} tokens in {corpus.tokenized.num_documents:,} documents"
                 f" (tokenized in {corpus.tokenize_s:.0f} s; 0 = cached), scored on {eval_set} "
                 f"({len(prompts)} prompts), budget {grid.budget}")
    rows = run_corpus(corpus, eval_set, prompts, refs, grid, url=url, tokenizer=tokenizer,
                      tokenizer_spec=spec, report=lambda r: console.print(_row_line(r)),
                      log=lambda text: console.print(text), prefix=args.name_prefix, progress=not args.quiet)
    csv_path = _write_csv(args.out / f"study_storage_{name}.csv", rows)
    sizes_path = _write_tree_sizes(args.out / f"study_tree_sizes_{name}.csv", rows)
    title = f"{name} corpus, scored on {eval_set} ({len(prompts)} prompts)"
    png = plot_storage(rows, args.out / f"study_storage_{name}.png", title)
    png2 = plot_tree_sizes(rows, args.out / f"study_tree_sizes_{name}.png", f"mean token tree size, {name}")
    console.print(_tree_size_table(rows, name))
    table = Table(title=f"targets, {name}")
    for col in ("target", "measured", "met"):
        table.add_column(col)
    for v in assess(rows):
        table.add_row(v.target, v.figure, "yes" if v.met else "[red]no[/red]")
    console.print(table)
    console.print(f"wrote {csv_path}, {sizes_path}, {png}, {png2} ({time.perf_counter() - t0:.0f} s for {name})")
