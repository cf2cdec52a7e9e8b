"""The replay simulator: accept length of any drafter without running the model.

Lossless greedy decoding always produces the plain-greedy output, so once that
output is saved (the *reference*), each verification step can be replayed: the
accepted path is the longest draft-tree path that matches the reference from
the current position, and the bonus token is the reference's next token. The
steps, and so the accept length, are exactly those of a real fp32 run with the
same drafter and budget (ArcticInference's suffix-decoding simulator does the
same with reference outputs).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .budget import BudgetPolicy, FixedBudget
from .drafters.base import Drafter

__all__ = ["ReplayResult", "replay_step", "replay", "ReferenceStore"]


@dataclass(frozen=True)
class ReplayResult:
    """A replayed request.

    Attributes:
        accepted: ``[num_steps]`` tokens committed per step (bonus included).
        drafted: ``[num_steps]`` draft nodes verified per step.
    """

    accepted: list[int]
    drafted: list[int]

    @property
    def accept_length(self) -> float:
        """Mean tokens committed per verification step."""
        return sum(self.accepted) / len(self.accepted) if self.accepted else 0.0


def replay_step(token_ids: np.ndarray, parents: np.ndarray, reference: Sequence[int], pos: int) -> list[int]:
    """The accepted node path when ``reference[pos:]`` is what the target generates next.

    Args:
        token_ids, parents: the draft tree (``[num_nodes]`` each).
        reference: the full reference output.
        pos: index in ``reference`` of the first token not yet committed.

    Returns:
        Accepted node indices, root first (the bonus token is ``reference[pos + len(path)]``).
    """
    kids: dict[int, dict[int, int]] = {}
    for i, (t, p) in enumerate(zip(np.asarray(token_ids).tolist(), np.asarray(parents).tolist())):
        kids.setdefault(p, {})[t] = i
    path: list[int] = []
    node = -1
    while pos + len(path) < len(reference):
        nxt = kids.get(node, {}).get(int(reference[pos + len(path)]))
        if nxt is None:
            break
        path.append(nxt)
        node = nxt
    return path


def replay(drafter: Drafter, prompt_ids: Sequence[int], reference: Sequence[int],
           budget: BudgetPolicy | None = None) -> ReplayResult:
    """Replay one request's verification steps against its reference output.

    Args:
        drafter: the drafter under test (its ``begin``/``propose``/``extend``/``end`` are called as in decoding).
        prompt_ids: ``[prompt_len]`` prompt token ids.
        reference: ``[output_len]`` the plain-greedy output (first token from the prefill).
        budget: the same policy a real run would use; default ``FixedBudget(16)``.

    Raises:
        ValueError: when ``reference`` is empty.
    """
    if len(reference) == 0:
        raise ValueError("reference is empty: save the plain-greedy output first (ReferenceStore)")
    policy = budget or FixedBudget(16)
    reference = [int(t) for t in reference]
    accepted: list[int] = []
    drafted: list[int] = []
    pos = 1  # the prefill committed reference[0]
    drafter.begin(list(prompt_ids) + reference[:1])
    try:
        while pos < len(reference):
            draft = policy.trim(drafter.propose(policy.max_nodes).draft)
            path = replay_step(draft.tree.token_ids, draft.tree.parents, reference, pos)
            kept = reference[pos: min(pos + len(path) + 1, len(reference))]
            accepted.append(len(kept))
            drafted.append(len(draft))
            pos += len(kept)
            drafter.extend(kept)
    finally:
        drafter.end()
    return ReplayResult(accepted, drafted)


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
