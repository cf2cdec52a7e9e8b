"""The evaluation sets' files: where they are and their rows, read once for scoring (:mod:`evaluation.prompts`) and
for screening a corpus against them (:mod:`ingest.contamination`).

The sets ship in the package (``toolkit/data/eval``: Spec-Bench and HumanEval, with their licences and sources);
``CREST_EVAL_DATA`` (or a command's ``--data-dir``) names another folder of the same layout.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .settings import Settings

__all__ = ["PACKAGED", "SETS", "default_data_dir", "item_digests", "read_rows", "screened_texts"]

SETS = ("spec_bench", "humaneval")
PACKAGED = Path(__file__).with_name("data") / "eval"
"""The evaluation sets shipped with the package (``spec_bench/``, ``humaneval/``, licences, README)."""
_FILES = {"spec_bench": "spec_bench/questions.jsonl", "humaneval": "humaneval/problems.jsonl"}


def default_data_dir() -> Path:
    """Where the evaluation sets are: ``CREST_EVAL_DATA`` when set, else the packaged :data:`PACKAGED`."""
    return Settings.from_env().eval_data or PACKAGED


def read_rows(name: str, data_dir: str | os.PathLike | None = None) -> list[dict]:
    """The rows of evaluation set ``name``, in file order (JSON Lines, blank lines skipped).

    Raises:
        ValueError: for a set not in :data:`SETS`.
        FileNotFoundError: when the set's file is missing (the message names it and the fix).
    """
    if name not in SETS:
        raise ValueError(f"unknown prompt set {name!r}: choose one of {', '.join(SETS)}")
    path = Path(data_dir if data_dir is not None else default_data_dir()) / _FILES[name]
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: pass --data-dir (or set CREST_EVAL_DATA) to the folder "
                                "holding spec_bench/ and humaneval/")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def screened_texts(data_dir: str | os.PathLike | None = None) -> dict[str, list[tuple[str, str]]]:
    """What a corpus is screened against, per part: ``(item id, text)`` pairs, the text as written in the set (no
    chat template: a chat corpus holds the template by design).

    Parts: ``spec_bench`` (every question's user turns, joined by a newline; ids ``<category>-<question_id>``, as
    :func:`evaluation.prompts.load_prompts` names them), ``humaneval`` (the prompts) and ``humaneval_solutions``
    (the canonical solutions; ids are the ``task_id``).

    Raises:
        FileNotFoundError: when a set's file is missing.
    """
    chat = [(f"{r['category']}-{r['question_id']}", "\n".join(r["turns"])) for r in read_rows("spec_bench", data_dir)]
    code = read_rows("humaneval", data_dir)
    return {"spec_bench": chat, "humaneval": [(r["task_id"], r["prompt"]) for r in code],
            "humaneval_solutions": [(r["task_id"], r["canonical_solution"]) for r in code]}


def item_digests(data_dir: str | os.PathLike | None = None) -> dict[str, dict[str, str]]:
    """Per screened part (as :func:`screened_texts`), each item's digest: the first 16 hex digits of the SHA-256 of
    its text as screened (UTF-8). A build records them with its contamination screen, and the gate before scoring
    (:func:`evaluation.require_clean`) compares the scored items' with them: an item whose text the build did not
    screen is not scored.

    Raises:
        FileNotFoundError: when a set's file is missing.
    """
    return {part: {item: hashlib.sha256(text.encode()).hexdigest()[:16] for item, text in pairs}
            for part, pairs in screened_texts(data_dir).items()}
