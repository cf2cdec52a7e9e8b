"""The GPU projection (``benchmarks/gpu_projection.py``): known answers of the cited step model on a run's figures."""

from __future__ import annotations

import pytest
from gpu_projection import StepModel, project


def _run(method: str, c: int, tokens: int, accepted: int, drafted: int, propose_ms: float) -> dict:
    return {"method": method, "concurrency": c, "sets": {"s": {
        "prompts": ["p"] * c, "tokens": tokens, "prompt_tokens": 936 * c,
        "counters": {"spec_decode_num_accepted_tokens": accepted, "spec_decode_num_draft_tokens": drafted},
        "propose": {"mean_ms": propose_ms}}}}


def test_known_answers_of_the_step_model():
    """One stream, a 1K context (936 prompt tokens and half of 128): 5.95 ms a plain step, so 168 tokens/s; a
    drafter that doubles the tokens per step with 3 draft tokens and a 0.1 ms proposer."""
    rows = project({"runs": [_run("none", 1, 129, 0, 0, 0.0), _run("ours", 1, 129, 64, 192, 0.1)]}, StepModel())
    none, ours = rows
    assert none.step_ms == pytest.approx(5.886 + 0.02101 + 3.9e-5 * 1000) and round(none.tokens_per_s) == 168
    assert ours.accept_length == pytest.approx(2.0) and ours.drafted == pytest.approx(3.0)
    assert ours.step_ms == pytest.approx(5.886 + 0.02101 * 4 + 3.9e-5 * 1000 + 0.1)
    assert ours.tokens_per_s == pytest.approx(2000 / ours.step_ms)
    assert ours.speedup_vs_none == pytest.approx(ours.tokens_per_s / none.tokens_per_s) and none.speedup_vs_none == 1
    eight = project({"runs": [_run("none", 8, 8 * 129, 0, 0, 0.0)]}, StepModel())[0]
    assert eight.step_ms == pytest.approx(5.886 + 0.02101 * 8 + 3.9e-5 * 8000)
