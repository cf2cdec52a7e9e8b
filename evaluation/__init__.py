"""Evaluation: the packaged prompt sets (Spec-Bench, HumanEval, MT-Bench; each split into a fit half and a report
half), exact replay of any drafter over saved greedy references, and the HF-loop benchmark
(``python -m evaluation bench|replay``).

Public API: :func:`load_prompts` and the :class:`Prompt` it returns, and :func:`replay` (a drafter's steps and accept
length over one greedy reference, without running the model). Importing the package loads no torch; the benchmark
and the CLI (:mod:`evaluation.cli`) need the ``hf`` extra.
"""

from .prompts import Prompt, load_prompts
from .simulate import replay

__all__ = ["Prompt", "load_prompts", "replay"]
