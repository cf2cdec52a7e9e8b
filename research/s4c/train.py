"""Training the S4C heads on cached target features (S4C §3.1.2).

The loss of head ``k`` at position ``t`` (its feature ``Gk[t]`` stands for ``F[t + k]``, :mod:`research.s4c.heads`) is
the
paper's eq. 10, ``0.1 * lm + 1.0 * teacher + 0.1 * smooth``:

- ``lm``: cross-entropy of ``LM(Gk[t])`` against the text's token ``x[t + k + 1]`` (eq. 7);
- ``teacher``: cross-entropy of ``LM(Gk[t])`` against the target's own distribution ``softmax(LM(F[t + k]))``
  (eq. 8);
- ``smooth``: smooth L1 between ``Gk[t]`` and ``F[t + k]``, averaged over the feature's elements (eq. 9).

Each is averaged over the positions that have a label; the heads' losses are summed. Positions whose label lies in the
chat template's fixed header (the default system prompt every rendered conversation starts with) are left out of the
loss and of the accuracy: they would only teach, and flatter, a copy of boilerplate.

Runs are seeded and deterministic on one machine and thread count: the batches of each epoch are a permutation drawn
from ``seed + epoch``, and a run resumed from its checkpoint ends with the same weights, bit for bit, as one that was
never stopped.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional

from evaluation.features import FeatureSet, top_tokens

from .heads import S4CHeads
from .loss import head_losses, product_dtype

__all__ = ["TrainConfig", "accuracy", "train"]

LOSS_WEIGHTS = (0.1, 1.0, 0.1)
"""``(lm, teacher, smooth)``: S4C eq. 10's ``w1, w2, w3``."""


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation's settings (what a checkpoint must agree with to be resumed).

    Attributes:
        epochs: passes over the training sequences. batch_size: sequences per step.
        lr: AdamW's peak learning rate; linear warm-up over ``warmup`` of the steps, then cosine to a tenth.
        seed: seeds the heads' initialisation and the batch order. clip: gradient norm clip.
        checkpoint_every: steps between checkpoints. header: leading template tokens left out of the loss.

    Raises:
        ValueError: for a value out of range.
    """

    epochs: int = 2
    batch_size: int = 4
    lr: float = 1e-3
    warmup: float = 0.05
    seed: int = 0
    clip: float = 1.0
    checkpoint_every: int = 25
    header: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.checkpoint_every < 1 or self.header < 0:
            raise ValueError(f"{self}: epochs, batch_size and checkpoint_every must be >= 1, header >= 0")
        if not (self.lr > 0 and 0 <= self.warmup < 1 and self.clip > 0):
            raise ValueError(f"{self}: lr and clip must be > 0 and warmup in [0, 1)")


@dataclass(frozen=True)
class Batch:
    """Sequences of a feature set, right-padded to the longest.

    Attributes:
        tokens: ``[B, L]`` int64. features: ``[B, L, d]`` float32. lengths: ``[B]`` int64.
        teacher_ids: ``[B, L, K]`` int64. teacher_probs: ``[B, L, K]`` float32 (zero past a sequence's end).
    """

    tokens: torch.Tensor
    features: torch.Tensor
    lengths: torch.Tensor
    teacher_ids: torch.Tensor
    teacher_probs: torch.Tensor

    @classmethod
    def of(cls, fs: FeatureSet, indices: Sequence[int]) -> Batch:
        """Sequences ``indices`` of ``fs``."""
        spans = [fs.span(int(i)) for i in indices]
        lengths = [s.stop - s.start for s in spans]
        b, length = len(spans), max(lengths)
        k = fs.teacher_ids.shape[1]
        out = cls(torch.zeros((b, length), dtype=torch.long),
                  torch.zeros((b, length, fs.features.shape[1]), dtype=torch.float32),
                  torch.tensor(lengths, dtype=torch.long), torch.zeros((b, length, k), dtype=torch.long),
                  torch.zeros((b, length, k), dtype=torch.float32))
        for row, (span, n) in enumerate(zip(spans, lengths)):
            out.tokens[row, :n] = torch.from_numpy(fs.tokens[span].astype(np.int64))
            out.features[row, :n] = torch.from_numpy(fs.features[span].astype(np.float32))
            out.teacher_ids[row, :n] = torch.from_numpy(fs.teacher_ids[span].astype(np.int64))
            out.teacher_probs[row, :n] = torch.from_numpy(fs.teacher_probs[span].astype(np.float32))
        return out

    def labelled(self, k: int, header: int) -> torch.Tensor:
        """``[B, L - 1]`` bool: head ``k``'s output at ``t`` has a label (``x[t + k + 1]`` exists and lies past the
        ``header``)."""
        t = torch.arange(self.tokens.shape[1] - 1)[None, :]
        return (t + k + 1 < self.lengths[:, None]) & (t + k + 1 >= header)

    def shifted(self, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """What head ``k``'s output at ``t`` is compared with, each ``[B, L - 1, ...]``: the text's ``x[t + k + 1]``,
        the target's ``F[t + k]`` and its top tokens and probabilities there (zeros past the end)."""
        b, length = self.tokens.shape
        width = length - 1

        def shift(x: torch.Tensor, by: int) -> torch.Tensor:
            out = x.new_zeros((b, width, *x.shape[2:]))
            n = max(0, min(width, length - by))
            out[:, :n] = x[:, by: by + n]
            return out

        return (shift(self.tokens, k + 1), shift(self.features, k), shift(self.teacher_ids, k),
                shift(self.teacher_probs, k))


