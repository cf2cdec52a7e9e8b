"""The replay simulator: accept length of any drafter without running the model.

Lossless greedy decoding always produces the plain-greedy output, so once that
output is saved (the *reference*), each verification step can be replayed: the
target's choice after every draft node is the reference token at that depth, so
the accept rule of verification (:func:`drafting.accept.accept_greedy`) run over
those choices accepts the longest draft path that matches the reference, and the
bonus token is the reference's next token. The steps, and so the accept length,
are exactly those of a real fp32 run with the same drafter and budget
(ArcticInference's suffix-decoding simulator does the same with reference outputs).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from decoder.result import GenerationResult, StepRecord
from drafting.accept import accept_greedy, reference_predictions
from drafting.lifecycle import Drafter

__all__ = ["replay"]


def replay(drafter: Drafter, prompt_ids: Sequence[int], reference: Sequence[int], budget: int = 16, *,
           chain: bool = False, hidden=None) -> GenerationResult:
    """Replay one request's verification steps against its reference output.

    Args:
        drafter: the drafter under test, driven as in decoding: this call is one request of it
            (``start_request`` / ``propose`` / ``add_tokens`` / ``stop_request``).
        prompt_ids: ``[prompt_len]`` prompt token ids.
        reference: ``[output_len]`` the plain-greedy output (first token from the prefill).
        budget: most draft nodes per step, as a real run would use, >= 0.
        chain: verify the drafter's best path only (as chain verifiers such as vLLM's do).
        hidden: for a drafter that reads hidden states (``hidden_states``), the target's
            last hidden state at every position of ``prompt_ids + reference`` (``[prompt_len + output_len, d]``, one
            forward pass over the sequence: :func:`s4c.features.target_features`); each step hands it the states of
            the positions a real run's verification would have computed.

    Returns:
        The :class:`~decoder.result.GenerationResult` a real greedy run would give (same output,
        same steps), with ``verify_s``, ``prefill_s`` and ``wall_s`` 0.

    Raises:
        ValueError: when ``reference`` is empty, ``budget < 0``, or a drafter that reads hidden states gets none (or
            too few).
    """
    if len(reference) == 0:
        raise ValueError("reference is empty: save the plain-greedy output first (ReferenceStore)")
    if budget < 0:
        raise ValueError(f"budget={budget}: must be >= 0")
    reads = drafter if drafter.hidden_states else None
    if reads is not None and (hidden is None or len(hidden) < len(prompt_ids) + len(reference) - 1):
        raise ValueError(f"the {drafter.name} drafter reads the target's hidden states: pass hidden=, the states of "
                         "every position of prompt + reference (s4c.features.target_features)")
    ref = np.asarray(reference, dtype=np.int64)
    result = GenerationResult([int(t) for t in ref])
    pos = 1  # the prefill committed reference[0]
    req = f"replay-{uuid.uuid4().hex}"  # this request's key in the drafter
    committed = len(prompt_ids) + 1  # the request's tokens: the drafter holds them from here on
    drafter.start_request(req, list(prompt_ids) + result.output_ids[:1])
    try:
        if reads is not None:
            reads.add_hidden_states(req, hidden[: committed - 1])
        while pos < len(ref):
            t0 = time.perf_counter()
            draft = drafter.propose([(req, budget)], chain=chain)[0]
            draft_s = time.perf_counter() - t0
            path, _ = accept_greedy(draft, reference_predictions(draft.depths, ref, pos))
            kept = result.output_ids[pos: pos + len(path) + 1]
            result.steps.append(StepRecord(len(draft), len(kept), draft_s, 0.0))
            pos += len(kept)
            committed += len(kept)
            drafter.add_tokens(req, kept)
            if reads is not None:
                reads.add_hidden_states(req, hidden[committed - len(kept) - 1: committed - 1])
    finally:
        drafter.stop_request(req)
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
