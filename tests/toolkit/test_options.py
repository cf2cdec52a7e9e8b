"""The argparse number types every CLI shares (``toolkit.options``): what they accept, and the sentence a refused
value gets (argparse prints it after the flag's name, with exit status 2)."""

from __future__ import annotations

import argparse

import pytest

from toolkit.options import checked, float_in, int_in, percent, positive_float


@pytest.mark.parametrize(("parse", "text", "value"), [
    (int_in(1), "1", 1), (int_in(1), "512", 512), (int_in(0, 63), "0", 0), (int_in(0, 63), "63", 63),
    (positive_float, "1e-3", 1e-3), (positive_float, "2", 2.0),
])
def test_accepted(parse, text, value):
    got = parse(text)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(("parse", "text", "message"), [
    (int_in(1), "0", "0: must be >= 1"), (int_in(1), "2.5", "'2.5' is not an integer"),
    (int_in(1), "", "'' is not an integer"), (int_in(0, 63), "64", "64 is outside 0..63"),
    (positive_float, "0", "0: must be a finite number > 0"), (positive_float, "-1e-3", "must be a finite number > 0"),
    (positive_float, "nan", "nan: must be a finite number > 0"), (positive_float, "inf", "must be a finite number"),
    (positive_float, "fast", "'fast' is not a number"),
])
def test_refused_with_the_reason(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse(text)


@pytest.mark.parametrize(("parse", "text", "value"), [
    (float_in(0), "0", 0.0), (float_in(0), "64", 64.0), (float_in(0, 1), "1", 1.0), (float_in(0, 1), "0.1", 0.1),
    (percent, "100", 100.0), (percent, "0.5", 0.5),
])
def test_ranges_accept_their_ends(parse, text, value):
    assert parse(text) == value


@pytest.mark.parametrize(("parse", "text", "message"), [
    (float_in(0), "-1", "-1: must be a finite number >= 0"), (float_in(0), "inf", "must be a finite number >= 0"),
    (float_in(0), "nan", "nan: must be a finite number"), (float_in(0, 1), "1.01", r"1.01 is outside \[0, 1\]"),
    (float_in(0, 1), "nan", r"nan is outside \[0, 1\]"), (float_in(0, 1), "x", "'x' is not a number"),
    (percent, "0", r"0: must be a percentage in \(0, 100\]"), (percent, "101", "must be a percentage"),
    (percent, "nan", "must be a percentage"),
])
def test_ranges_refuse_with_the_reason(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse(text)


def test_checked_raises_only_the_named_errors_as_argparse_errors_with_their_messages():
    def check(text: str) -> str:
        if text == "bad":
            raise ValueError("bad: use a good one")
        if text == "missing":
            raise FileNotFoundError("missing: no such file")
        return text

    assert checked(check, "ok") == "ok"
    with pytest.raises(argparse.ArgumentTypeError, match="^bad: use a good one$"):
        checked(check, "bad")
    with pytest.raises(FileNotFoundError):  # not named: not argparse's, a caller's bug shows as itself
        checked(check, "missing")
    with pytest.raises(argparse.ArgumentTypeError, match="^missing: no such file$"):
        checked(check, "missing", (ValueError, FileNotFoundError))
