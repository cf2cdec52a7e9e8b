"""Does the draft head gain from the row's earlier states? The shipped head's form against one attention layer over a
window of the last ``W`` positions, on the same features and the same training time.

The shipped head (:class:`evaluation.head_module.HeadModule`) reads one state and one token:
``(f[t], x[t+1]) -> f^[t+1]``. EAGLE's head (Li et al. 2024, section 3.1) reads every earlier pair
``(f[j], x[j+1])``, ``j <= t``, through a decoder layer. :class:`ContextHead` is that layer restricted to a window:
each pair is fused to one vector (``fc``), one causal attention layer with rotary positions reads the last ``W`` of
them, one MLP follows, and ``f^[t+1] = f[t] + out``. With ``W = 1`` it attends to its own pair only: the same
parameters and cost, no context, so ``W = 1`` against ``W > 1`` is the context's worth alone.

Training: the fit halves' greedy answers (prompt + answer) and ShareGPT openings, the target's features extracted in
``--dtype`` (as ``python -m evaluation train-head``), segments of ``--segment`` positions, the same token loss (the
target's top-20 at ``t+1`` against shared random negatives) and feature regression as the shipped trainer. Reported on
the report halves, from the target's float32 states (the ones vLLM hands the proposer): top-1 against the target's
greedy token over the vocabulary at every answer position after the first, as ``train-head`` reports it; for the
context heads also with the window kept inside the answer (``decode only``: the states a proposer sees without the
prefill's).

    python -m research.experiments.head_context [--minutes 8] [--windows 1 16] [--tokens 200000]
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from benchmarks._harness import finish, parser
from toolkit.options import float_in, int_in


def _rms(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _rotate(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotary positions (Su et al. 2021) on ``x`` ``[..., L, h]`` at ``positions`` ``[L]``."""
    half = x.shape[-1] // 2
    freq = 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half)
    angle = positions.float()[:, None] * freq[None, :]
    cos, sin = angle.cos(), angle.sin()
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


class ContextHead(nn.Module):
    """``f^[t+1] = f[t] + out(block(fc([rms(f) g1 ; rms(E[x]) g2])))`` with the block's attention reading the last
    ``window`` pairs.

    Args:
        embedding: ``[V, d]`` float32 (frozen). window: pairs attended to (1: its own only). hidden: the MLP width.
        heads: attention heads.
    """

    def __init__(self, embedding: torch.Tensor, window: int, hidden: int = 1024, heads: int = 9) -> None:
        super().__init__()
        d = embedding.shape[1]
        self.embedding, self.window, self.heads = embedding, window, heads
        self.state_gain, self.token_gain = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
        self.fc = nn.Linear(2 * d, d)
        self.norm1, self.norm2 = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.out = nn.Linear(d, d)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, f: torch.Tensor, tokens: torch.Tensor, keys_from: torch.Tensor | None = None) -> torch.Tensor:
        """``f`` ``[B, L, d]`` float32 and ``tokens`` ``[B, L]`` int64 (``x[j+1]`` beside ``f[j]``) -> ``[B, L, d]``.
        ``keys_from``: ``[B]`` int64, the first position each row may attend to (default 0)."""
        b, n, d = f.shape
        z = self.fc(torch.cat([_rms(f) * self.state_gain, _rms(self.embedding[tokens]) * self.token_gain], -1))
        q, k, v = self.qkv(_rms(z) * self.norm1).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        pos = torch.arange(n)
        q, k = _rotate(q, pos), _rotate(k, pos)
        rel = pos[:, None] - pos[None, :]
        mask = (rel >= 0) & (rel < self.window)  # [L, L]
        if keys_from is not None:
            mask = mask[None] & (pos[None, None, :] >= keys_from[:, None, None])
            mask = mask[:, None]
        a = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        h = z + self.o(a.transpose(1, 2).reshape(b, n, d))
        h = h + self.down(nn.functional.silu(self.up(_rms(h) * self.norm2)))
        return f + self.out(h)


