"""The draft head (:class:`drafting.DraftHead`): its file round trip, the errors that name the fix, which target's LM
head it fits, and its native forward (``csrc/head.cpp``) against the oracle (``tests/oracle/head.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from crest_native import MODEL_FEATURES
from drafting import Calibration, DraftHead
from drafting.head import row_norms, target_rows
from oracle.head import estimates

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
    h0 = head(np.ones((V, D), np.float32))
    h0.save(tmp_path / "whole.npz")
    (tmp_path / "cut.npz").write_bytes((tmp_path / "whole.npz").read_bytes()[:200])  # a truncated file
    with pytest.raises(ValueError, match="not a draft head file.*train-head"):
        DraftHead.load(tmp_path / "cut.npz")
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(ValueError, match="not a draft head file.*train-head"):
        DraftHead.load(tmp_path / "other.npz")
    h = head(lm_head)
    with pytest.raises(ValueError, match="must weigh the model features"):
        DraftHead(h.up, h.up_bias, h.down, h.down_bias, h.state_gain, h.token_gain, Calibration.load(), h.target)
    with pytest.raises(ValueError, match=r"head up_bias is \(5,\), expected \(12,\)"):
        DraftHead(h.up, h.up_bias[:5], h.down, h.down_bias, h.state_gain, h.token_gain, h.calibration, h.target)
    with pytest.raises(ValueError, match="head down_bias holds values that are not finite;.*copy it again"):
        DraftHead(h.up, h.up_bias, h.down, np.full_like(h.down_bias, np.nan), h.state_gain, h.token_gain,
                  h.calibration, h.target)
    with pytest.raises(ValueError, match="head up holds values that are not finite in float16"):  # 1e5: inf in float16
        DraftHead(np.full_like(h.up, 1e5), h.up_bias, h.down, h.down_bias, h.state_gain, h.token_gain, h.calibration,
                  h.target)
    assert len(h.calibration.coef) == len(Calibration.load().coef) + len(MODEL_FEATURES)


@pytest.mark.parametrize(("d", "hidden", "rows"), [(D, HIDDEN, 1), (576, 1024, 8), (13, 7, 3), (40, 90, 1),
                                                  (40, 90, 7), (33, 70, 6)])
def test_the_native_forward_computes_the_oracle(d, hidden, rows):
    """At the default target's widths and at widths no vector unit divides (the kernels' tails; 6 and 5 panels: every
    tile shape, rows against 4, 2 and 1 panels), a batch of rows in one pass: the oracle's values within float32
    rounding; each row as it would be alone."""
    rng = np.random.default_rng(d)
    shapes = {"up": (2 * d, hidden), "up_bias": (hidden,), "down": (hidden, d), "down_bias": (d,), "state_gain": (d,),
              "token_gain": (d,)}
    arrays: dict[str, Any] = {name: (rng.normal(size=shape) / np.sqrt(shape[0])).astype(np.float32)
                              for name, shape in shapes.items()}
    h = DraftHead(**arrays, calibration=calibration(), target={})
    embedding = rng.normal(size=(V, d)).astype(np.float32)
    f = (rng.normal(size=(rows, d)) * 5).astype(np.float32)
    tokens = rng.integers(0, V, rows).astype(np.uint32)
    native = h.native(embedding)
    got = native.estimates(f, tokens)
    assert got.dtype == np.float32 and got.shape == (rows, d) and native.width == d
    want = estimates(h, f, tokens, embedding, half=True)  # up and down in float16, as the core holds them
    assert not np.allclose(want, f, atol=1e-2)  # the MLP moved the state: a forward that skipped it would fail
    moved, want_moved = got - f, want - f  # the MLP's part, compared on its own scale
    assert np.allclose(moved, want_moved, rtol=1e-5, atol=3e-5 * np.abs(want_moved).max())
    # this tolerance tells float16 weights from float32 ones, so a cruder rounding than float16's would fail above
    unrounded = estimates(h, f, tokens, embedding) - f
    assert not np.allclose(moved, unrounded, rtol=1e-5, atol=3e-5 * np.abs(unrounded).max())
    alone = np.concatenate([native.estimates(f[i:i + 1], tokens[i:i + 1]) for i in range(rows)])
    assert np.array_equal(alone, got)


def test_the_native_head_refuses_what_does_not_fit():
    lm_head = np.ones((V, D), np.float32)
    h = head(lm_head)
    with pytest.raises(TypeError, match="embedding must be the target's"):
        h.native(lm_head.astype(np.float64))
    with pytest.raises(ValueError, match="embedding's width differs"):
        h.native(np.ones((V, D + 1), np.float32))
    native = h.native(lm_head)
    with pytest.raises(ValueError, match="outside the embedding's vocabulary"):
        native.estimates(np.ones((1, D), np.float32), np.array([V], np.uint32))
    with pytest.raises(ValueError, match="one bonus token per state"):
        native.estimates(np.ones((2, D), np.float32), np.array([1], np.uint32))
    with pytest.raises(TypeError):  # float32 states and uint32 tokens only: nothing is converted
        native.estimates(np.ones((1, D), np.float64), np.array([1], np.uint32))
    with pytest.raises(TypeError):
        native.estimates(np.ones((1, D), np.float32), np.array([-1], np.int64))


def test_target_rows_are_float32_rows_shared_where_the_model_ties_them():
    """A tied target's embedding and LM head are one float32 array (copied once); untied ones are two, each the
    tensor's values; rows of another shape are refused."""
    torch = pytest.importorskip("torch")
    weight = torch.randn(6, 4, dtype=torch.bfloat16)
    embedding, lm_head = target_rows(weight, weight)
    assert embedding is lm_head and lm_head.dtype == np.float32 and lm_head.flags.c_contiguous
    np.testing.assert_array_equal(lm_head, weight.float().numpy())
    other = torch.randn(6, 4)
    embedding, lm_head = target_rows(other, weight.t().contiguous().t())  # an LM head not in C order
    assert embedding is not lm_head and lm_head.flags.c_contiguous
    np.testing.assert_array_equal(embedding, other.numpy())
    np.testing.assert_array_equal(lm_head, weight.float().numpy())
    with pytest.raises(ValueError, match=r"\[vocab, d\]"):
        target_rows(other, torch.randn(6, 5))
