"""``python -m research.study`` (:mod:`research.study.cli`): every bad input refused with the documented exit code and
a one-line message
naming it."""

from __future__ import annotations

import pytest

from support import NO_SUCH, check_refusal

STUDY = [
    (["storage", "--corpus", "poetry"], 2, ("'poetry'",)),
    (["storage", "--budget", "0"], 2, ("--budget",)),
    (["storage", "--single-n", "9"], 2, ("--single-n", "9")),
    (["storage", "--combined-m", "1"], 2, ("--combined-m",)),
    (["storage", "--top-t", "0"], 2, ("--top-t",)),
    (["storage", "--rest-fractions", "150%"], 2, ("150%",)),
    (["storage", "--data-dir", NO_SUCH], 2, (NO_SUCH,)),
    (["storage", "--name-prefix", "bad prefix"], 2, ("'bad prefix'",)),
    (["storage", "--model", NO_SUCH], 2, (NO_SUCH,)),
    (["storage", "--database-url", "not-a-url"], 2, ("not-a-url",)),
    (["corpus-size", "--corpus", "poetry"], 2, ("'poetry'",)),
    (["corpus-size", "--top-t", "0"], 2, ("--top-t",)),
    (["corpus-size", "--scaled-top-t", "-3"], 2, ("--scaled-top-t",)),
    (["corpus-size", "--tree-budgets", "0"], 2, ("--tree-budgets",)),
    (["corpus-size", "--lookups", "0"], 2, ("--lookups",)),
    (["corpus-size", "--corpus-limit", "none"], 2, ("--corpus-limit",)),
    (["corpus-size", "--data-dir", NO_SUCH], 2, (NO_SUCH,)),
]


@pytest.mark.parametrize("argv,code,names", STUDY, ids=[" ".join(a) for a, _, _ in STUDY])
def test_study_storage_refuses_bad_input(argv, code, names, capsys):
    from research.study.cli import main

    check_refusal(main, argv, code, names, capsys)
