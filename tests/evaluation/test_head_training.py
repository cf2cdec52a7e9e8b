"""Training a draft head (:mod:`evaluation.head_training`): on pairs with a learnable answer, the head learns it."""

from __future__ import annotations

import numpy as np
import torch

from evaluation.head_training import Pairs, TrainSettings, train_head

V, D = 64, 16


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
