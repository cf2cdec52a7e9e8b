"""Trained heads on disk, found by name: one float16 safetensors file whose metadata holds the heads' config, the
target they were trained for and how they were trained.

A name resolves to ``<cache>/s4c/<name>.safetensors`` (what ``python -m research.s4c train`` writes) and, when there is
none,
to the heads shipped in the package, ``s4c/data/<name>.safetensors``. The default name is the default target's.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from decoder.model import TargetModel
from evaluation.features import target_fingerprint, target_weights
from toolkit.options import checked
from toolkit.tokenizer import cache_dir

from .heads import DraftLMHead, HeadsConfig, S4CHeads

__all__ = ["DEFAULT_HEADS", "heads_path", "load_heads", "save_heads"]

DEFAULT_HEADS = "SmolLM2-135M-Instruct"
"""The heads of the default target, shipped in the package."""
DRAFT_VOCAB_KEY = "draft_vocab"
"""The tensor of a heads file that lists the draft vocabulary (:class:`research.s4c.heads.DraftLMHead`)."""
PACKAGED = Path(__file__).with_name("data")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class HeadsNotFound(FileNotFoundError):
    """No heads of that name: the message names the command that trains them."""


def check_heads_name(name: str) -> str:
    """``name`` when it is a valid heads name (letters, digits, ``._-``, at most 100).

    Raises:
        ValueError: naming the rule.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"heads name {name!r}: use letters, digits, '.', '_' or '-' (at most 100, not starting with "
                         "a punctuation mark)")
    return name


def heads_name(text: str) -> str:
    """argparse type: :func:`check_heads_name`, its error raised as argparse's (``python -m research.s4c``,
    ``evaluation``)."""
    return checked(check_heads_name, text)


def heads_path(name: str = DEFAULT_HEADS) -> Path:
    """Where heads ``name`` are: the cache's copy (trained here) first, else the package's.

    Raises:
        HeadsNotFound: when neither exists; the message names the command that trains them.
        ValueError: for a malformed name.
    """
    check_heads_name(name)
    for folder in (Path(cache_dir()) / "s4c", PACKAGED):
        path = folder / f"{name}.safetensors"
        if path.exists():
            return path
    raise HeadsNotFound(f"no S4C heads named {name!r} (looked in {Path(cache_dir()) / 's4c'} and {PACKAGED}); "
                        f"train them with `python -m research.s4c train --name {name}`")


def save_heads(heads: S4CHeads, path: str | os.PathLike, *, target: TargetModel, record: dict,
               draft_vocab: torch.Tensor | None = None) -> Path:
    """Write ``heads`` as float16 with their config, the target's spec and fingerprint, ``record`` (how they were
    trained, their held-out accuracy) and the draft vocabulary (``[V']`` token ids, most frequent first; ``None``:
    all), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().to(torch.float16).contiguous() for k, v in heads.state_dict().items()}
    if draft_vocab is not None:
        weights[DRAFT_VOCAB_KEY] = draft_vocab.to(torch.int32).contiguous()
    meta = {"config": json.dumps(heads.config.to_json()), "target": target.spec,
            "target_fingerprint": target_fingerprint(target), "record": json.dumps(record)}
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    save_file(weights, str(tmp), metadata=meta)
    os.replace(tmp, path)
    return path


def read_record(path: str | os.PathLike) -> dict:
    """The metadata of a heads file: ``config``, ``target``, ``target_fingerprint`` and ``record`` (parsed)."""
    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata() or {})
    return {"config": json.loads(meta["config"]), "target": meta.get("target"),
            "target_fingerprint": meta.get("target_fingerprint"), "record": json.loads(meta.get("record", "{}"))}


def load_heads(target: TargetModel, name: str = DEFAULT_HEADS, *, path: str | os.PathLike | None = None,
               draft_dtype: torch.dtype = torch.float32) -> S4CHeads:
    """The heads ``name`` (or the file ``path``) over ``target``'s embedding and LM head, float32, in eval mode, their
    drafting LM head restricted to the file's draft vocabulary and computed in ``draft_dtype``.

    Raises:
        HeadsNotFound: when there are none of that name (the message names the training command).
        ValueError: when they were trained for another target (its fingerprint differs), naming the command that
            trains heads for this one.
    """
    path = Path(path) if path is not None else heads_path(name)
    about = read_record(path)
    mine = target_fingerprint(target)
    if about["target_fingerprint"] != mine:
        raise ValueError(f"the heads in {path} were trained for target {about['target']!r} "
                         f"({about['target_fingerprint']}), not for {target.spec!r} ({mine}); train heads for it with "
                         f"`python -m research.s4c train --model {target.spec} --name NAME`")
    config = HeadsConfig(**about["config"])
    embedding, lm_head = target_weights(target)
    with torch.random.fork_rng(devices=[]):  # the throw-away initialisation leaves the caller's RNG as it was
        heads = S4CHeads(config, embedding.float(), lm_head.float())
    with safe_open(str(path), "pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - a safetensors file, not a dict
    vocab = state.pop(DRAFT_VOCAB_KEY, None)
    heads.load_state_dict({k: v.float() for k, v in state.items()})
    heads.draft_head = DraftLMHead(heads.lm_head, None if vocab is None else vocab.long(), draft_dtype)
    return heads.eval()
