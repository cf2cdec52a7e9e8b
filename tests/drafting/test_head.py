"""The draft head (:class:`drafting.DraftHead`): its file round trip, the errors that name the fix, and which target's
LM head it fits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from crest_native import MODEL_FEATURES
from drafting import Calibration, DraftHead
from drafting.head import row_norms

D, HIDDEN, V = 8, 12, 40


def calibration() -> Calibration:
    cal = Calibration.load()
    return Calibration(np.concatenate([cal.coef, [0.5, 1.0, 2.0]]), cal.intercept, cal.prior, sources=cal.sources)


def head(lm_head: np.ndarray, seed: int = 0) -> DraftHead:
    rng = np.random.default_rng(seed)
    shapes = {"up": (2 * D, HIDDEN), "up_bias": (HIDDEN,), "down": (HIDDEN, D), "down_bias": (D,), "state_gain": (D,),
              "token_gain": (D,)}
    arrays: dict[str, Any] = {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}
    return DraftHead(**arrays, calibration=calibration(),
                     target={"vocab_size": V, "hidden_size": D, "model": "test", "row_norms": row_norms(lm_head)})


def test_a_head_round_trips_through_its_file(tmp_path):
    lm_head = np.random.default_rng(1).normal(size=(V, D)).astype(np.float32)
    h = head(lm_head)
    h.save(tmp_path / "h.npz")
    back = DraftHead.load(tmp_path / "h.npz")
    for name in ("up", "up_bias", "down", "down_bias", "state_gain", "token_gain"):
        got, want = getattr(back, name), getattr(h, name)
        assert got.dtype == np.float32 and got.flags.c_contiguous
        assert np.array_equal(got, want.astype(np.float16).astype(np.float32)), name  # stored in float16
    assert back.calibration.coef.tolist() == h.calibration.coef.tolist() and back.target == h.target
    assert back.fits(lm_head) and back.fits(lm_head.astype(np.float16).astype(np.float32))
    assert not back.fits(lm_head * 1.5) and not back.fits(lm_head[:, :4])


def test_a_bad_head_is_refused_naming_the_fix(tmp_path):
    lm_head = np.ones((V, D), np.float32)
    with pytest.raises(FileNotFoundError, match="python -m evaluation train-head"):
        DraftHead.load(tmp_path / "none.npz")
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(ValueError, match="not a draft head file.*train-head"):
        DraftHead.load(tmp_path / "other.npz")
    h = head(lm_head)
    with pytest.raises(ValueError, match="must weigh the model features"):
        DraftHead(h.up, h.up_bias, h.down, h.down_bias, h.state_gain, h.token_gain, Calibration.load(), h.target)
    with pytest.raises(ValueError, match=r"head up_bias is \(5,\), expected \(12,\)"):
        DraftHead(h.up, h.up_bias[:5], h.down, h.down_bias, h.state_gain, h.token_gain, h.calibration, h.target)
    assert len(h.calibration.coef) == len(Calibration.load().coef) + len(MODEL_FEATURES)