def losses(heads: S4CHeads, data: Batch, header: int,
           lm_head: torch.Tensor | None = None) -> tuple[torch.Tensor, list[dict[str, float]]]:
    """The batch's loss (eq. 10, summed over the heads) and each head's three terms (floats).

    ``lm_head``: the LM head weight the products use (default the heads' own, float32; training passes a copy in
    :func:`research.s4c.loss.product_dtype`)."""
    product = heads.lm_head if lm_head is None else lm_head
    total = torch.zeros(())
    terms: list[dict[str, float]] = []
    w1, w2, w3 = LOSS_WEIGHTS

    def read(k: int, g: torch.Tensor) -> torch.Tensor:
        nonlocal total
        b, width, d = g.shape
        labels, want, ids, probs = data.shifted(k)
        mask = data.labelled(k, header).reshape(-1).float()
        weight = mask / mask.sum().clamp(min=1.0)
        lm, teacher, choice = head_losses(g.reshape(-1, d), product, labels.reshape(-1),
                                          ids.reshape(b * width, -1), probs.reshape(b * width, -1))
        lm, teacher = (lm * weight).sum(), (teacher * weight).sum()
        smooth = (functional.smooth_l1_loss(g, want, reduction="none").mean(-1).reshape(-1) * weight).sum()
        total = total + w1 * lm + w2 * teacher + w3 * smooth
        terms.append({"lm": lm.item(), "teacher": teacher.item(), "smooth": smooth.item()})
        return choice.reshape(b, width)

    heads(data.tokens, data.features, read)
    return total, terms


def _lr(step: int, steps: int, cfg: TrainConfig) -> float:
    warm = max(1, int(cfg.warmup * steps))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    done = (step - warm) / max(1, steps - warm)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done)))


def _order(indices: Sequence[int], epoch: int, cfg: TrainConfig) -> list[list[int]]:
    """Epoch ``epoch``'s batches: a permutation drawn from ``seed + epoch``, cut into ``batch_size`` groups."""
    perm = np.random.default_rng(cfg.seed + epoch).permutation(np.asarray(indices))
    return [perm[i: i + cfg.batch_size].tolist() for i in range(0, len(perm), cfg.batch_size)]


