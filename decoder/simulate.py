"""The replay simulator: accept length of any drafter without running the model.

Lossless greedy decoding always produces the plain-greedy output, so once that
output is saved (the *reference*), each verification step can be replayed: the
target's choice after every draft node is the reference token at that depth, so
the accept walk of verification (:func:`decoder.verify.accept_greedy`) run over
those choices accepts the longest draft path that matches the reference, and the
bonus token is the reference's next token. The steps, and so the accept length,
are exactly those of a real fp32 run with the same drafter and budget
(ArcticInference's suffix-decoding simulator does the same with reference outputs).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .draft import Draft
from .drafters.base import Drafter
from .generate import GenerationResult, StepRecord
from .verify import accept_greedy

__all__ = ["reference_predictions", "replay", "ReferenceStore"]


def reference_predictions(draft: Draft, reference: np.ndarray, pos: int) -> np.ndarray:
    """``[1 + num_nodes]`` the target's choice after the last committed token and after each node, when
    ``reference[pos:]`` is what it generates next: the reference token at that depth (``-1`` past its end).

    Args:
        draft: the draft tree.
        reference: ``[output_len]`` int64, the full reference output.
        pos: index in ``reference`` of the first token not yet committed.
    """
    at = pos + np.concatenate([[0], draft.depths])
    out = np.full(len(at), -1, dtype=np.int64)
    inside = at < len(reference)
    out[inside] = reference[at[inside]]
    return out


def replay(drafter: Drafter, prompt_ids: Sequence[int], reference: Sequence[int], budget: int = 16) -> GenerationResult:
    """Replay one request's verification steps against its reference output.

    Args:
        drafter: the drafter under test (its ``begin``/``propose``/``extend``/``end`` are called as in decoding).
        prompt_ids: ``[prompt_len]`` prompt token ids.
        reference: ``[output_len]`` the plain-greedy output (first token from the prefill).
        budget: most draft nodes per step, as a real run would use, >= 0.

    Returns:
        The :class:`~decoder.generate.GenerationResult` a real greedy run would give (same output,
        same steps), with ``verify_s``, ``prefill_s`` and ``wall_s`` 0.

    Raises:
        ValueError: when ``reference`` is empty or ``budget < 0``.
    """
    if len(reference) == 0:
        raise ValueError("reference is empty: save the plain-greedy output first (ReferenceStore)")
    if budget < 0:
        raise ValueError(f"budget={budget}: must be >= 0")
    ref = np.asarray(reference, dtype=np.int64)
    result = GenerationResult([int(t) for t in ref])
    pos = 1  # the prefill committed reference[0]
    drafter.begin(list(prompt_ids) + result.output_ids[:1])
    try:
        while pos < len(ref):
            draft = drafter.propose(budget)
            path, _ = accept_greedy(draft, reference_predictions(draft, ref, pos))
            kept = result.output_ids[pos: pos + len(path) + 1]
            result.steps.append(StepRecord(len(draft), len(kept), draft.lookup_s, draft.trie_s, draft.merge_s, 0.0))
            pos += len(kept)
            drafter.extend(kept)
    finally:
        drafter.end()
    return result


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
