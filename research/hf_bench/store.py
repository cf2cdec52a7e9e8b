"""Plain-greedy references the HF loop saved (``python -m research.hf_bench replay``), keyed by model, dtype, prompt
set and length, under ``<cache>/references``: what the HF-loop benchmark and the studies replay against (the product's
references, with their provenance, are :mod:`evaluation.references`)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from toolkit.tokenizer import cache_dir

__all__ = ["ReferenceStore", "reference_store"]


class ReferenceStore:
    """Plain-greedy reference outputs saved as JSON Lines, one file per model, set and ``max_new_tokens``.

    Each line: ``{"id": prompt id, "prompt_ids": [...], "output_ids": [...]}``.

    Args:
        path: the JSONL file.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._rows: dict[str, dict] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    self._rows[row["id"]] = row

    def get(self, prompt_id: str, prompt_ids: Sequence[int]) -> list[int] | None:
        """The saved output for this prompt, or ``None`` (also when the prompt's tokens changed)."""
        row = self._rows.get(prompt_id)
        if row is None or row["prompt_ids"] != list(prompt_ids):
            return None
        return row["output_ids"]

    def put(self, prompt_id: str, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None:
        """Save (append) one reference."""
        row = {"id": prompt_id, "prompt_ids": [int(t) for t in prompt_ids], "output_ids": [int(t) for t in output_ids]}
        self._rows[prompt_id] = row
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def ids(self) -> Iterable[str]:
        """Saved prompt ids."""
        return self._rows.keys()


def reference_store(spec: str, dtype: str, prompt_set: str, max_new_tokens: int) -> ReferenceStore:
    """The reference file for a model spec, dtype name (``float32``...), prompt set and output length,
    under ``<cache>/references``."""
    key = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{spec}-{dtype}")
    return ReferenceStore(Path(cache_dir()) / "references" / key / f"{prompt_set}-{max_new_tokens}.jsonl")
