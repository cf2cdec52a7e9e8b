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

import time
import uuid
from collections.abc import Sequence

import numpy as np

from decoder.result import GenerationResult, StepRecord
from drafting.accept import accept_greedy, reference_predictions
from drafting.lifecycle import Drafter

__all__ = ["replay"]


def replay(drafter: Drafter, prompt_ids: Sequence[int], reference: Sequence[int], budget: int = 16, *,
           chain: bool = False) -> GenerationResult:
    """Replay one request's verification steps against its reference output.

    Args:
        drafter: the drafter under test, driven as in decoding: this call is one request of it
            (``start_request``, a ``step`` per verification step, ``stop_request``).
        prompt_ids: ``[prompt_len]`` prompt token ids.
        reference: ``[output_len]`` the plain-greedy output (first token from the prefill).
        budget: most draft nodes per step, as a real run would use, >= 0.
        chain: verify the drafter's best path only (as chain verifiers such as vLLM's do).

    Returns:
        The :class:`~decoder.result.GenerationResult` a real greedy run would give (same output,
        same steps), with ``verify_s``, ``prefill_s`` and ``wall_s`` 0.

    Raises:
        ValueError: when ``reference`` is empty or ``budget < 0``.
    """
    if len(reference) == 0:
        raise ValueError("reference is empty: save the plain-greedy output first")
    if budget < 0:
        raise ValueError(f"budget={budget}: must be >= 0")
    ref = np.asarray(reference, dtype=np.int64)
    result = GenerationResult([int(t) for t in ref])
    pos = 1  # the prefill committed reference[0]
    req = f"replay-{uuid.uuid4().hex}"  # this request's key in the drafter
    drafter.start_request(req, list(prompt_ids) + result.output_ids[:1])  # the drafter holds its tokens from here on
    kept: list[int] = []
    try:
        while pos < len(ref):
            t0 = time.perf_counter()
            draft = drafter.step([req], [budget], tokens=[kept], chain=chain).drafts[0]
            draft_s = time.perf_counter() - t0
            path, _ = accept_greedy(draft, reference_predictions(draft.depths, ref, pos))
            kept = result.output_ids[pos: pos + len(path) + 1]
            result.steps.append(StepRecord(len(draft), len(kept), draft_s, 0.0))
            pos += len(kept)
        drafter.step([req], [0], tokens=[kept])  # the last tokens committed: the output is whole when it stops
    finally:
        drafter.stop_request(req)
    return result
