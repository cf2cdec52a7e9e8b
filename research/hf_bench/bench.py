"""The decoding benchmark: accept length, tokens/s and speed-up per category, against plain greedy in the same run.

For every prompt the plain greedy baseline runs first, then each drafter, so
slow drift of the machine hits both sides alike; every drafter's output is
checked token for token against the baseline's (the lossless contract).
"""

from __future__ import annotations

import csv
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from decoder.generate import GenerationResult, greedy_generate, speculative_generate
from decoder.model import TargetModel
from drafting.lifecycle import Drafter
from evaluation.prompts import Prompt


@dataclass(frozen=True)
class RunRow:
    """One prompt decoded by one drafter (``drafter == "greedy"``: the baseline)."""

    prompt_id: str
    category: str
    drafter: str
    prompt_tokens: int
    new_tokens: int
    steps: int
    accept_length: float
    wall_s: float
    tokens_per_s: float
    lossless: bool
    draft_ms: float
    lookup_ms: float
    merge_ms: float
    verify_ms: float
    drafted_per_step: float


@dataclass(frozen=True)
class SummaryRow:
    """A category's figures for one drafter, pooled over its prompts.

    ``accept_length``: committed tokens / verification steps; ``tokens_per_s``:
    tokens / wall seconds; ``speedup``: baseline wall / drafter wall for the same
    tokens; per-step times in ms are means over steps (``draft_ms``: the drafter's ``propose``; of it ``lookup_ms``,
    the round trip, and ``merge_ms``, the native core, for a drafter that reports them, ``step_seconds()``;
    ``verify_ms``: the forward pass, acceptance and KV compaction); ``assembly_p50_ms`` is the median of ``draft_ms``
    per step.
    """

    category: str
    drafter: str
    prompts: int
    lossless: str
    accept_length: float
    tokens_per_s: float
    speedup: float
    draft_ms: float
    lookup_ms: float
    merge_ms: float
    verify_ms: float
    assembly_p50_ms: float
    drafted_per_step: float


PARTS = ("lookup", "merge")
"""The parts of a drafting step a drafter may report (``step_seconds()``)."""


def _split(drafter: Drafter | None) -> dict[str, float]:
    """Seconds by part of the step a drafter that reports them (``step_seconds()``) has spent so far."""
    seconds = getattr(drafter, "step_seconds", None)
    spent = seconds() if seconds is not None else {}
    return {part: spent.get(part, 0.0) for part in PARTS}


def _row(prompt: Prompt, name: str, res: GenerationResult, base: GenerationResult | None,
         split: dict[str, float] | None = None) -> RunRow:
    n = max(len(res.steps), 1)
    ms = {part: round(1e3 * (split or {}).get(part, 0.0) / n, 4) for part in PARTS}
    return RunRow(
        prompt.id, prompt.category, name, len(prompt.token_ids), len(res.output_ids), len(res.steps),
        round(res.accept_length, 4), round(res.wall_s, 4), round(res.tokens_per_s, 3),
        base is None or res.output_ids == base.output_ids,
        round(1e3 * sum(s.draft_s for s in res.steps) / n, 4), ms["lookup"], ms["merge"],
        round(1e3 * sum(s.verify_s for s in res.steps) / n, 3), round(sum(s.drafted for s in res.steps) / n, 2),
    )


def run_bench(
    target: TargetModel,
    prompts: Sequence[Prompt],
    drafters: Sequence[Drafter],
    *,
    budgets: dict[str, int],
    max_new_tokens: int,
    on_row: Callable[[RunRow], None] | None = None,
) -> tuple[list[RunRow], dict[tuple[str, str], list[float]]]:
    """Decode every prompt with the greedy baseline, then with each drafter (``budgets``: draft nodes per step
    by drafter name).

    Returns:
        The rows (baseline rows have ``drafter == "greedy"``), and per
        ``(category, drafter)`` the draft assembly ms of every step (for medians).
    """
    rows: list[RunRow] = []
    assembly: dict[tuple[str, str], list[float]] = {}
    for prompt in prompts:
        base = greedy_generate(target, prompt.token_ids, max_new_tokens=max_new_tokens)
        rows.append(_row(prompt, "greedy", base, None))
        if on_row:
            on_row(rows[-1])
        for drafter in drafters:
            before = _split(drafter)
            res = speculative_generate(target, prompt.token_ids, drafter, max_new_tokens=max_new_tokens,
                                       budget=budgets[drafter.name])
            after = _split(drafter)
            rows.append(_row(prompt, drafter.name, res, base, {p: after[p] - before[p] for p in PARTS}))
            assembly.setdefault((prompt.category, drafter.name), []).extend(1e3 * s.draft_s for s in res.steps)
            if on_row:
                on_row(rows[-1])
    return rows, assembly


def summarize(rows: Sequence[RunRow], assembly: dict[tuple[str, str], list[float]]) -> list[SummaryRow]:
    """Pool rows per category and drafter (plus an ``all`` category per drafter)."""
    groups: dict[tuple[str, str], list[RunRow]] = {}
    for r in rows:
        groups.setdefault((r.category, r.drafter), []).append(r)
        groups.setdefault(("all", r.drafter), []).append(r)
    base_wall: dict[str, float] = {}
    for (cat, name), rs in groups.items():
        if name == "greedy":
            base_wall[cat] = sum(r.wall_s for r in rs)
    out = []
    for (cat, name), rs in groups.items():
        steps = sum(r.steps for r in rs)
        tokens = sum(r.new_tokens for r in rs)
        wall = sum(r.wall_s for r in rs)
        first_tokens = len(rs)  # the prefill's token is not a verification step

        def per_step(field: str, rs=rs, steps=steps) -> float:
            return round(sum(getattr(r, field) * r.steps for r in rs) / max(steps, 1), 3)

        if cat == "all":
            asm = [ms for (c, d), v in assembly.items() if d == name for ms in v]
        else:
            asm = assembly.get((cat, name), [])
        out.append(SummaryRow(
            cat, name, len(rs), f"{sum(r.lossless for r in rs)}/{len(rs)}",
            round((tokens - first_tokens) / steps, 3) if steps else 0.0,
            round(tokens / wall, 2) if wall else 0.0,
            round(base_wall.get(cat, 0.0) / wall, 3) if wall else 0.0,
            per_step("draft_ms"), per_step("lookup_ms"), per_step("merge_ms"),
            per_step("verify_ms"),
            round(statistics.median(asm), 4) if asm else 0.0,
            round(sum(r.drafted_per_step * r.steps for r in rs) / max(steps, 1), 2),
        ))
    order = {d: i for i, d in enumerate(dict.fromkeys(r.drafter for r in rows))}
    cats = list(dict.fromkeys(r.category for r in rows)) + ["all"]
    return sorted(out, key=lambda s: (cats.index(s.category), order[s.drafter]))


def write_csv(path: str | os.PathLike, rows: Sequence[Any]) -> Path:
    """Write dataclass rows to CSV (header from the first row's fields); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        if rows:
            w = csv.DictWriter(f, fieldnames=list(asdict(rows[0]).keys()))
            w.writeheader()
            for r in rows:
                w.writerow(asdict(r))
    return path
