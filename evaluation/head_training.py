"""Training a draft head (:class:`drafting.DraftHead`) on the target's own features: the loop over
:class:`evaluation.head_module.HeadModule`, the head's forward in torch.

Each training pair is a position ``t`` of a feature set (:class:`evaluation.features.FeatureSet`) with a successor:
the head reads ``f[t]`` and the token ``x[t+1]`` and is taught the target at ``t+1``: a softmax over the target's top-K
tokens there and shared random negatives (the candidates it will face are plausible tokens, not the vocabulary), with
the target's probabilities as soft labels, plus a smooth-L1 pull towards ``f[t+1]`` itself (EAGLE, Li et al. 2024,
section 3.2: the feature regression beside the token loss). AdamW with a warm-up and a cosine decay, run for a fixed
time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .features import FeatureSet
from .head_module import HeadModule

__all__ = ["Pairs", "TrainSettings", "train_head"]


@dataclass(frozen=True)
class Pairs:
    """The training pairs of feature sets, gathered in memory: ``f`` ``[n, d]`` float16 (the state at ``t``), ``token``
    ``[n]`` int64 (``x[t+1]``), ``nxt`` ``[n, d]`` float16 (``f[t+1]``), ``ids`` ``[n, K]`` int64 and ``probs``
    ``[n, K]`` float32 (the target's top-K at ``t+1``)."""

    f: np.ndarray
    token: np.ndarray
    nxt: np.ndarray
    ids: np.ndarray
    probs: np.ndarray

    @classmethod
    def of(cls, sets: Sequence[FeatureSet]) -> Pairs:
        """Every position of every sequence of ``sets`` that has a successor."""
        parts = []
        for fs in sets:
            at = np.concatenate([np.arange(fs.offsets[i], fs.offsets[i + 1] - 1) for i in range(len(fs))]
                                + [np.zeros(0, np.int64)])
            parts.append((fs.features[at], fs.tokens[at + 1].astype(np.int64), fs.features[at + 1],
                          fs.teacher_ids[at + 1].astype(np.int64), fs.teacher_probs[at + 1].astype(np.float32)))
        return cls(*(np.concatenate(column) for column in zip(*parts)))

    def __len__(self) -> int:
        return len(self.token)

    def batch(self, at: np.ndarray) -> tuple[torch.Tensor, ...]:
        return (torch.from_numpy(self.f[at].astype(np.float32)), torch.from_numpy(self.token[at]),
                torch.from_numpy(self.nxt[at].astype(np.float32)), torch.from_numpy(self.ids[at]),
                torch.from_numpy(self.probs[at]))


@dataclass(frozen=True)
class TrainSettings:
    """minutes: training time. hidden: the MLP's width. batch: pairs per step. lr: AdamW's peak rate. negatives:
    random tokens shared by a batch's softmax. regression: the weight of the smooth-L1 term. seed: initialisation and
    order."""

    minutes: float = 10.0
    hidden: int = 1024
    batch: int = 2048
    lr: float = 2e-3
    negatives: int = 2048
    regression: float = 0.5
    seed: int = 0


def train_head(pairs: Pairs, lm_head: torch.Tensor, embedding: torch.Tensor, settings: TrainSettings,
               progress: Callable[[int, float, float], None] | None = None) -> tuple[HeadModule, int]:
    """Train a head on ``pairs`` for ``settings.minutes``.

    Args:
        lm_head / embedding: ``[V, d]`` float32, the target's (frozen).
        progress: called every 50 steps with (step, fraction of the time spent, the batch's token loss).

    Returns:
        The head and the steps taken.
    """
    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    head = HeadModule(embedding, settings.hidden)
    opt = torch.optim.AdamW(head.parameters(), lr=settings.lr, weight_decay=0.0)
    budget, start, step = settings.minutes * 60.0, time.perf_counter(), 0
    vocab = lm_head.shape[0]
    while True:
        spent = (time.perf_counter() - start) / budget
        if spent >= 1.0:
            return head, step
        for group in opt.param_groups:  # a warm-up, then a cosine decay over the time
            group["lr"] = settings.lr * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * spent))
        f, token, nxt, ids, probs = pairs.batch(rng.integers(0, len(pairs), settings.batch))
        h = head(f, token)
        cand = torch.cat([ids.reshape(-1), torch.randint(0, vocab, (settings.negatives,))]).unique()  # sorted
        target = torch.zeros(len(h), len(cand))
        target.scatter_add_(1, torch.searchsorted(cand, ids), probs / probs.sum(1, keepdim=True))
        token_loss = -(target * torch.log_softmax(h @ lm_head[cand].T, -1)).sum(1).mean()
        loss = token_loss + settings.regression * nn.functional.smooth_l1_loss(h, nxt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if progress is not None and step % 50 == 0:
            progress(step, spent, token_loss.item())
