"""Saved greedy references (``benchmarks/references.py``) and the fit / report halves of each set."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REFERENCES = REPO / "results" / "references"


@dataclass(frozen=True)
class Reference:
    """One prompt's plain-greedy output. category: Spec-Bench's, or ``humaneval``."""

    id: str
    category: str
    prompt: list[int]
    output: list[int]


def load_references(name: str, folder: Path = REFERENCES) -> list[Reference]:
    """A set's references in file order.

    Raises:
        SystemExit: when the set was not generated yet (the message gives the command).
    """
    path = Path(folder) / f"{name}.jsonl"
    if not path.exists():
        raise SystemExit(f"{path} not found: generate the references first (.venv/bin/python benchmarks/references.py)")
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            category = "humaneval" if name == "humaneval" else r["id"].split("/")[0].rsplit("-", 1)[0]
            out.append(Reference(r["id"], category, r["prompt_ids"], r["output_ids"]))
    return out


def half(refs: list[Reference], which: str) -> list[Reference]:
    """``fit``: the even positions within each category; ``report``: the odd ones; ``all``: every one.
    File order is kept."""
    if which == "all":
        return list(refs)
    parity = {"fit": 0, "report": 1}[which]
    seen: dict[str, int] = {}
    out = []
    for r in refs:
        i = seen[r.category] = seen.get(r.category, -1) + 1
        if i % 2 == parity:
            out.append(r)
    return out
