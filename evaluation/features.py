"""The target's features: its final-normed last hidden state at every position (the LM head's input), extracted once
and cached on disk for training a draft head (EAGLE §3.2; S4C §3.1.2), or computed for one sequence.

A feature set is a folder of arrays and a JSON record, written by :func:`extract` and memory-mapped by
:class:`FeatureSet`: ``tokens.npy`` ``[N]`` int32 (every sequence's token ids, one after another), ``offsets.npy``
``[sequences + 1]`` int64 (where each starts), ``features.npy`` ``[N, d]`` float16 (the target's features of the same
positions, each sequence run through the target on its own), and the target's own next-token distribution at each
position truncated to its :data:`TEACHER_TOP` most likely tokens, ``teacher_ids.npy`` ``[N, K]`` int32 and
``teacher_probs.npy`` ``[N, K]`` float16 (what a head's teacher loss reads). Extraction resumes where an interrupted
one stopped.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import torch

from decoder.model import TargetModel
from toolkit.tokenizer import cache_dir

__all__ = ["FeatureSet", "extract", "first_tokens", "reference_states", "target_features", "target_fingerprint",
           "target_weights", "top_tokens"]

TEACHER_TOP = 20
"""Tokens of the target's distribution kept per position for the teacher loss."""

_RECORD = "features.json"
CHUNK_ROWS = 128
"""Rows of one LM-head product in :func:`top_tokens`."""


@torch.inference_mode()
def target_features(target: TargetModel, token_ids: Sequence[int]) -> torch.Tensor:
    """The target's features of ``token_ids``: one forward pass, ``[len(token_ids), d]`` float32 on the CPU.

    Raises:
        ValueError: for an empty sequence.
    """
    if len(token_ids) == 0:
        raise ValueError("token_ids is empty; features need at least one token")
    ids = torch.tensor([list(token_ids)], dtype=torch.long, device=target.device)  # [1, len]
    out = target.model.get_decoder()(input_ids=ids)  # the decoder stack: its last_hidden_state is final-normed
    return out.last_hidden_state[0].float().cpu()


def target_weights(target: TargetModel) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's token embedding and LM head weights, ``[vocab_size, d]`` each (one tensor when they are tied),
    detached."""
    model = target.model
    embedding = cast(torch.Tensor, model.get_input_embeddings().weight)
    lm_head = cast(torch.Tensor, model.get_output_embeddings().weight)
    return embedding.detach(), lm_head.detach()


def target_fingerprint(target: TargetModel) -> str:
    """A short hash of the target's LM head and embedding weights: heads, and cached states, fit the target they were
    made with."""
    h = hashlib.sha256()
    for w in reversed(target_weights(target)):
        h.update(w.float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def reference_states(target: TargetModel, token_ids: Sequence[int], folder: str | os.PathLike | None = None,
                     fingerprint: str | None = None) -> np.ndarray:
    """The target's features of a whole sequence (a prompt and its greedy reference, for exact replay), from one forward
    pass, cached on disk: ``[len(token_ids), d]`` float32.

    Args:
        target: the target model. token_ids: the sequence.
        folder: the cache folder (default ``<cache>/s4c/states``).
        fingerprint: :func:`target_fingerprint` of ``target`` (computed when not given; pass it when calling often).
    """
    folder = Path(folder) if folder is not None else Path(cache_dir()) / "s4c" / "states"
    fingerprint = fingerprint or target_fingerprint(target)
    ids = np.asarray(token_ids, dtype=np.int64)
    key = hashlib.sha256(f"{fingerprint}-{target.dtype}".encode() + ids.tobytes()).hexdigest()[:24]
    path = folder / f"{key}.npy"
    try:
        return np.load(path)
    except FileNotFoundError:
        pass  # not computed yet
    except (OSError, ValueError, EOFError):  # cut off or corrupt (written whole, so damaged from outside): again
        path.unlink()
    states = target_features(target, ids.tolist()).numpy()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{key}.tmp{os.getpid()}.npy"
    np.save(tmp, states)
    os.replace(tmp, path)
    return states


@dataclass(frozen=True)
class FeatureSet:
    """A feature set on disk, memory-mapped (see the module docstring).

    Attributes:
        folder: where it lives. tokens: ``[N]`` int32. offsets: ``[sequences + 1]`` int64. features: ``[N, d]``
        float16. teacher_ids: ``[N, K]`` int32. teacher_probs: ``[N, K]`` float16. record: how it was made (target,
        corpus, sequence length, sequences, tokens).
    """

    folder: Path
    tokens: np.ndarray
    offsets: np.ndarray
    features: np.ndarray
    teacher_ids: np.ndarray
    teacher_probs: np.ndarray
    record: dict

    @classmethod
    def open(cls, folder: str | os.PathLike) -> FeatureSet:
        """Open a complete feature set.

        Raises:
            FileNotFoundError: when ``folder`` holds no complete feature set (extract one first).
        """
        folder = Path(folder)
        path = folder / _RECORD
        record = json.loads(path.read_text()) if path.exists() else {}
        if not record.get("complete"):
            raise FileNotFoundError(f"{folder} holds no complete feature set; `python -m evaluation train-head` "
                                    "extracts one")
        arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r")
                  for name in ("tokens", "features", "teacher_ids", "teacher_probs")}
        return cls(folder, offsets=np.load(folder / "offsets.npy"), record=record, **arrays)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def span(self, i: int) -> slice:
        """Where sequence ``i``'s positions lie in the arrays."""
        return slice(int(self.offsets[i]), int(self.offsets[i + 1]))


