"""A contamination check: how much of each evaluation prompt occurs verbatim in the corpus.

An evaluation set must never be part of a datastore scored on it. Using the REST
suffix index of the whole corpus, the check finds for every prompt the longest run
of its tokens that occurs in the corpus (matching statistics: the run starting at
position i+1 is at least the run at i minus one, so each prompt costs a linear
number of suffix-array searches). The chat template's head and tail, shared by
every prompt of a set, are left out first: they occur in a chat corpus by design.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.rest_index import SuffixIndex
from evaluation.prompts import Prompt


@dataclass(frozen=True)
class Overlap:
    """One prompt's overlap: ``run`` tokens of its ``length`` content tokens occur in the corpus in one piece."""

    prompt_id: str
    run: int
    length: int


def longest_run(index: SuffixIndex, tokens: Sequence[int]) -> int:
    """Length of the longest contiguous slice of ``tokens`` that occurs in the indexed corpus."""
    best = run = 0
    toks = [int(t) for t in tokens]
    for i in range(len(toks)):
        run = max(run - 1, 0)
        while i + run < len(toks):
            lo, hi = index.find(toks[i:i + run + 1])
            if hi <= lo:
                break
            run += 1
        best = max(best, run)
    return best


def _shared_affixes(seqs: Sequence[Sequence[int]]) -> tuple[int, int]:
    """Lengths of the prefix and suffix every sequence shares (0 for fewer than two sequences)."""
    if len(seqs) < 2:
        return 0, 0
    shortest = min(len(s) for s in seqs)
    head = next((i for i in range(shortest) if len({s[i] for s in seqs}) > 1), shortest)
    tail = next((i for i in range(shortest - head) if len({s[-1 - i] for s in seqs}) > 1), shortest - head)
    return head, tail


def prompt_overlaps(index: SuffixIndex, prompts: Sequence[Prompt]) -> list[Overlap]:
    """Each prompt's longest run in the corpus, over its content (shared template head and tail removed)."""
    head, tail = _shared_affixes([p.token_ids for p in prompts])
    out = []
    for p in prompts:
        content = p.token_ids[head:len(p.token_ids) - tail]
        out.append(Overlap(p.id, longest_run(index, content), len(content)))
    return out
