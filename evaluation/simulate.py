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
from typing import Protocol, cast

import numpy as np

from decoder.result import GenerationResult, StepRecord
from drafting.accept import accept_greedy, reference_predictions
from drafting.lifecycle import Drafter, StepDrafts

__all__ = ["replay"]


class _StateDrafter(Protocol):
    """A drafter whose step also reads each row's state (:meth:`drafting.DraftingService.step`)."""

    def step(self, requests: Sequence[str], budgets: Sequence[int], *, tokens: Sequence[Sequence[int]],
             chain: bool, states: np.ndarray) -> StepDrafts: ...


def replay(drafter: Drafter, prompt_ids: Sequence[int], reference: Sequence[int], budget: int = 16, *,
           chain: bool = False, states: np.ndarray | None = None) -> GenerationResult:
    """Replay one request's verification steps against its reference output.

    Args:
        drafter: the drafter under test, driven as in decoding: this call is one request of it
            (``start_request``, a ``step`` per verification step, ``stop_request``).
        prompt_ids: ``[prompt_len]`` prompt token ids.
        reference: ``[output_len]`` the plain-greedy output (first token from the prefill).
        budget: most draft nodes per step, as a real run would use, >= 0.
        chain: verify the drafter's best path only (as chain verifiers such as vLLM's do).
        states: ``[>= prompt_len + output_len - 1, hidden_size]`` float32, C order: the target's final-normed hidden
            state at every position of the prompt and the reference, teacher-forced
            (:func:`evaluation.features.reference_states`). Each step hands the drafter's ``step`` (a
            :class:`drafting.DraftingService` with :meth:`~drafting.DraftingService.set_model`) the row's state at
            its last accepted token, the one that gave its bonus token, as vLLM's runner hands it to the proposer
            (``serving.model_state``). ``None``: none.

    Returns:
        The :class:`~decoder.result.GenerationResult` a real greedy run would give (same output,
        same steps), with ``verify_s``, ``prefill_s`` and ``wall_s`` 0.

    Raises:
        ValueError: when ``reference`` is empty, ``budget < 0``, or ``states`` is not a float32 matrix with a row for
            every position but the last, or is given with an empty prompt.
    """
    if len(reference) == 0:
        raise ValueError("reference is empty: save the plain-greedy output first")
    if budget < 0:
        raise ValueError(f"budget={budget}: must be >= 0")
    given = len(prompt_ids) + len(reference) - 1
    if states is not None and (type(states) is not np.ndarray or states.dtype != np.float32 or states.ndim != 2
                               or len(states) < given or not states.flags.c_contiguous or len(prompt_ids) == 0):
        shape = getattr(states, "shape", None)
        raise ValueError(f"states {type(states).__name__} of shape {shape} for a prompt of {len(prompt_ids)} tokens: "
                         f"pass a C-order float32 array of [>= {given}, hidden_size], the target's state at every "
                         "position of a non-empty prompt and the reference (evaluation.features.reference_states)")
    ref = np.asarray(reference, dtype=np.int64)
    result = GenerationResult([int(t) for t in ref])
    pos = 1  # the prefill committed reference[0]
    req = f"replay-{uuid.uuid4().hex}"  # this request's key in the drafter
    drafter.start_request(req, list(prompt_ids) + result.output_ids[:1])  # the drafter holds its tokens from here on
    kept: list[int] = []
    try:
        while pos < len(ref):
            t0 = time.perf_counter()
            if states is None:
                draft = drafter.step([req], [budget], tokens=[kept], chain=chain).drafts[0]
            else:  # the state that gave the bonus token: at the last accepted one, prompt_len + pos - 2
                at = len(prompt_ids) + pos - 2
                draft = cast(_StateDrafter, drafter).step([req], [budget], tokens=[kept], chain=chain,
                                                          states=states[at:at + 1]).drafts[0]
            draft_s = time.perf_counter() - t0
            path, _ = accept_greedy(draft, reference_predictions(draft.depths, ref, pos))
            kept = result.output_ids[pos: pos + len(path) + 1]
            result.steps.append(StepRecord(len(draft), len(kept), draft_s, 0.0))
            pos += len(kept)
        drafter.step([req], [0], tokens=[kept])  # the last tokens committed: the output is whole when it stops
    finally:
        drafter.stop_request(req)
    return result
