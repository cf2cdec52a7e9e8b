"""What every package of crest-spec shares: the settings read from the environment (:mod:`toolkit.settings`), the
target's tokenizer (:mod:`toolkit.tokenizer`), the evaluation sets' files (:mod:`toolkit.eval_sets`), optional
dependencies (:mod:`toolkit.extras`) and the command lines' exit codes, errors and options (:mod:`toolkit.console`,
:mod:`toolkit.options`). It imports no other package of
the project.

Public API: :func:`load_tokenizer` (the default target's tokenizer ships in ``toolkit/data/smollm2``).
"""

from .tokenizer import load_tokenizer

__all__ = ["load_tokenizer"]
