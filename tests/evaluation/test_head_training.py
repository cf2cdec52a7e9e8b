"""Training a draft head (:mod:`evaluation.head_training`): the torch twin computes what the shipped numpy head
computes, and training on pairs with a learnable answer lowers the loss."""

from __future__ import annotations

import numpy as np
import torch

from drafting import Calibration, DraftHead
from evaluation.head_training import HeadModule, Pairs, TrainSettings, train_head

V, D = 64, 16


def test_the_torch_twin_computes_the_numpy_head():
    torch.manual_seed(0)
    embedding = torch.randn(V, D)
    module = HeadModule(embedding, 24)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p))
    cal = Calibration.load()
    head = DraftHead(**module.arrays(), calibration=Calibration(np.concatenate([cal.coef, [0.0, 0.0, 0.0]]),
                                                                cal.intercept, cal.prior, sources=cal.sources),
                     target={})
    f, tokens = torch.randn(5, D), torch.tensor([0, 3, 9, 63, 3])
    want = module(f, tokens).detach().numpy()
    got = head.next_states(f.numpy(), tokens.numpy(), embedding.numpy())
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4)
    with torch.no_grad():  # and back: the head a proposer runs on the engine's torch threads
        again = HeadModule.of(head, embedding)(f, tokens).numpy()
    assert np.allclose(again, got, rtol=1e-4, atol=1e-4)


def test_training_learns_a_next_state_that_the_token_decides():
    """Pairs whose next state is the embedding of the token read: the head's token loss falls well below chance."""
    rng = np.random.default_rng(0)
    lm = torch.from_numpy(rng.normal(size=(V, D)).astype(np.float32))
    n = 4096
    token = rng.integers(0, V, n)
    nxt = lm.numpy()[(token + 1) % V] * 3  # the next token is always token + 1
    ids = np.stack([(token + 1) % V, (token + 2) % V], 1)
    probs = np.tile(np.array([0.9, 0.1], np.float32), (n, 1))
    pairs = Pairs(rng.normal(size=(n, D)).astype(np.float16), token, nxt.astype(np.float16), ids, probs)
    settings = TrainSettings(minutes=0.05, hidden=64, batch=256, negatives=32, lr=5e-3)
    head, steps = train_head(pairs, lm, lm, settings)
    f, tok, _, ids_t, _ = pairs.batch(np.arange(512))
    with torch.no_grad():
        top = (head(f, tok) @ lm.T).argmax(1)
    assert steps > 20 and (top == ids_t[:, 0]).float().mean() > 0.5  # chance: 1/64
