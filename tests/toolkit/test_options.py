"""The argparse number types every CLI shares (``toolkit.options``): what they accept, and the sentence a refused
value gets (argparse prints it after the flag's name, with exit status 2)."""

from __future__ import annotations

import argparse

import pytest

from toolkit.options import int_in, positive_float


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
