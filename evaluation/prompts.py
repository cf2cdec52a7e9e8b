"""Evaluation prompts: Spec-Bench (chat, by category) and HumanEval (code), shipped in the package
(``toolkit/data/eval``, with their licences and sources; read by :mod:`toolkit.eval_sets`).

Chat prompts are rendered by :func:`toolkit.tokenizer.render_chat` (the first
user turn, generation prompt added), the function ingest renders chat corpora
with; HumanEval prompts are used raw, as code completion. These sets are for
scoring only: they must never be ingested into a datastore scored on them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from toolkit.eval_sets import PACKAGED, SETS, default_data_dir, read_rows
from toolkit.tokenizer import render_chat

__all__ = ["HALVES", "PACKAGED", "SETS", "Prompt", "default_data_dir", "in_half", "load_prompts"]

HALVES = ("fit", "report", "all")
"""The halves of a set: ``fit`` (even positions within each category, where settings are chosen and the
calibration fitted), ``report`` (the odd positions, where figures are reported) and ``all``."""
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


class UnknownCategory(ValueError):
    """Raised when a requested category does not occur in the prompt set."""


@dataclass(frozen=True)
class Prompt:
    """One evaluation prompt.

    Attributes:
        id: stable id, ``<category>-<question_id>`` or the HumanEval ``task_id``.
        category: Spec-Bench category, or ``humaneval``.
        text: the prompt as the model sees it (chat template applied for chat sets).
        token_ids: ``text`` tokenized without extra special tokens.
    """

    id: str
    category: str
    text: str
    token_ids: tuple[int, ...]


def in_half(position: int, half: str) -> bool:
    """Whether the prompt at ``position`` (0-based, within its category, file order) belongs to ``half``
    (:data:`HALVES`).

    Raises:
        ValueError: for an unknown half.
    """
    if half not in HALVES:
        raise ValueError(f"half {half!r}: choose one of {', '.join(HALVES)}")
    return half == "all" or position % 2 == (0 if half == "fit" else 1)


def load_prompts(name: str, tokenizer, *, data_dir: str | os.PathLike | None = None,
                 limit: int | None = None, categories: tuple[str, ...] | None = None,
                 half: str = "all") -> list[Prompt]:
    """Load an evaluation set.

    Args:
        name: ``spec_bench`` or ``humaneval``.
        tokenizer: the target's tokenizer (its chat template is used for chat sets).
        data_dir: folder holding ``spec_bench/questions.jsonl`` and
            ``humaneval/problems.jsonl``; default :func:`default_data_dir`.
        limit: most prompts per category (file order, within the half), default all.
        categories: keep only these categories (default all).
        half: ``fit``, ``report`` or ``all`` (:func:`in_half`, default all).

    Raises:
        ValueError: for an unknown set name or half, or a non-positive limit.
        FileNotFoundError: when the set's file is missing (the message names it).
        UnknownCategory: when a requested category does not occur in the set
            (the message lists the set's categories).
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit={limit}: must be >= 1")
    in_half(0, half)  # checks it
    taken: dict[str, int] = {}
    seen: dict[str, int] = {}
    present: set[str] = set()
    out: list[Prompt] = []
    for row in read_rows(name, data_dir):
        if name == "spec_bench":
            category, pid = row["category"], f"{row['category']}-{row['question_id']}"
            text = render_chat(tokenizer, [{"role": "user", "content": row["turns"][0]}], add_generation_prompt=True)
        else:
            category, pid, text = "humaneval", row["task_id"], row["prompt"]
        present.add(category)
        position = seen[category] = seen.get(category, -1) + 1
        if (categories and category not in categories) or not in_half(position, half):
            continue
        if limit is not None and taken.get(category, 0) >= limit:
            continue
        taken[category] = taken.get(category, 0) + 1
        out.append(Prompt(pid, category, text, tuple(tokenizer.encode(text, add_special_tokens=False))))
    missing = sorted(set(categories or ()) - present)
    if missing:
        raise UnknownCategory(f"{name} has no category {', '.join(map(repr, missing))}; its categories are: "
                              f"{', '.join(sorted(present))}")
    return out
