"""Training the draft head at scale on one CUDA GPU: the target answers ShareGPT openings greedily, its features over
those answers are computed, and heads are trained on them against the target's whole next-token distribution.

On two CPU cores ``train-head`` sees about 0.26M positions and 1.7M pairs in 10 minutes; EAGLE's heads see tens of
millions (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty", section 4). This
runner is the GPU's half of ``train-head``. It runs as a file on a machine with CUDA, torch, transformers and the
``gguf`` package, without the project installed: its one project import is the head's forward
(:class:`evaluation.head_module.HeadModule`, read from beside it). What it reads is a pack written by
``python -m evaluation head-pack`` (:mod:`evaluation.head_pack`): the target's GGUF, the tokenized prompts, and
the target's states over one sequence computed on the CPU in float32, which the GPU's must match before anything runs.
What it writes, ``train-head --weights`` turns into a served head (the calibration stacked and the report halves
scored on the CPU, which never leave it).

1. **Answers**: in bfloat16 (the GPU's fast path; its greedy tokens can part from float32's after a near tie), up to
   ``--new-tokens`` each, prompts in batches of ``--batch-prompts`` sorted by length, for ``--generate-minutes``: a
   greedy round over every prompt, then rounds sampled at ``--temperature`` (more of the target's own text than one
   answer per prompt gives).
2. **Features**: every prompt-and-answer sequence (and the pack's fit-half sequences, the target's own float32
   answers) run teacher-forced through the float32 target (TF32 products), the final-normed state kept in float16.
3. **Heads**: for each ``--hidden`` width, a :class:`HeadModule` fitted for ``--train-minutes`` on pairs
   ``(f[t], x[t+1]) -> t+1``: cross-entropy against the target's full softmax at ``t+1`` (``f[t+1]`` through the
   tied LM head) plus the smooth-L1 pull towards ``f[t+1]`` of EAGLE section 3.2, AdamW with a warm-up and a cosine
   decay; the CPU trainer (:mod:`evaluation.head_training`) approximates the same softmax with sampled candidates.
4. **Held out**: 1% of the prompts, every answer to them; top-1 of each head against the target's greedy token at
   ``t+1`` over their greedy answers' positions.

Writes to ``--out``: ``head_<hidden>.npz`` (each head's weights, float32, as :meth:`HeadModule.arrays`), and
``run.json`` (what ran, the phases' times, positions, steps, held-out top-1).

    python3 evaluation/head_gpu.py --pack PACK --out DIR [--generate-minutes 2.5] [--train-minutes 3]
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

if __package__:
    from .head_module import HeadModule
else:  # run as a file, without the project installed
    from head_module import HeadModule  # type: ignore[no-redef]

__all__ = ["main"]

CHECK_TOLERANCE = 2e-3
"""Largest absolute difference allowed between the GPU's float32 states and the CPU's over the pack's check sequence
(the two order their sums differently; a wrong weight differs by orders of magnitude more)."""


def _at_least(low: float, kind: type = float):
    """An argparse type: a ``kind`` of at least ``low`` (the project's ``toolkit.options`` is not there on a GPU
    machine without the project)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text} is below {low}; pass at least {low}")
        return value
    return parse


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load_pack(pack: Path, part_folders: list[Path]) -> dict:
    """The pack's arrays and record (:mod:`evaluation.head_pack` writes them); the GGUF is put together from its parts
    (in ``pack`` or ``part_folders``) when it was split to travel.

    Raises:
        FileNotFoundError: when the pack, or a file the record names, is in none of the folders.
        ValueError: when the pack's record or arrays are cut off or corrupt, or the GGUF is not the one packed.
    """
    try:
        record = json.loads((pack / "pack.json").read_text())
        gguf = pack / record["gguf"]
        parts, digest = list(record["gguf_parts"]), str(record["gguf_sha256"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{pack / 'pack.json'} is cut off or corrupt ({exc!r}); write the pack again with "
                         "python -m evaluation head-pack") from exc
    if not gguf.exists():
        found = []
        for part in parts:
            where = [folder / part for folder in [pack, *part_folders] if (folder / part).exists()]
            if not where:
                raise FileNotFoundError(f"{part}: a part of the target's GGUF is in none of {pack}, "
                                        f"{', '.join(map(str, part_folders)) or 'no --parts'}; pass its folder with "
                                        "--parts")
            found.append(where[0])
        partial = gguf.with_suffix(".partial")
        with open(partial, "wb") as out:
            for path in found:
                out.write(path.read_bytes())
        if hashlib.sha256(partial.read_bytes()).hexdigest() != digest:  # kept out of the pack: a rerun rebuilds it
            partial.unlink()
            raise ValueError(f"the parts {', '.join(map(str, found))} do not make the target's GGUF (its SHA-256 "
                             "differs): one is cut off or corrupt; copy them again")
        partial.replace(gguf)
    elif hashlib.sha256(gguf.read_bytes()).hexdigest() != digest:
        raise ValueError(f"{gguf} is not the target's GGUF (its SHA-256 differs); delete it, and the next run puts it "
                         "together from its parts")
    try:
        with np.load(pack / "data.npz", allow_pickle=False) as arrays:
            return {"record": record, "gguf": gguf, **{k: arrays[k] for k in arrays.files}}
    except (EOFError, ValueError, zipfile.BadZipFile) as exc:  # a truncated file is no zip
        raise ValueError(f"{pack / 'data.npz'} is cut off or corrupt ({exc}); write the pack again with "
                         "python -m evaluation head-pack") from exc


def _split(tokens: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    return [tokens[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


def load_target(gguf: Path, device: torch.device):
    """The target in float32 on ``device``, dequantized from its GGUF by transformers (as the CPU's export does)."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    return model.to(device).eval()


@torch.inference_mode()
def check_states(model, ids: np.ndarray, expected: np.ndarray) -> float:
    """The largest absolute difference between the target's states over ``ids`` here (full float32 products) and
    ``expected`` (``[len(ids), d]`` float32, the CPU's)."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.as_tensor(ids.astype(np.int64), device=model.device)[None]
    got = model.model(input_ids=x).last_hidden_state[0].float().cpu().numpy()
    torch.backends.cuda.matmul.allow_tf32 = tf32
    return float(np.abs(got - expected).max())


@dataclass
class Answers:
    """Prompts with the target's answers: ``seqs`` (each prompt then its answer, up to and with its first
    end-of-sequence token, int32), and per sequence its prompt's length, its prompt's index, and its round (0: greedy;
    later rounds sampled)."""

    seqs: list[np.ndarray] = field(default_factory=list)
    prompt_length: list[int] = field(default_factory=list)
    prompt: list[int] = field(default_factory=list)
    round: list[int] = field(default_factory=list)

    @property
    def answer_tokens(self) -> int:
        return int(sum(len(s) for s in self.seqs) - sum(self.prompt_length))


@torch.inference_mode()
def generate(model, prompts: list[np.ndarray], eos: list[int], pad: int, new_tokens: int, batch: int,
             minutes: float, temperature: float) -> Answers:
    """The target's answers to ``prompts`` (a bfloat16 copy of ``model``) until ``minutes`` run out: a greedy round over
    every prompt, then rounds sampled at ``temperature`` (seeded by round), each round's prompts shortest first."""
    fast = copy.deepcopy(model).to(torch.bfloat16)
    order = np.argsort([len(p) for p in prompts], kind="stable")
    out = Answers()
    start = time.perf_counter()
    for round_ in range(1 << 30):
        torch.manual_seed(round_)
        for at in range(0, len(order), batch):
            if time.perf_counter() - start > minutes * 60:
                del fast
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                return out
            picked = [int(i) for i in order[at:at + batch]]
            rows = [prompts[i] for i in picked]
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for i, r in enumerate(rows):  # left padding: every row's answer starts at the same column
                ids[i, width - len(r):] = torch.from_numpy(r.astype(np.int64))
                mask[i, width - len(r):] = 1
            got = _answer(fast, ids.to(model.device), mask.to(model.device), eos, pad, new_tokens,
                          temperature if round_ else None)[:, width:]
            hit = np.isin(got, eos)
            ends = np.where(hit.any(1), hit.argmax(1) + 1, got.shape[1])
            for i, r, answer, end in zip(picked, rows, got, ends):
                out.seqs.append(np.concatenate([r, answer[:end]]).astype(np.int32))
                out.prompt_length.append(len(r))
                out.prompt.append(i)
                out.round.append(round_)
            spent = time.perf_counter() - start
            _log(f"  answers: round {round_}, {len(out.seqs):,} answers, {out.answer_tokens:,} tokens, "
                 f"{out.answer_tokens / spent:,.0f} tokens/s")
    return out


def _answer(model, ids: torch.Tensor, mask: torch.Tensor, eos: list[int], pad: int, new_tokens: int,
            temperature: float | None) -> np.ndarray:
    """Continuations of the left-padded rows ``ids`` ``[n, width]``, greedy (``temperature`` None) or sampled:
    ``[n, width + new_tokens]`` int64 (rows that end early are padded with ``pad``); a batch the GPU's memory cannot
    hold is answered in halves."""
    try:
        got = model.generate(input_ids=ids, attention_mask=mask, do_sample=temperature is not None,
                             max_new_tokens=new_tokens, eos_token_id=eos, pad_token_id=pad, top_p=None, top_k=None,
                             temperature=temperature)
    except torch.cuda.OutOfMemoryError:
        if len(ids) == 1:
            raise
        torch.cuda.empty_cache()
        _log(f"  {len(ids)} rows do not fit the GPU's memory: halves")
        half = len(ids) // 2
        parts = [_answer(model, ids[s], mask[s], eos, pad, new_tokens, temperature)
                 for s in (slice(0, half), slice(half, None))]
        width = max(p.shape[1] for p in parts)
        return np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1])), constant_values=pad) for p in parts])
    return got.cpu().numpy()


