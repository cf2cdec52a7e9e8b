"""The vLLM hook driven as vLLM's model runner drives it (:mod:`benchmarks.proposer_step`): the draft tokens a greedy
verifier accepts."""

from __future__ import annotations

from benchmarks.proposer_step import agreed


def test_agreed_is_the_prefix_the_target_continues_with():
    assert agreed([5, 6, 7], [5, 6, 9, 7]) == [5, 6]
    assert agreed([5, 6], [5, 6, 7]) == [5, 6]
    assert agreed([5, 6, 7], [5]) == [5]  # the reference ends
    assert agreed([4], [5]) == [] and agreed([], [5]) == []
