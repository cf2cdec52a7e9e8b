"""Evaluation: the packaged prompt sets (Spec-Bench, HumanEval, MT-Bench; each split into a fit half and a report
half), the target's saved greedy references with their provenance, exact replay of any drafter over them, the gate
that refuses to score a set on a datastore whose corpus holds it, and what tunes a drafter on the fit half
(``python -m evaluation references|calibrate|choose-k|train-head|head-pack``; ``evaluation/head_gpu.py`` trains the
head on a GPU, run as a file).

Public API: :func:`load_prompts` and the :class:`Prompt` it returns, :func:`load_references` and :func:`half` (a set's
references, one half of them), :func:`replay` (a drafter's steps and accept length over one greedy reference, without
running the model) and :func:`require_clean`. Importing the package loads no torch.
"""

from .contamination import Contaminated, NotScreened, require_clean
from .prompts import Prompt, load_prompts
from .references import half, load_references
from .simulate import replay

__all__ = ["Contaminated", "NotScreened", "Prompt", "half", "load_prompts", "load_references", "replay",
           "require_clean"]