@torch.inference_mode()
def features(model, seqs: list[np.ndarray], max_tokens: int = 1 << 16) -> tuple[torch.Tensor, torch.Tensor,
                                                                                 np.ndarray]:
    """The float32 target's final-normed states at every position of ``seqs`` (TF32 products), teacher-forced, each
    sequence on its own (right padding needs no mask: no real position attends to a later one).

    Returns:
        ``f`` ``[N, d]`` float16 and ``tokens`` ``[N]`` int64, both on the model's device, in ``seqs``' order; and
        ``offsets`` ``[len(seqs) + 1]`` int64.
    """
    torch.backends.cuda.matmul.allow_tf32 = True
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    d = model.config.hidden_size
    f = torch.empty((int(offsets[-1]), d), dtype=torch.float16, device=model.device)
    tokens = torch.from_numpy(np.concatenate(seqs).astype(np.int64)).to(model.device)
    order = np.argsort(lengths, kind="stable")
    at = 0
    while at < len(order):  # as many sequences as fit max_tokens at the longest one's width
        take = [int(order[at])]
        while at + len(take) < len(order) and (len(take) + 1) * int(lengths[order[at + len(take)]]) <= max_tokens:
            take.append(int(order[at + len(take)]))
        width = int(lengths[take[-1]])
        ids = torch.zeros((len(take), width), dtype=torch.long, device=model.device)
        for i, s in enumerate(take):
            ids[i, :lengths[s]] = tokens[offsets[s]:offsets[s + 1]]
        states = model.model(input_ids=ids).last_hidden_state
        for i, s in enumerate(take):
            f[offsets[s]:offsets[s + 1]] = states[i, :lengths[s]].to(torch.float16)
        at += len(take)
    return f, tokens, offsets


