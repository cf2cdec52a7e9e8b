"""``python -m research.hf_bench replay``: accept length per drafter and category from saved plain-greedy outputs."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from decoder.generate import greedy_generate
from decoder.model import TargetModel
from evaluation.prompts import Prompt, load_prompts
from evaluation.simulate import replay
from toolkit.tokenizer import cache_dir

from .bench import write_csv
from .budget import choose_budget, load_or_measure
from .store import ReferenceStore, reference_store

__all__ = ["references_for"]


@dataclass(frozen=True)
class ReplayRow:
    """Simulated figures for one category and drafter."""

    category: str
    drafter: str
    prompts: int
    accept_length: float
    drafted_per_step: float
    steps: int
    seconds: float


def _dtype_name(target: TargetModel) -> str:
    return str(target.dtype).split(".")[-1]


def references_for(target: TargetModel, prompts: list[Prompt], store: ReferenceStore,
                   max_new_tokens: int) -> list[list[int]]:
    """Each prompt's plain-greedy output, generated (and saved) for the ones not saved yet."""
    out = []
    for p in prompts:
        ref = store.get(p.id, p.token_ids)
        if ref is None:
            ref = greedy_generate(target, p.token_ids, max_new_tokens=max_new_tokens).output_ids
            store.put(p.id, p.token_ids, ref)
        out.append(ref)
    return out


def run_replay(args, console: Console, target: TargetModel, prompts: list[Prompt], drafters: list,
               budgets: dict[str, int]) -> int:
    """Replay every prompt with every drafter at its budget (references generated once and saved); print and
    write the per-category table (``results/replay_<set>.csv``). Returns the exit status."""
    store = reference_store(target.spec, _dtype_name(target), args.prompt_set, args.max_new_tokens)
    refs = references_for(target, prompts, store, args.max_new_tokens)
    rows = []
    for drafter in drafters:
        by_cat: dict[str, list] = {}
        for p, ref in zip(prompts, refs):
            t0 = time.perf_counter()
            res = replay(drafter, p.token_ids, ref, budgets[drafter.name])
            for cat in (p.category, "all"):
                by_cat.setdefault(cat, []).append((res, time.perf_counter() - t0))
        for cat, items in by_cat.items():
            steps = sum(len(r.steps) for r, _ in items)
            rows.append(ReplayRow(
                cat, drafter.name, len(items),
                round(sum(s.accepted for r, _ in items for s in r.steps) / max(steps, 1), 3),
                round(sum(s.drafted for r, _ in items for s in r.steps) / max(steps, 1), 2), steps,
                round(sum(s for _, s in items), 2)))
    table = Table(title=f"replayed accept length, {args.prompt_set}, {len(prompts)} prompts, budget {args.budget}")
    for col in ("category", "drafter", "prompts", "accept_length", "drafted_per_step", "steps", "seconds"):
        table.add_column(col)
    rows.sort(key=lambda r: r.category == "all")
    for r in rows:
        table.add_row(r.category, r.drafter, str(r.prompts), f"{r.accept_length:.3f}", f"{r.drafted_per_step:.1f}",
                      str(r.steps), f"{r.seconds:.1f}")
    console.print(table)
    path = write_csv(Path(f"results/replay_{args.prompt_set}.csv"), rows)
    console.print(f"wrote {path}")
    return 0


CANDIDATE_BUDGETS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32)


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _close(drafters) -> None:
    """Close what drafters hold open (their datastore connections)."""
    for d in drafters:
        d.close()


def _replayed(make: Callable[[], list], name: str, prompts: list[Prompt], refs: list[list[int]],
              budget: int) -> tuple[float, float]:
    """Accept length of a fresh copy of drafter ``name`` replaying ``prompts`` at ``budget`` (so no replay drafts from
    what an earlier one at another budget left in the drafter: the same prompt's answer), and its mean seconds of
    ``propose`` a step."""
    drafters = make()
    try:
        drafter = next(d for d in drafters if d.name == name)
        steps = [s for p, r in zip(prompts, refs)
                 for s in replay(drafter, p.token_ids, r, budget).steps]
    finally:
        _close(drafters)
    n = max(len(steps), 1)
    return sum(s.accepted for s in steps) / n, sum(s.draft_s for s in steps) / n


def auto_budgets(args, target: TargetModel, make: Callable[[], list], console: Console, *,
                 refresh: bool = False) -> dict[str, int]:
    """Per drafter, the budget maximizing replayed accept length / (verification latency + the drafter's own
    replayed seconds a step).

    Chosen on the first prompt of each category of the fit half of ``args.prompt_set`` (replayed, so only their greedy
    references cost model time), disjoint from the report half that is scored, by throw-away copies of the drafters
    (``make()`` builds them; one copy per candidate budget): the drafters that are scored never saw a calibration
    prompt's output, and no replay drafts from an answer an earlier one left. The choice is cached under
    ``<cache>/latency``, keyed on everything that changes it: the latency curve (model, device, dtype, threads and its
    measured values), the calibration prompts' tokens, the reference length, the candidate budgets, what a step costs
    and the drafter's :meth:`config` (weights, prior, trie shape, the datastore's name and build).
    """
    curve = load_or_measure(target, max_tokens=max(CANDIDATE_BUDGETS) + 1)
    prompts = load_prompts(args.prompt_set, target.tokenizer, data_dir=args.data_dir, limit=1, half="fit")
    drafters = make()
    configs = {d.name: d.config() for d in drafters}
    _close(drafters)
    refs = None
    out: dict[str, int] = {}
    for name, config in configs.items():
        key = {"curve": curve.key, "latency_s": [round(x, 6) for x in curve.latency_s.tolist()],
               "prompts": _digest([p.token_ids for p in prompts]), "max_new_tokens": args.max_new_tokens,
               "candidates": CANDIDATE_BUDGETS, "drafter": config,
               "step_cost": "verification pass + the drafter's replayed seconds"}  # older choices: the pass alone
        path = Path(cache_dir()) / "latency" / f"budget-{name}-{_digest(key)}.json"
        if path.exists() and not refresh:
            out[name] = int(json.loads(path.read_text())["budget"])
            continue
        if refs is None:
            store = reference_store(target.spec, _dtype_name(target), args.prompt_set, args.max_new_tokens)
            refs = references_for(target, prompts, store, args.max_new_tokens)
        replayed = {b: _replayed(make, name, prompts, refs, b) for b in CANDIDATE_BUDGETS}
        lengths = {b: al for b, (al, _) in replayed.items()}
        draft_s = {b: t for b, (_, t) in replayed.items()}
        best, rate = choose_budget(curve, lengths, draft_s)
        table = Table(title=f"budget for {name} on {args.prompt_set} ({len(prompts)} calibration prompts, fit half)")
        for col in ("budget", "verify ms", "draft ms", "accept length", "tokens/s", ""):
            table.add_column(col, justify="right")
        for b in CANDIDATE_BUDGETS:
            table.add_row(str(b), f"{1e3 * curve(b + 1):.1f}", f"{1e3 * draft_s[b]:.2f}", f"{lengths[b]:.3f}",
                          f"{rate[b]:.1f}", "best" if b == best else "")
        console.print(table)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"budget": best, "accept_lengths": lengths, "draft_s": draft_s,
                                    "tokens_per_s": rate, "key": key}, indent=1))
        out[name] = best
    return out