def _segments(sets, segment: int, rng: np.random.Generator, count: int):
    """``count`` random segments of at most ``segment`` pairs ``(f[j], x[j+1])`` with their targets at ``j+1``,
    padded: ``f, tokens, nxt [B, S, d]``, ``ids, probs [B, S, K]``, ``valid [B, S]``."""
    spans = [(fs, int(fs.offsets[i]), int(fs.offsets[i + 1])) for fs in sets for i in range(len(fs))]
    weights = np.array([e - s - 1 for _, s, e in spans], dtype=np.float64)
    weights /= weights.sum()
    d, k = sets[0].features.shape[1], sets[0].teacher_ids.shape[1]
    f = np.zeros((count, segment, d), np.float32)
    nxt = np.zeros_like(f)
    tokens = np.zeros((count, segment), np.int64)
    ids = np.zeros((count, segment, k), np.int64)
    probs = np.zeros((count, segment, k), np.float32)
    valid = np.zeros((count, segment), bool)
    for row, which in enumerate(rng.choice(len(spans), size=count, p=weights)):
        fs, s, e = spans[which]
        pairs = e - s - 1
        start = s + int(rng.integers(0, max(1, pairs - segment + 1)))
        m = min(segment, s + pairs - start)
        f[row, :m] = fs.features[start:start + m]
        nxt[row, :m] = fs.features[start + 1:start + m + 1]
        tokens[row, :m] = fs.tokens[start + 1:start + m + 1]
        ids[row, :m] = fs.teacher_ids[start + 1:start + m + 1]
        probs[row, :m] = fs.teacher_probs[start + 1:start + m + 1]
        valid[row, :m] = True
    return tuple(torch.from_numpy(a) for a in (f, tokens, nxt, ids, probs, valid))


