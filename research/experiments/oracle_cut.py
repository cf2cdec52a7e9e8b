"""A bound, not a method: ours with each chain cut exactly where the target's greedy output leaves it, inside vLLM.

:class:`OracleCutProposer` drafts ours' chains before the step-cost cut (``CREST_ADAPTIVE=0``; the floor
``CREST_MIN_SCORE`` kept) and trims each to its prefix that the saved greedy reference continues with (``python -m
evaluation references``: vLLM fp32's own greedy outputs). Every token the engine verifies is accepted and none that
would be is left out, so no cut of the same chains (no calibration, no step-cost curve) accepts more in fewer verified
tokens: its tok/s is what a perfect cut of ours reaches (``docs/drafter-quality.md`` section 8). Greedy only; a row
whose prompt has no reference (the benchmark's warm-up) drafts nothing.

    python -m research.experiments.oracle_cut --concurrency 1 8 --repeats 2 --accounting   # beside ngram, suffix, ours

runs :mod:`benchmarks.vllm_serving` with ``--methods ngram suffix crest custom:<this class>`` (any of its options
pass through), refusing first what the bound cannot take: a temperature above 0, a set without saved references, or
outputs longer than them (128 tokens).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import numpy as np

from benchmarks._proposer import InstrumentedProposer
from benchmarks.proposer_step import agreed

__all__ = ["OracleCutProposer"]

SETS = ("spec_bench", "humaneval")
"""The sets whose saved greedy references (128 new tokens) the bound cuts by."""
METHOD = "custom:research.experiments.oracle_cut.OracleCutProposer"  # its import path, also when run as __main__


class OracleCutProposer(InstrumentedProposer):
    """Ours' chains before any step-cost cut, each trimmed to the tokens its saved greedy reference accepts.

    Args:
        vllm_config: as :class:`serving.vllm_proposer.CrestProposer`.
        settings: the settings (default: the environment's), ``adaptive`` always off (a cut chain trimmed is no bound).
        references: ``(prompt, output)`` token lists (default: Spec-Bench's and HumanEval's saved references, 128 new
            tokens each: past them a row drafts nothing).
    """

    def __init__(self, vllm_config, settings=None, references: list[tuple[list[int], list[int]]] | None = None) -> None:
        from toolkit.settings import Settings

        super().__init__(vllm_config, replace(settings or Settings.from_env(), adaptive=False))
        if references is None:
            from evaluation.references import load_references

            references = [(r.prompt, r.output) for name in SETS for r in load_references(name)]
        self._outputs = {tuple(prompt): output for prompt, output in references}
        self._prompt_lengths = sorted({len(prompt) for prompt, _ in references})
        self._of_request: dict[int, tuple[int, list[int]] | None] = {}  # request id -> (prompt length, output)
        self.trimmed = 0  # draft tokens cut off by the reference

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        view = self._view  # the plugin's view of the step (the rows' request ids), which propose consumes
        out = super().propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)
        held: Any = view.req_ids if view is not None else self.edge.rows.held if self.edge.rows is not None else {}
        for i, chain in enumerate(out):
            if not chain:
                continue
            row = token_ids_cpu[i, :int(num_tokens_no_spec[i])]
            ref = self._reference(held[i], row)
            kept = [] if ref is None else agreed(chain, ref[1][len(row) - ref[0]:])
            self.trimmed += len(chain) - len(kept)
            out[i] = kept
        return out

    def _reference(self, request: int, row: np.ndarray) -> tuple[int, list[int]] | None:
        """The (prompt length, greedy output) of the request on a row holding ``row`` (its tokens so far)."""
        if request not in self._of_request:
            found = None
            for n in self._prompt_lengths:
                if n < len(row) and (output := self._outputs.get(tuple(row[:n].tolist()))) is not None:
                    found = (n, output)
                    break
            self._of_request[request] = found
        return self._of_request[request]


def main(argv: list[str] | None = None) -> None:
    """Run :mod:`benchmarks.vllm_serving` with the bound beside ngram, suffix and ours, refusing what it cannot take.

    Raises:
        SystemExit: for ``--temperature`` above 0, a set other than Spec-Bench and HumanEval, outputs past 128 tokens,
            or references that are missing or made from other prompts.
    """
    from benchmarks import vllm_serving
    from benchmarks._harness import references
    from evaluation.references import REFERENCES

    argv = list(sys.argv[1:] if argv is None else argv)
    args = vllm_serving.build_parser().parse_args(argv)
    if args.temperature > 0:
        raise SystemExit(f"error: the oracle cut cuts by the greedy references: run it at --temperature 0 (not "
                         f"{args.temperature})")
    other = [name for name in args.sets if name not in SETS]
    if other or args.max_new_tokens > 128:
        raise SystemExit(f"error: the oracle cut cuts by the saved references of {' and '.join(SETS)}, 128 new tokens "
                         "each: pass --sets among those and --max-new-tokens 128 or fewer")
    for name in args.sets:
        references(name, REFERENCES, "all")
    if "--methods" not in argv:
        argv += ["--methods", "ngram", "suffix", "crest"]
    argv[argv.index("--methods") + 1:argv.index("--methods") + 1] = [METHOD]
    vllm_serving.main(argv)


if __name__ == "__main__":
    main()
