"""The draft head's forward in torch, for training it: the next position's hidden state, estimated from the last
accepted one.

The target's final-normed hidden state ``f[t]`` at a row's last accepted token gave that row's bonus token ``x[t+1]``.
The head maps ``(f[t], x[t+1])`` to ``f^[t+1]``, whose LM-head logits estimate the token after the bonus: EAGLE's
feature-level step (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty", section
3.1), S4C's head 1 (He et al. 2025, section 3.1.1), as one residual MLP instead of a decoder layer. The trainer
(:mod:`evaluation.head_training`) fits it with autograd; in the step the native core runs the same forward
(:meth:`drafting.DraftHead.native`, ``csrc/head.hpp``), both checked against ``tests/oracle/head.py``. The weights and
their calibration are a :class:`drafting.DraftHead`. Needs torch (the ``hf`` extra); imports nothing of the project,
so that ``evaluation/head_gpu.py`` runs it on a GPU machine without the project installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:  # a type only: the GPU trainer (evaluation/head_gpu.py) runs this file without the project installed
    from drafting import DraftHead

__all__ = ["HeadModule"]


class HeadModule(nn.Module):
    """``f^ = f + down(silu(up([rms(f) * state_gain ; rms(E[x]) * token_gain])))``: the next state's estimate.

    Built empty for training (``down`` starts at zero: the head starts as the identity on ``f``) or from a trained
    :class:`drafting.DraftHead` (:meth:`of`).

    Args:
        embedding: ``[V, d]`` float32, the target's token embedding (held, frozen: not a parameter).
        hidden: the MLP's width.
    """

    def __init__(self, embedding: torch.Tensor, hidden: int) -> None:
        super().__init__()
        d = embedding.shape[1]
        self.embedding = embedding  # [V, d] float32, frozen (not a parameter)
        self.state_gain, self.token_gain = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
        self.up, self.down = nn.Linear(2 * d, hidden), nn.Linear(hidden, d)
        nn.init.zeros_(self.down.weight)
        nn.init.zeros_(self.down.bias)

    @staticmethod
    def _rms(x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    def forward(self, f: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The next states' estimates.

        Args:
            f: ``[n, d]`` float32, each row's final-normed hidden state at its last accepted token.
            tokens: ``[n]`` int64, each row's bonus token (the one ``f`` gave).

        Returns:
            ``[n, d]`` float32.
        """
        x = torch.cat([self._rms(f) * self.state_gain, self._rms(self.embedding[tokens]) * self.token_gain], -1)
        return f + self.down(nn.functional.silu(self.up(x)))

    @classmethod
    def of(cls, head: DraftHead, embedding: torch.Tensor) -> HeadModule:
        """``head``'s weights (float32) over ``embedding`` (``[V, d]`` float32), in inference mode."""
        module = cls(embedding, int(head.up.shape[1]))
        with torch.no_grad():
            for param, value in ((module.up.weight, head.up.T), (module.up.bias, head.up_bias),
                                 (module.down.weight, head.down.T), (module.down.bias, head.down_bias),
                                 (module.state_gain, head.state_gain), (module.token_gain, head.token_gain)):
                param.copy_(torch.from_numpy(np.ascontiguousarray(value)))
        return module.eval()

    def arrays(self) -> dict[str, Any]:
        """The weights as :class:`drafting.DraftHead` takes them (``up`` as ``[2d, hidden]``)."""
        def a(t: torch.Tensor) -> np.ndarray:
            return t.detach().float().cpu().numpy().copy()
        return {"up": a(self.up.weight.T), "up_bias": a(self.up.bias), "down": a(self.down.weight.T),
                "down_bias": a(self.down.bias), "state_gain": a(self.state_gain), "token_gain": a(self.token_gain)}
