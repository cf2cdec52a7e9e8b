"""Python oracle of the draft head's forward (``csrc/head.cpp``, :meth:`drafting.DraftHead.native`; the trainer's
:class:`evaluation.head_module.HeadModule`): written for reading, in float64. EAGLE's feature-level step (Li et al.
2024, section 3.1) as one residual MLP."""

from __future__ import annotations

import numpy as np


def estimates(head, f: np.ndarray, tokens: np.ndarray, embedding: np.ndarray, *, half: bool = False) -> np.ndarray:
    """``f + down(silu(up([rms(f) * state_gain ; rms(E[x]) * token_gain])))`` for states ``f`` ``[n, d]`` and bonus
    tokens ``tokens`` ``[n]`` of a :class:`drafting.DraftHead` ``head``: ``[n, d]`` float64. ``half``: ``up`` and
    ``down`` rounded to float16 first (to nearest, ties to even), as the native core holds them."""
    up, down = (np.asarray(w, np.float16 if half else np.float64).astype(np.float64) for w in (head.up, head.down))
    def rms(x: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)

    f64 = f.astype(np.float64)
    x = np.concatenate([rms(f64) * head.state_gain, rms(embedding[tokens].astype(np.float64)) * head.token_gain], 1)
    h = x @ up + head.up_bias
    h = h / (1.0 + np.exp(-h))
    return f64 + h @ down + head.down_bias