def _record(folder: Path) -> dict:
    path = folder / _RECORD
    return json.loads(path.read_text()) if path.exists() else {}


def _write_record(folder: Path, record: dict) -> None:
    tmp = folder / f"{_RECORD}.tmp"
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, folder / _RECORD)


def extract(target: TargetModel, sequences: Sequence[np.ndarray], folder: str | os.PathLike, *, about: dict,
            progress: Callable[[int], None] | None = None, flush_every: int = 64) -> FeatureSet:
    """Run the target over each sequence and write the feature set to ``folder`` (resuming a partial one).

    Args:
        target: the target model. sequences: token id arrays (each run on its own, from its first token).
        folder: the feature set's folder (created).
        about: what the sequences are (corpus, target, lengths); a partial set made from something else is refused.
        progress: called with each sequence's token count once it is written.
        flush_every: sequences between the saves that a resumed run starts from.

    Raises:
        ValueError: when ``folder`` holds a set made from other sequences or another target (pick another folder).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lengths = np.array([len(s) for s in sequences], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    wanted = {**about, "sequences": len(sequences), "tokens": int(offsets[-1])}
    record = _record(folder)
    if record and record.get("about") != wanted:
        raise ValueError(f"{folder} holds features of other sequences or another target ({record.get('about')}); "
                         "pass another --work folder or delete it")
    if record.get("complete"):
        return FeatureSet.open(folder)
    done = int(record.get("done", 0))
    mode = "r+" if done else "w+"
    n, d = int(offsets[-1]), target.model.config.hidden_size
    shapes = {"tokens": ((n,), np.int32), "features": ((n, d), np.float16),
              "teacher_ids": ((n, TEACHER_TOP), np.int32), "teacher_probs": ((n, TEACHER_TOP), np.float16)}
    out = {name: np.lib.format.open_memmap(folder / f"{name}.npy", mode=mode, dtype=dtype, shape=shape)
           for name, (shape, dtype) in shapes.items()}
    np.save(folder / "offsets.npy", offsets)
    lm_head = target_weights(target)[1].cpu()  # the target's dtype: its own logits
    for i in range(done, len(sequences)):
        s, e = int(offsets[i]), int(offsets[i + 1])
        feats = target_features(target, sequences[i].tolist())
        ids, probs = top_tokens(feats, lm_head, TEACHER_TOP)
        out["tokens"][s:e] = sequences[i]
        out["features"][s:e] = feats.numpy().astype(np.float16)
        out["teacher_ids"][s:e] = ids.numpy().astype(np.int32)
        out["teacher_probs"][s:e] = probs.numpy().astype(np.float16)
        if progress is not None:
            progress(e - s)
        if (i + 1) % flush_every == 0 or i + 1 == len(sequences):
            for array in out.values():
                array.flush()
            _write_record(folder, {"about": wanted, "done": i + 1, "complete": i + 1 == len(sequences)})
    if not len(sequences):
        _write_record(folder, {"about": wanted, "done": 0, "complete": True})
    del out
    return FeatureSet.open(folder)


def first_tokens(texts: Iterable[str], tokenizer, *, seq_len: int, max_tokens: int,
                 min_len: int = 32) -> list[np.ndarray]:
    """The first ``seq_len`` tokens of each text (tokenized without special tokens, as the datastore's build does),
    skipping texts shorter than ``min_len`` tokens, until ``max_tokens`` tokens are taken."""
    out: list[np.ndarray] = []
    total = 0
    for text in texts:
        if total >= max_tokens:
            break
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:seq_len]
        if len(ids) < min_len:
            continue
        ids = ids[: max_tokens - total] if total + len(ids) > max_tokens else ids
        out.append(np.asarray(ids, dtype=np.int32))
        total += len(ids)
    return out


@torch.no_grad()
def top_tokens(g: torch.Tensor, weight: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely tokens of each row of ``g`` ``[n, d]`` through the LM head ``weight`` ``[V, d]`` (the
    product in ``weight``'s dtype), and their softmax probabilities: ``ids [n, k]`` int64 and ``probs [n, k]``
    float32, most likely first."""
    n = g.shape[0]
    ids, probs = torch.empty((n, k), dtype=torch.long), torch.empty((n, k), dtype=torch.float32)
    for s in range(0, n, CHUNK_ROWS):
        e = min(n, s + CHUNK_ROWS)
        z = (g[s:e].to(weight.dtype) @ weight.T).float()
        top = z.topk(k, dim=-1)
        ids[s:e] = top.indices
        probs[s:e] = (top.values - torch.logsumexp(z, dim=-1, keepdim=True)).exp()
    return ids, probs
