"""The trainer's forward of the draft head (:class:`evaluation.head_module.HeadModule`) against its oracle
(``tests/oracle/head.py``, which the native forward is also checked against: tests/drafting/test_head.py), for a
trained head read back from its file and for one being trained."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from drafting import Calibration, DraftHead
from evaluation.head_module import HeadModule
from oracle.head import estimates as reference

V, D, HIDDEN = 64, 16, 24


def with_model(cal: Calibration) -> Calibration:
    return Calibration(np.concatenate([cal.coef, [0.0, 0.0, 0.0]]), cal.intercept, cal.prior, sources=cal.sources)


def test_the_forward_computes_the_reference_through_the_file(tmp_path):
    rng = np.random.default_rng(0)
    embedding = rng.normal(size=(V, D)).astype(np.float32)
    shapes = {"up": (2 * D, HIDDEN), "up_bias": (HIDDEN,), "down": (HIDDEN, D), "down_bias": (D,), "state_gain": (D,),
              "token_gain": (D,)}
    arrays: dict[str, Any] = {name: (rng.normal(size=shape) * 0.3).astype(np.float32) for name, shape in shapes.items()}
    DraftHead(**arrays, calibration=with_model(Calibration.load()), target={}).save(tmp_path / "h.npz")
    head = DraftHead.load(tmp_path / "h.npz")
    f, tokens = rng.normal(size=(5, D)).astype(np.float32) * 4, np.array([0, 3, 9, V - 1, 3])
    with torch.inference_mode():
        got = HeadModule.of(head, torch.from_numpy(embedding))(torch.from_numpy(f), torch.from_numpy(tokens))
    assert got.dtype == torch.float32 and tuple(got.shape) == (5, D)
    want = reference(head, f, tokens, embedding)
    assert np.allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    assert not np.allclose(want, f, atol=1e-2)  # the MLP moved the state: a forward that skipped it would fail


def test_a_trained_modules_arrays_rebuild_the_same_forward():
    torch.manual_seed(0)
    embedding = torch.randn(V, D)
    module = HeadModule(embedding, HIDDEN)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))
    head = DraftHead(**module.arrays(), calibration=with_model(Calibration.load()), target={})
    f, tokens = torch.randn(5, D), torch.tensor([0, 3, 9, V - 1, 3])
    with torch.no_grad():
        want, again = module(f, tokens).numpy(), HeadModule.of(head, embedding)(f, tokens).numpy()
    assert np.array_equal(again, want)
    assert np.allclose(want, reference(head, f.numpy(), tokens.numpy(), embedding.numpy()), rtol=1e-4, atol=1e-4)
