"""Evaluation prompts: Spec-Bench (chat, by category) and HumanEval (code), shipped in the package
(``toolkit/data/eval``, with their licences and sources; read by :mod:`toolkit.eval_sets`), and the BFCL
function-calling sets (``bfcl``, ``bfcl_heldout``: read from the bfcl-eval wheel's data, not shipped).

Chat prompts are rendered by :func:`toolkit.tokenizer.render_chat` (the first
user turn, generation prompt added), the function ingest renders chat corpora
with; HumanEval prompts are used raw, as code completion. A BFCL prompt is a chat whose system message lists the
functions it may call, in JSON, and asks for the calls alone, as a Python list (:func:`bfcl_messages`); a multi-turn
entry's later turns carry the conversation so far, the model's own earlier answers included (:func:`bfcl_turn`,
made by ``python -m evaluation references`` turn by turn). These sets are for scoring only: they must never be
ingested into a datastore scored on them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from toolkit.eval_sets import BFCL_SETS, PACKAGED, SETS, default_data_dir, read_rows
from toolkit.tokenizer import render_chat

__all__ = ["BFCL_SYSTEM", "HALVES", "PACKAGED", "SETS", "Prompt", "bfcl_messages", "bfcl_turn", "default_data_dir",
           "in_half", "load_prompts"]

BFCL_SYSTEM = ("You can call the functions described below in JSON. Answer each request with the calls that fulfil it "
               "and nothing else, as a Python list of calls: [name(argument=value, ...), ...]. The functions:\n")
"""The opening of a BFCL prompt's system message; the functions' JSON follows."""

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
        elif name in BFCL_SETS:
            category, pid = row["category"], row["id"]
            text = render_chat(tokenizer, bfcl_messages(row, [], 0), add_generation_prompt=True)
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


def bfcl_messages(row: dict, answers: list[str], turn: int) -> list[dict]:
    """The conversation of BFCL row ``row``'s turn ``turn`` (0-based; :func:`toolkit.eval_sets.read_rows`): the
    functions in a system message (:data:`BFCL_SYSTEM`), each earlier turn's messages followed by the model's answer
    to it (``answers[t]``, its text), then this turn's messages."""
    messages = [{"role": "system", "content": BFCL_SYSTEM + json.dumps(row["functions"], ensure_ascii=False)}]
    for t in range(turn):
        messages += [*row["turns"][t], {"role": "assistant", "content": answers[t]}]
    return messages + list(row["turns"][turn])


def bfcl_turn(tokenizer, row: dict, answers: list[str], turn: int) -> Prompt:
    """Turn ``turn`` (>= 1) of a multi-turn BFCL row, after the model's ``answers`` to the turns before it: its id is
    the row's, ``/t`` and the turn's number from 1 (``multi_turn_base-3/t2``)."""
    text = render_chat(tokenizer, bfcl_messages(row, answers, turn), add_generation_prompt=True)
    return Prompt(f"{row['id']}/t{turn + 1}", row["category"], text,
                  tuple(tokenizer.encode(text, add_special_tokens=False)))