def train_context(sets, lm: torch.Tensor, embedding: torch.Tensor, window: int, minutes: float, *, segment: int = 128,
                  batch: int = 16, lr: float = 1e-3, negatives: int = 2048, regression: float = 0.5,
                  seed: int = 0) -> tuple[ContextHead, int]:
    """A :class:`ContextHead` trained for ``minutes`` on ``sets`` (the shipped trainer's losses)."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    head = ContextHead(embedding, window)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    budget, start, step = minutes * 60.0, time.perf_counter(), 0
    while (spent := (time.perf_counter() - start) / budget) < 1.0:
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 100) * 0.5 * (1 + math.cos(math.pi * spent))
        f, tokens, nxt, ids, probs, valid = _segments(sets, segment, rng, batch)
        h = head(f, tokens)[valid]
        ids, probs = ids[valid], probs[valid]
        cand = torch.cat([ids.reshape(-1), torch.randint(0, lm.shape[0], (negatives,))]).unique()
        target = torch.zeros(len(h), len(cand))
        target.scatter_add_(1, torch.searchsorted(cand, ids), probs / probs.sum(1, keepdim=True))
        token_loss = -(target * torch.log_softmax(h @ lm[cand].T, -1)).sum(1).mean()
        loss = token_loss + regression * nn.functional.smooth_l1_loss(h, nxt[valid])
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % 100 == 0:
            print(f"  W={window} step {step} ({spent:.0%}): {token_loss.item():.3f}", flush=True)
    return head.eval(), step


@torch.inference_mode()
def top1(estimate, held, states, lm: torch.Tensor) -> float:
    """Top-1 over the vocabulary at every answer position after the first: ``estimate(r, f, seq)`` gives
    ``[len(seq) - 1, d]`` estimates of ``f[1:]`` from ``f[:-1]`` and ``seq[1:]``."""
    right = total = 0
    for r in held:
        seq = np.asarray(list(r.prompt) + list(r.output), dtype=np.int64)
        est = estimate(r, torch.from_numpy(states[r.id]), torch.from_numpy(seq))
        t = np.arange(len(r.prompt) - 1, len(seq) - 2)  # est[t] gave f^[t+1], whose argmax guesses seq[t + 2]
        if not len(t):
            continue
        guess = (est[t[0]:t[-1] + 1] @ lm.T).argmax(-1).numpy()
        right += int((guess == seq[t + 2]).sum())
        total += len(t)
    return right / max(total, 1)


def run(args) -> dict:
    from decoder.model import load_target
    from evaluation.features import extract, reference_states, target_fingerprint, target_weights
    from evaluation.head_training import Pairs, TrainSettings, train_head
    from evaluation.references import half, load_references
    from evaluation.train_head import SETS, _sequence, _sharegpt
    from toolkit.tokenizer import cache_dir

    t0 = time.perf_counter()
    target = load_target(None, device="cpu")
    teacher = target if args.dtype == "float32" else load_target(None, device="cpu", dtype=args.dtype)
    tok = target.tokenizer
    refs = {name: load_references(name, args.references, tokenizer=tok) for name in SETS}
    fit = [r for name in SETS for r in half(refs[name], "fit")]
    work = args.work or Path(cache_dir()) / "head_context" / f"{args.tokens}-{args.dtype}"
    parts = {"fit": [_sequence(r) for r in fit], "sharegpt": _sharegpt(tok, args.tokens)}
    about = {"target": target.spec, "tokens": args.tokens, "fit": [r.id for r in fit], "dtype": args.dtype}
    sets = [extract(teacher, seqs, work / part, about={**about, "part": part}) for part, seqs in parts.items()]
    print(f"features: {sum(len(s.tokens) for s in sets):,} positions, {time.perf_counter() - t0:.0f} s", flush=True)
    embedding, lm = (w.float().contiguous() for w in target_weights(target))
    fingerprint = target_fingerprint(target)
    held = {name: half(refs[name], "report") for name in SETS}
    states = {r.id: reference_states(target, _sequence(r).tolist(), fingerprint=fingerprint).astype(np.float32)
              for rs in held.values() for r in rs}
    print(f"report states: {len(states)} sequences, {time.perf_counter() - t0:.0f} s", flush=True)
    report: dict = {"minutes": args.minutes, "tokens": args.tokens, "dtype": args.dtype,
                    "positions": int(sum(len(s.tokens) for s in sets)), "heads": {}}
    if not args.skip_mlp:
        mlp, steps = train_head(Pairs.of(sets), lm, embedding, TrainSettings(minutes=args.minutes))
        mlp.eval()
        report["heads"]["mlp (shipped form)"] = {"steps": steps, **{
            name: top1(lambda r, f, seq: mlp(f[:-1], seq[1:]), held[name], states, lm) for name in SETS}}
        print(json.dumps(report["heads"]), flush=True)
    for window in args.windows:
        head, steps = train_context(sets, lm, embedding, window, args.minutes, segment=args.segment)
        row: dict = {"steps": steps, "parameters": sum(p.numel() for p in head.parameters())}
        def whole(r, f, seq, head=head):
            return head(f[None, :-1], seq[None, 1:])[0]

        def decode_only(r, f, seq, head=head):  # the window kept inside the answer
            return head(f[None, :-1], seq[None, 1:], torch.tensor([len(r.prompt) - 1]))[0]

        for name in SETS:
            row[name] = top1(whole, held[name], states, lm)
            row[f"{name} decode only"] = top1(decode_only, held[name], states, lm)
        report["heads"][f"context W={window}"] = row
        print(json.dumps(report["heads"]), flush=True)
        if args.save:
            torch.save(head.state_dict(), Path(args.save) / f"context-w{window}.pt")
    report["seconds"] = round(time.perf_counter() - t0)
    return report


def build_parser():
    ap = parser(__doc__, out="head_context.json")
    ap.add_argument("--minutes", type=float_in(0.1), default=8.0, help="training minutes per head (default: 8).")
    ap.add_argument("--windows", type=int_in(1), nargs="+", default=[1, 16],
                    help="context windows to train (default: 1 16).")
    ap.add_argument("--segment", type=int_in(2), default=128, help="positions per training segment (default: 128).")
    ap.add_argument("--tokens", type=int_in(0), default=200_000, help="ShareGPT tokens (default: 200000).")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16",
                    help="the target's dtype for the training features (default: bfloat16).")
    ap.add_argument("--skip-mlp", action="store_true", help="train no head of the shipped form.")
    ap.add_argument("--work", type=Path, default=None,
                    help="the feature sets' folder (default: <CREST_CACHE>/head_context/<tokens>-<dtype>).")
    ap.add_argument("--save", type=Path, default=None, help="a folder to save the context heads' weights in.")
    return ap


def print_table(report: dict) -> None:
    """Each head's top-1 over the vocabulary, per set."""
    print(f"{'head':<20s} {'steps':>6s} {'spec_bench':>11s} {'humaneval':>10s}  decode only")
    for name, row in report["heads"].items():
        only = " / ".join(f"{row[f'{s} decode only']:.1%}" for s in ("spec_bench", "humaneval")
                          if f"{s} decode only" in row)
        print(f"{name:<20s} {row['steps']:6d} {row['spec_bench']:11.1%} {row['humaneval']:10.1%}  {only}")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    finish(args, lambda: run(args), print_table, "heads")


if __name__ == "__main__":
    main()
