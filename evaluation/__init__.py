"""Evaluation: the packaged prompt sets (Spec-Bench, HumanEval, MT-Bench; each split into a fit half and a report
half), exact replay of any drafter over saved greedy references, and the HF-loop benchmark
(``python -m evaluation bench|replay``).

Public API: :func:`load_prompts` and the :class:`Prompt` it returns, :func:`replay` (a drafter's steps and accept
length over one greedy reference, without running the model) and :func:`require_clean` (the gate that refuses to
score a set on a datastore whose corpus holds it). Importing the package loads no torch; the benchmark
and the CLI (:mod:`evaluation.cli`) need the ``hf`` extra.
"""

from .contamination import Contaminated, NotScreened, require_clean
from .prompts import Prompt, load_prompts
from .simulate import replay

__all__ = ["Contaminated", "NotScreened", "Prompt", "load_prompts", "replay", "require_clean"]
