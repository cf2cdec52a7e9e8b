"""The evaluation sets' files: where they are and their rows, read once for scoring (:mod:`evaluation.prompts`) and
for screening a corpus against them (:mod:`ingest.contamination`).

The sets ship in the package (``toolkit/data/eval``: Spec-Bench and HumanEval, with their licences and sources);
``CREST_EVAL_DATA`` (or a command's ``--data-dir``) names another folder of the same layout.

The function-calling sets, :data:`BFCL_SETS`, are read from the Berkeley Function Calling Leaderboard's data as its
``bfcl-eval`` wheel on PyPI ships it (Apache 2.0; version :data:`BFCL_VERSION`): the wheel's ``bfcl_eval/data`` folder,
``CREST_BFCL_DATA``, else ``<CREST_CACHE>/bfcl-<version>`` (``python -m evaluation fetch-bfcl`` puts it there; the
data is not shipped here). ``bfcl`` is the development set: the first :data:`BFCL_PER_CATEGORY` entries of each of
:data:`BFCL_CATEGORIES` (file order; a multi-turn entry counts its turns); ``bfcl_heldout`` (``live_multiple``,
``live_parallel_multiple``) is left out of all development and fitting: it checks that what was fitted generalises.
Each row is one entry: its user turns, and the functions it may call (a multi-turn entry's: the functions of its
classes, but those it excludes).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .settings import Settings

__all__ = ["BFCL_CATEGORIES", "BFCL_PER_CATEGORY", "BFCL_SETS", "BFCL_VERSION", "PACKAGED", "SETS", "bfcl_dir",
           "default_data_dir", "item_digests", "read_rows", "screened_texts"]

SETS = ("spec_bench", "humaneval")
BFCL_SETS = ("bfcl", "bfcl_heldout")
BFCL_VERSION = "2026.3.23"
"""The ``bfcl-eval`` wheel whose data the BFCL sets are read from."""
BFCL_CATEGORIES = {"bfcl": ("simple_python", "multiple", "parallel", "live_simple", "multi_turn_base"),
                   "bfcl_heldout": ("live_multiple", "live_parallel_multiple")}
BFCL_PER_CATEGORY = 48
"""Prompts kept per BFCL category (a multi-turn entry's turns each count)."""
_CLASS_DOCS = {"GorillaFileSystem": "gorilla_file_system", "MathAPI": "math_api", "MessageAPI": "message_api",
               "TwitterAPI": "posting_api", "TicketAPI": "ticket_api", "TradingBot": "trading_bot",
               "TravelAPI": "travel_booking", "VehicleControlAPI": "vehicle_control"}
"""A multi-turn entry's classes, by the file of ``multi_turn_func_doc`` that documents their functions."""
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
    if name in BFCL_SETS:
        return _bfcl_rows(name)
    if name not in SETS:
        raise ValueError(f"unknown prompt set {name!r}: choose one of {', '.join(SETS + BFCL_SETS)}")
    path = Path(data_dir if data_dir is not None else default_data_dir()) / _FILES[name]
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: pass --data-dir (or set CREST_EVAL_DATA) to the folder "
                                "holding spec_bench/ and humaneval/")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def bfcl_dir() -> Path:
    """Where the BFCL data is: ``CREST_BFCL_DATA``, else ``<CREST_CACHE>/bfcl-<version>`` (the wheel's
    ``bfcl_eval/data`` folder, as ``python -m evaluation fetch-bfcl`` extracts it)."""
    s = Settings.from_env()
    return s.bfcl_data if s.bfcl_data is not None else s.cache_dir / f"bfcl-{BFCL_VERSION}"


def _bfcl_rows(name: str) -> list[dict]:
    """The rows of BFCL set ``name`` (see the module docstring): ``{"id": "<category>-<position>", "category",
    "source_id" (BFCL's), "turns": [[messages], ...], "functions": [...]}``, file order by category.

    Raises:
        FileNotFoundError: when the BFCL data is missing (the message gives the command that fetches it).
    """
    folder = bfcl_dir()
    out = []
    for category in BFCL_CATEGORIES[name]:
        path = folder / f"BFCL_v4_{category}.json"
        if not path.exists():
            raise FileNotFoundError(f"{path} not found: fetch the BFCL data with `python -m evaluation fetch-bfcl` (or "
                                    "point CREST_BFCL_DATA at the bfcl_eval/data folder of the bfcl-eval wheel "
                                    f"{BFCL_VERSION})")
        prompts = 0
        for position, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            if prompts >= BFCL_PER_CATEGORY:
                break
            if not line.strip():
                continue
            entry = json.loads(line)
            functions = entry.get("function") or _class_functions(folder, entry)
            out.append({"id": f"{category}-{position}", "category": category, "source_id": entry["id"],
                        "turns": entry["question"], "functions": functions})
            prompts += len(entry["question"])
    return out


def _class_functions(folder: Path, entry: dict) -> list[dict]:
    """A multi-turn entry's functions: those of its classes (``multi_turn_func_doc``), but the ones it excludes."""
    excluded = set(entry.get("excluded_function", ()))
    out = []
    for cls in entry.get("involved_classes", ()):
        doc = folder / "multi_turn_func_doc" / f"{_CLASS_DOCS[cls]}.json"
        out += [f for f in map(json.loads, doc.read_text(encoding="utf-8").splitlines())
                if f["name"] not in excluded]
    return out


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
    out = {"spec_bench": chat, "humaneval": [(r["task_id"], r["prompt"]) for r in code],
           "humaneval_solutions": [(r["task_id"], r["canonical_solution"]) for r in code]}
    if (bfcl_dir() / "BFCL_v4_simple_python.json").exists():  # the BFCL sets, where their data is on this host
        out["bfcl"] = [(r["id"], "\n".join(m["content"] for turn in r["turns"] for m in turn if m["role"] == "user"))
                       for name in BFCL_SETS for r in read_rows(name)]
    return out


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
