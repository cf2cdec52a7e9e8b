"""The engine's verdicts fed back into the goodput cut (``csrc/feedback.hpp``; bit for bit against its oracle in
``tests/drafting/test_native.py``): a request whose drafts the engine rejects drafts less, one whose drafts it accepts
drafts more again, the verdicts reach past what the engine verified, and drafts not cut to a curve never change."""

from __future__ import annotations

import numpy as np
import pytest

import crest_native
from drafting.calibration import Calibration
from drafting.draft import CostCurve
from support import given_trees, native_core, native_extend, native_step

CHAIN = np.arange(10, 18, dtype=np.uint32)
"""The datastore's one continuation: eight tokens, each seen nearly every time after the last."""
STORED = [(3, CHAIN, np.arange(-1, 7, dtype=np.int32), np.array([100, 97, 94, 91, 88, 85, 82, 79], np.uint32), 100)]
CURVE = CostCurve(np.array([1.0, 4.0, 9.0]), np.array([0.020, 0.022, 0.045]), 0.005)
"""A step of one row: flat to 4 tokens, then dearer."""


@pytest.fixture()
def core() -> crest_native.Core:
    return native_core(calibration=Calibration.load(), sources=("ds",), outputs_bytes=0)


def _draft(core, handle: int, curve: CostCurve | None) -> np.ndarray:
    made = native_step(core, [handle], [8], given_trees([STORED]), chain=True, curve=curve)
    assert made.offsets.tolist() == [0, len(made.tokens)]
    return made.tokens


def test_rejections_shorten_the_cut_and_acceptances_lengthen_it(core):
    handle = core.start(np.array([1, 2, 3], np.uint32))
    first = _draft(core, handle, CURVE)
    assert 0 < len(first) < 8 and core.acceptance(handle) == pytest.approx(1.0)
    lengths, ratios = [], []
    for _ in range(12):  # the engine rejects the first token every time (a sampling engine at high temperature)
        native_extend(core, handle, [99])
        lengths.append(len(_draft(core, handle, CURVE)))
        ratios.append(core.acceptance(handle))
    assert ratios == sorted(ratios, reverse=True) and ratios[-1] < 0.3
    assert lengths == sorted(lengths, reverse=True) and lengths[-1] < len(first)
    for _ in range(12):  # then takes the whole chain and its bonus token
        native_extend(core, handle, [*CHAIN.tolist(), 7])
        lengths.append(len(_draft(core, handle, CURVE)))
    assert core.acceptance(handle) > ratios[0] and lengths[-1] >= len(first)


def test_a_request_cut_to_nothing_is_still_judged_by_its_bonus_tokens(core):
    steep = CostCurve(np.array([1.0, 2.0]), np.array([0.02, 0.04]), 0.02)  # no token pays: each doubles the step
    handle = core.start(np.array([1, 2, 3], np.uint32))
    ratios = [core.acceptance(handle)]
    for token in [99] * 6 + [int(CHAIN[0])] * 6:  # the target's next token: not the draft's first, then it
        assert len(_draft(core, handle, steep)) == 0
        native_extend(core, handle, [token])
        ratios.append(core.acceptance(handle))
    assert ratios[:7] == sorted(ratios[:7], reverse=True) and ratios[6:] == sorted(ratios[6:])
    assert ratios[-1] > ratios[6] + 0.2


def test_a_new_request_starts_from_every_request_s_ratio(core):
    old = core.start(np.array([1, 2, 3], np.uint32))
    for _ in range(30):
        _draft(core, old, CURVE)
        native_extend(core, old, [99])
    new = core.start(np.array([4, 5, 6], np.uint32))
    assert core.acceptance(old) < core.acceptance(new) < 0.9
    assert core.stop(old) is not None and core.acceptance(old) == -1.0


def test_verdicts_never_change_drafts_that_are_not_cut(core):
    handle = core.start(np.array([1, 2, 3], np.uint32))
    whole = _draft(core, handle, None)
    for _ in range(10):
        native_extend(core, handle, [99])
        assert _draft(core, handle, None).tolist() == whole.tolist()
    assert core.acceptance(handle) < 0.5


def test_a_curve_cuts_chains_only(core):
    handle = core.start(np.array([1, 2, 3], np.uint32))
    with pytest.raises(ValueError, match="chains only"):
        native_step(core, [handle], [8], given_trees([STORED]), chain=False, curve=CURVE)