def pairs(offsets: np.ndarray, answers: Answers, first: int, held: set[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The training positions: every position with a successor in its sequence, but in the sequences of the prompts
    ``held``; and the held-out ones: in the greedy answers to ``held``, the positions whose successor is an answer
    token. ``answers``' sequences start at sequence ``first`` of ``offsets``. int64 on the CPU."""
    train_at, held_at = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for i in range(len(offsets) - 1):
        j = i - first
        if j < 0 or answers.prompt[j] not in held:
            train_at.append(np.arange(offsets[i], offsets[i + 1] - 1))
        elif answers.round[j] == 0:
            held_at.append(np.arange(offsets[i] + answers.prompt_length[j] - 1, offsets[i + 1] - 1))
    return torch.from_numpy(np.concatenate(train_at)), torch.from_numpy(np.concatenate(held_at))


def train(f: torch.Tensor, tokens: torch.Tensor, at: torch.Tensor, lm: torch.Tensor, hidden: list[int],
          minutes: float, batch: int = 8192, lr: float = 2e-3, regression: float = 0.5,
          seed: int = 0) -> tuple[dict[int, HeadModule], int]:
    """Heads of each width in ``hidden``, trained together on the same batches for ``minutes``: cross-entropy
    against the target's softmax at ``t+1`` over the whole vocabulary, plus ``regression`` x smooth-L1 towards
    ``f[t+1]``.

    Args:
        f / tokens: the features ``[N, d]`` float16 and tokens ``[N]`` int64, on the GPU.
        at: ``[P]`` int64, the training positions ``t`` (each has a successor ``t+1``).
        lm: ``[V, d]`` float32, the tied embedding and LM head.

    Returns:
        The heads (on the GPU, in evaluation mode) and the steps taken.
    """
    torch.manual_seed(seed)
    heads = {h: HeadModule(lm, h).to(lm.device) for h in hidden}
    opts = {h: torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.0) for h, m in heads.items()}
    at = at.to(lm.device)
    lm16 = lm.to(torch.bfloat16)
    start, step, budget = time.perf_counter(), 0, minutes * 60
    while (spent := (time.perf_counter() - start) / budget) < 1.0:
        rate = lr * min(1.0, (step + 1) / 200) * 0.5 * (1 + math.cos(math.pi * spent))
        t = at[torch.randint(0, len(at), (batch,), device=lm.device)]
        now, nxt, token = f[t].float(), f[t + 1].float(), tokens[t + 1]
        with torch.no_grad():
            teacher = torch.softmax((nxt.to(torch.bfloat16) @ lm16.T).float(), -1)
        losses = []
        for h, head in heads.items():
            for group in opts[h].param_groups:
                group["lr"] = rate
            est = head(now, token)
            logp = torch.log_softmax((est.to(torch.bfloat16) @ lm16.T).float(), -1)
            loss = -(teacher * logp).sum(1).mean() + regression * nn.functional.smooth_l1_loss(est, nxt)
            opts[h].zero_grad(set_to_none=True)
            loss.backward()
            opts[h].step()
            losses.append(loss)
        step += 1
        if step % 500 == 0:
            _log(f"  step {step} ({spent:.0%}): " + ", ".join(f"{h}: {x.item():.3f}" for h, x in zip(heads, losses)))
    return {h: m.eval() for h, m in heads.items()}, step


@torch.inference_mode()
def top1(head: HeadModule, f: torch.Tensor, tokens: torch.Tensor, at: torch.Tensor, lm: torch.Tensor) -> float:
    """How often ``head``'s estimate at ``t`` picks the target's greedy token at ``t+1``, over the positions ``at``."""
    right = 0
    for s in range(0, len(at), 8192):
        t = at[s:s + 8192].to(lm.device)
        est = head(f[t].float(), tokens[t + 1])
        right += int(((est @ lm.T).argmax(1) == (f[t + 1].float() @ lm.T).argmax(1)).sum())
    return right / max(len(at), 1)


def main(argv: list[str] | None = None) -> int:
    """Entry point: answers, features, heads, held-out top-1, written to ``--out``; exit 0, or 2 when the GPU's target
    does not match the CPU's states (nothing is trained on another model).

    Raises:
        SystemExit: as argparse does for bad options.
        FileNotFoundError: when ``--pack`` lacks its files, or a part of the GGUF is in no folder.
        ValueError: when the pack's files are cut off or corrupt.
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pack", type=Path, required=True, help="the folder `python -m evaluation head-pack` wrote.")
    ap.add_argument("--parts", type=Path, nargs="*", default=[],
                    help="other folders holding parts of the target's GGUF (a part that travelled earlier).")
    ap.add_argument("--out", type=Path, required=True, help="where the heads and run.json go.")
    ap.add_argument("--generate-minutes", type=_at_least(0.0), default=2.5,
                    help="time for answers, minutes (default: %(default)s; 0: the pack's fit sequences only).")
    ap.add_argument("--train-minutes", type=_at_least(0.001), default=3.0,
                    help="training time, minutes (default: %(default)s).")
    ap.add_argument("--new-tokens", type=_at_least(1, int), default=256,
                    help="an answer's most tokens (default: %(default)s).")
    ap.add_argument("--temperature", type=_at_least(0.01), default=0.8,
                    help="the sampled rounds' temperature, after the greedy round (default: %(default)s).")
    ap.add_argument("--batch-prompts", type=_at_least(1, int), default=2048,
                    help="prompts per generate call (default: %(default)s).")
    ap.add_argument("--batch", type=_at_least(1, int), default=8192,
                    help="training pairs per step (default: %(default)s).")
    ap.add_argument("--hidden", type=_at_least(1, int), nargs="+", default=[1024],
                    help="the heads' widths (default: 1024).")
    ap.add_argument("--device", default="cuda", help="torch device (default: %(default)s; cpu for a smoke run).")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    run: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "torch": torch.__version__, "phases": {}}

    def phase(name: str, t0: float) -> None:
        run["phases"][name] = round(time.perf_counter() - t0, 1)
        (args.out / "run.json").write_text(json.dumps(run, indent=1))
        _log(f"{name}: {run['phases'][name]} s")

    t0 = time.perf_counter()
    if device.type == "cuda":
        run["gpu"] = torch.cuda.get_device_name(device)
    pack = load_pack(args.pack, args.parts)
    record = pack["record"]
    model = load_target(pack["gguf"], device)
    run["check_max_abs_diff"] = gap = check_states(model, pack["check_ids"], pack["check_states"])
    phase("load", t0)
    if not gap <= CHECK_TOLERANCE:
        _log(f"the GPU's target differs from the CPU's: max |diff| {gap:.3g} > {CHECK_TOLERANCE}; nothing trained")
        return 2
    t0 = time.perf_counter()
    prompts = _split(pack["prompt_tokens"], pack["prompt_offsets"])
    answers = generate(model, prompts, record["eos"], record["pad"], args.new_tokens, args.batch_prompts,
                       args.generate_minutes, args.temperature) if args.generate_minutes > 0 else Answers()
    run["answers"], run["answer_tokens"] = len(answers.seqs), answers.answer_tokens
    run["rounds"] = max(answers.round, default=-1) + 1
    phase("generate", t0)
    t0 = time.perf_counter()
    fit = _split(pack["fit_tokens"], pack["fit_offsets"])
    f, tokens, offsets = features(model, fit + answers.seqs)
    held = set(np.random.default_rng(0).choice(len(prompts), size=len(prompts) // 100, replace=False).tolist())
    train_at, held_at = pairs(offsets, answers, len(fit), held)
    run["positions"], run["train_pairs"], run["held_pairs"] = int(offsets[-1]), len(train_at), len(held_at)
    phase("features", t0)
    t0 = time.perf_counter()
    lm = model.get_input_embeddings().weight.detach().float().contiguous()
    heads, run["steps"] = train(f, tokens, train_at, lm, args.hidden, args.train_minutes, batch=args.batch)
    phase("train", t0)
    t0 = time.perf_counter()
    for h, head in heads.items():  # written first: the held-out figures only report on them
        np.savez(args.out / f"head_{h}.npz", **head.arrays())
    run["held_top1"] = {h: top1(head, f, tokens, held_at, lm) for h, head in heads.items()}
    phase("write", t0)
    _log(json.dumps({k: run[k] for k in ("positions", "train_pairs", "steps", "held_top1")}))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (FileNotFoundError, ValueError) as exc:  # a pack or a part missing, cut off or corrupt
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
