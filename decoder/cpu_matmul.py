"""Small-batch linear layers on the CPU computed weight-major, for verification passes of a few tokens.

A verification pass multiplies every weight matrix by 1..64 token vectors. On some torch builds ``F.linear``
(``x @ W.T``) switches for 2+ rows to a GEMM kernel far slower than its 1-row GEMV; computing ``(W @ x.T).T`` instead
keeps 2..8 tokens about as cheap as 1 there. On others it is the slower of the two, so :func:`decoder.load_target`
leaves it off unless asked (``python -m evaluation budget`` prints the curve on the machine at hand). Results are the
same products summed in a different order (fp32 rounding differences only).
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

WEIGHT_MAJOR_MAX_TOKENS = 8  # measured crossover on 2 cores (`python -m evaluation budget` prints the curve)


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    if rows > WEIGHT_MAJOR_MAX_TOKENS or x.device.type != "cpu":
        return F.linear(x, self.weight, self.bias)
    flat = x.reshape(rows, x.shape[-1])  # [rows, in_features]
    y = torch.matmul(self.weight, flat.t()).t()  # [rows, out_features]
    if self.bias is not None:
        y = y + self.bias
    return y.reshape(*x.shape[:-1], self.weight.shape[0])


def use_weight_major_linear(model: torch.nn.Module) -> int:
    """Make every ``nn.Linear`` of ``model`` compute ``(W @ x.T).T`` for at most
    :data:`WEIGHT_MAJOR_MAX_TOKENS` rows on the CPU (``F.linear`` otherwise).

    Only this model's layers change (instance attributes), not ``nn.Linear``.

    Returns:
        The number of layers changed.
    """
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.forward = types.MethodType(_forward, module)  # type: ignore[method-assign]  # this layer only
            changed += 1
    return changed
