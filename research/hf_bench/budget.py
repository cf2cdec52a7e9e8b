"""Draft budget: the target's verification latency against draft size, and the budget it favours.

A verification pass over ``q`` query tokens (the last committed token plus
``q - 1`` draft nodes) costs ``latency(q)``. GPU papers verify 64 nodes because
a pass costs about the same for 1 or 64 tokens; on a CPU a 64-token pass costs
several single-token passes, so the budget must trade tokens accepted against
time per step: :func:`choose_budget` takes the budget ``B`` that maximizes
``accept_length(B) / (latency(B + 1) + draft_s(B))``, with accept lengths and the drafter's own seconds a step
(its step: lookups and merge) from the replay simulator
(:mod:`evaluation.simulate`). A drafter that costs a third of a pass a step is best served by a larger budget than
a free one. The drafters' count-ratio scores are not
calibrated probabilities (a score of 0.5 was accepted ~15% of the time on
Spec-Bench), so the choice uses replayed acceptance, not the scores.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import DynamicCache

from decoder.model import TargetModel
from decoder.verify import tree_attention_inputs
from drafting.draft import Draft
from toolkit.tokenizer import cache_dir


@dataclass(frozen=True)
class LatencyCurve:
    """Median seconds of one verification pass by query size.

    Attributes:
        latency_s: ``[max_tokens]`` float64; ``latency_s[q - 1]`` is a pass over
            ``q`` query tokens (``q = 1``: plain decoding).
        context_len: cached tokens behind the query when measured.
        key: model / device / dtype / threads the curve belongs to.
    """

    latency_s: np.ndarray
    context_len: int
    key: str

    def __call__(self, query_tokens: int) -> float:
        """Seconds for a pass over ``query_tokens`` tokens (clamped to the measured range)."""
        q = min(max(int(query_tokens), 1), len(self.latency_s))
        return float(self.latency_s[q - 1])

    def relative(self) -> np.ndarray:
        """``[max_tokens]`` latency relative to a single-token pass."""
        return self.latency_s / self.latency_s[0]


def choose_budget(curve: LatencyCurve, accept_lengths: dict[int, float],
                  draft_s: dict[int, float] | None = None) -> tuple[int, dict[int, float]]:
    """The draft budget that maximizes expected tokens per second.

    Args:
        curve: the target's latency curve (a budget ``B`` costs ``curve(B + 1)``).
        accept_lengths: replayed accept length (tokens per step) by budget.
        draft_s: the drafter's own seconds per step by budget (replayed ``propose`` time), added to the pass;
            ``None``: a drafter that costs nothing.

    Returns:
        ``(best budget, tokens per second by budget)``.

    Raises:
        ValueError: when ``accept_lengths`` is empty, or ``draft_s`` lacks one of its budgets or holds a negative
            or non-finite time.
    """
    if not accept_lengths:
        raise ValueError("accept_lengths is empty: replay at least one budget")
    cost = dict.fromkeys(accept_lengths, 0.0) if draft_s is None else draft_s
    missing = sorted(set(accept_lengths) - set(cost))
    if missing:
        raise ValueError(f"draft_s has no time for budgets {missing}: replay them, or pass draft_s=None")
    bad = {b: t for b, t in cost.items() if not 0.0 <= t < float("inf")}
    if bad:
        raise ValueError(f"draft_s={bad}: seconds per step must be finite and >= 0")
    rate = {b: al / (curve(b + 1) + cost[b]) for b, al in sorted(accept_lengths.items())}
    return max(rate, key=lambda b: rate[b]), rate


def curve_key(target: TargetModel) -> str:
    """The latency curve's identity: model spec, device, dtype, CPU threads, torch's version and how the linear layers
    multiply (file-name safe)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{target.spec}-{target.device}-{str(target.dtype).split('.')[-1]}"
                  f"-t{torch.get_num_threads()}-torch{torch.__version__}-{target.linear}")


CURVE_TOKENS = 64
"""Query tokens of the largest verification pass the latency curve times: the root and 63 draft nodes."""


@torch.inference_mode()
def measure_latency(target: TargetModel, *, max_tokens: int = CURVE_TOKENS, context_len: int = 256,
                    repeats: int = 5) -> LatencyCurve:
    """Time verification passes of 1..``max_tokens`` query tokens behind ``context_len`` cached tokens.

    Each size is a chain-shaped draft with the tree attention mask, as in decoding;
    the median of ``repeats`` passes is kept. Takes ~``max_tokens * repeats``
    passes (about a minute for SmolLM2-135M on 2 CPU cores).

    Raises:
        ValueError: when ``max_tokens < 2`` or ``repeats < 1``.
    """
    if max_tokens < 2 or repeats < 1:
        raise ValueError(f"max_tokens={max_tokens} must be >= 2 and repeats={repeats} >= 1")
    model, dev = target.model, target.device
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    cache = DynamicCache(config=model.config)
    model(input_ids=torch.randint(0, vocab, (1, context_len), generator=gen).to(dev), past_key_values=cache)
    out = np.zeros(max_tokens, dtype=np.float64)
    for q in range(1, max_tokens + 1):
        ids = torch.randint(0, vocab, (1, q), generator=gen).to(dev)
        mask, pos = tree_attention_inputs(Draft.chain(range(q - 1)), context_len, dtype=target.dtype, device=dev)
        times = []
        for _ in range(repeats + 1):  # the first pass warms up
            t0 = time.perf_counter()
            model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t0)
            cache.crop(-q)
        out[q - 1] = statistics.median(times[1:])
    return LatencyCurve(out, context_len, curve_key(target))


def load_or_measure(target: TargetModel, *, remeasure: bool = False, max_tokens: int = CURVE_TOKENS,
                    repeats: int = 5) -> LatencyCurve:
    """The cached curve for this model, device, dtype and thread count, measured on first use.

    Stored as JSON under ``<cache>/latency/``; a cached curve shorter than ``max_tokens`` is
    measured again. ``max_tokens`` and ``repeats`` go to :func:`measure_latency`.

    Raises:
        ValueError: as :func:`measure_latency`.
    """
    key = curve_key(target)
    path = Path(cache_dir()) / "latency" / f"{key}.json"
    if path.exists() and not remeasure:
        data = json.loads(path.read_text())
        if len(data["latency_s"]) >= max_tokens:
            return LatencyCurve(np.asarray(data["latency_s"]), int(data["context_len"]), key)
    curve = measure_latency(target, max_tokens=max_tokens, repeats=repeats)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"latency_s": curve.latency_s.tolist(), "context_len": curve.context_len}))
    tmp.replace(path)
    return curve