def _save(path: Path, state: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def train(heads: S4CHeads, fs: FeatureSet, indices: Sequence[int], cfg: TrainConfig, checkpoint: Path, *,
          on_step: Callable[[int, int, float], None] | None = None) -> list[dict]:
    """Train ``heads`` in place on sequences ``indices`` of ``fs``, resuming from ``checkpoint`` when it exists.

    Args:
        heads: freshly initialised heads (seeded by the caller); their weights are replaced by the checkpoint's when
            one is resumed.
        fs: the feature set. indices: the training sequences.
        cfg: the settings; a checkpoint written with others is refused.
        checkpoint: the checkpoint file (written every ``cfg.checkpoint_every`` steps and at the end).
        on_step: called after each step with ``(step, steps, loss)``.

    Returns:
        Every step's ``{"step", "loss", "heads": [per-head terms]}``, the resumed run's earlier ones included.

    Raises:
        ValueError: when ``checkpoint`` was written with other settings or sequences (pass another work folder).
    """
    order = [_order(indices, e, cfg) for e in range(cfg.epochs)]
    flat = [b for epoch in order for b in epoch]
    steps = len(flat)
    opt = torch.optim.AdamW(heads.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    identity = {"config": asdict(cfg), "heads": heads.config.to_json(), "sequences": len(indices),
                "set": fs.record.get("about")}
    start, log = 0, []
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        if state["identity"] != identity:
            raise ValueError(f"{checkpoint} was written by a run with other settings or data ({state['identity']}); "
                             "pass another --work folder or delete it")
        heads.load_state_dict(state["heads"])
        opt.load_state_dict(state["optimizer"])
        start, log = state["step"], state["log"]
    heads.train()
    product = heads.lm_head.to(product_dtype())
    for step in range(start, steps):
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, cfg)
        loss, terms = losses(heads, Batch.of(fs, flat[step]), cfg.header, product)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(heads.parameters(), cfg.clip)
        opt.step()
        log.append({"step": step, "loss": loss.item(), "heads": terms})
        if on_step is not None:
            on_step(step + 1, steps, loss.item())
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == steps:
            _save(checkpoint, {"identity": identity, "heads": heads.state_dict(), "optimizer": opt.state_dict(),
                               "step": step + 1, "log": log})
    heads.eval()
    return log


def _counter(heads: S4CHeads, data: Batch, header: int, hits: np.ndarray,
             seen: np.ndarray) -> Callable[[int, torch.Tensor], torch.Tensor]:
    """The ``read`` of :meth:`S4CHeads.forward` that counts each head's hits on ``data`` into ``hits`` (top-1 and top-5
    against the target's choice, top-1 against the text) and ``seen``."""

    def read(k: int, g: torch.Tensor) -> torch.Tensor:
        b, width, d = g.shape
        top5 = top_tokens(g.reshape(-1, d), heads.lm_head, 5)[0].reshape(b, width, 5)
        labels, _, ids, _ = data.shifted(k)
        sel = data.labelled(k, header)
        want = ids[..., 0]  # the target's most likely token
        hits[k - 1, 0] += int((top5[..., 0] == want)[sel].sum())
        hits[k - 1, 1] += int((top5 == want[..., None]).any(-1)[sel].sum())
        hits[k - 1, 2] += int((top5[..., 0] == labels)[sel].sum())
        seen[k - 1] += int(sel.sum())
        return top5[..., 0]

    return read


@torch.no_grad()
def accuracy(heads: S4CHeads, fs: FeatureSet, indices: Sequence[int], *, header: int = 0,
             batch_size: int = 4) -> list[dict[str, float]]:
    """Each head's top-1 and top-5 accuracy on sequences ``indices`` of ``fs``: against the target's own choice
    (``argmax LM(F[t + k])``, what greedy verification accepts), and top-1 against the text.

    Returns:
        Per head ``{"top1", "top5", "top1_text", "positions"}``.
    """
    was_training = heads.training
    heads.eval()
    hits = np.zeros((heads.config.num_heads, 3))
    seen = np.zeros(heads.config.num_heads)
    for i in range(0, len(indices), batch_size):
        data = Batch.of(fs, indices[i: i + batch_size])
        heads(data.tokens, data.features, _counter(heads, data, header, hits, seen))
    heads.train(was_training)
    return [{"top1": h[0] / max(n, 1), "top5": h[1] / max(n, 1), "top1_text": h[2] / max(n, 1), "positions": int(n)}
            for h, n in zip(hits, seen)]
