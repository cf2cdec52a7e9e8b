"""``python -m evaluation head-pack``: what a GPU machine needs to train the draft head at scale
(``evaluation/head_gpu.py``), in one folder that travels without the project.

- ``pack.json``: the record (the target, the GGUF's name, parts and SHA-256, the end-of-sequence and padding ids,
  counts).
- ``data.npz``: ``prompt_tokens`` ``[P]`` uint16 with ``prompt_offsets`` ``[prompts + 1]`` int64 (ShareGPT's
  openings, rendered with the target's chat template, each once, screened against the evaluation sets,
  :func:`evaluation.distill.rendered_prompts`); ``fit_tokens`` / ``fit_offsets`` (the fit halves' prompts with their
  greedy references: the target's own float32 answers; the report halves never travel); ``check_ids`` ``[n]`` int64
  and ``check_states`` ``[n, d]`` float32 (the target's states over one fit sequence, float32 on this CPU: the GPU's
  target must match them before it trains).
- the target's GGUF, in parts of at most ``--split-mib`` MiB (``model.gguf.0``, ...), for a transfer with a size
  limit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from toolkit.options import int_in

__all__ = ["add_parser"]

SETS = ("spec_bench", "humaneval")
CHECK_TOKENS = 128
"""Positions of the check sequence."""


def add_parser(sub, parents: list) -> None:
    """The ``head-pack`` subcommand."""
    ap = sub.add_parser("head-pack", parents=parents, description=" ".join(__doc__.split("\n\n")[0].split()),
                        help="pack the target, ShareGPT's openings and the fit halves for GPU head training.")
    ap.add_argument("--out", type=Path, required=True, help="the pack's folder (created; must be empty or absent).")
    ap.add_argument("--prompts", type=int_in(1), default=None, help="ShareGPT openings to pack (default: all).")
    ap.add_argument("--max-prompt-tokens", type=int_in(8), default=384,
                    help="the longest rendered opening packed, tokens (default: %(default)s).")
    ap.add_argument("--split-mib", type=int_in(1), default=None,
                    help="the GGUF in parts of at most this many MiB (default: one part).")
    ap.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Read, screen, render, check, write.

    Raises:
        ValueError: when ``--out`` exists and is not empty.
    """
    from decoder.model import load_target
    from evaluation.distill import rendered_prompts
    from ingest.contamination import screen_items
    from ingest.sources import default_sharegpt_path
    from toolkit.tokenizer import resolve_model

    from .features import target_features
    from .references import half, load_references

    if args.out.exists() and any(args.out.iterdir()):
        raise ValueError(f"--out {args.out} is not empty; name a new folder")
    args.out.mkdir(parents=True, exist_ok=True)
    target = load_target(None, device="cpu")
    tok = target.tokenizer
    skipped: Counter = Counter()
    prompts = [ids for _, ids in rendered_prompts([default_sharegpt_path()], tok, screen_items(tok), skipped,
                                                  max_tokens=args.max_prompt_tokens, limit=args.prompts)]
    fit = [np.asarray(list(r.prompt) + list(r.output), dtype=np.int64)
           for name in SETS for r in half(load_references(name, args.references, tokenizer=tok), "fit")]
    check = fit[0][:CHECK_TOKENS]
    arrays: dict[str, Any] = {**_flat("prompt", prompts, np.uint16), **_flat("fit", fit, np.uint16),
                              "check_ids": check, "check_states": target_features(target, check.tolist()).numpy()}
    np.savez_compressed(args.out / "data.npz", **arrays)
    src = resolve_model(None)
    if src.gguf_file is None:
        raise ValueError(f"the target {src.spec} is not a GGUF; the GPU trainer reads the default target's GGUF")
    parts, digest = _split(Path(src.path) / src.gguf_file, args.out, args.split_mib)
    eos = sorted(target.eos_token_ids)
    record = {"target": target.spec, "gguf": "model.gguf", "gguf_parts": parts,
              "gguf_sha256": digest, "eos": eos,
              "pad": int(getattr(tok, "pad_token_id", None) or eos[0]), "prompts": len(prompts),
              "prompt_tokens": int(sum(len(p) for p in prompts)), "fit_sequences": len(fit),
              "fit_tokens": int(sum(len(s) for s in fit)), "skipped": dict(skipped)}
    (args.out / "pack.json").write_text(json.dumps(record, indent=1))
    print(json.dumps({k: v for k, v in record.items() if k != "skipped"}))


def _flat(name: str, seqs: list, dtype) -> dict[str, np.ndarray]:
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    tokens = np.concatenate([np.asarray(s) for s in seqs]) if seqs else np.zeros(0, np.int64)
    if tokens.size and tokens.max() > np.iinfo(dtype).max:
        raise ValueError(f"a token id {int(tokens.max())} does not fit {np.dtype(dtype).name}")
    return {f"{name}_tokens": tokens.astype(dtype), f"{name}_offsets": np.concatenate([[0], np.cumsum(lengths)])}


def _split(gguf: Path, out: Path, mib: int | None) -> tuple[list[str], str]:
    """``gguf`` copied into ``out`` as parts of at most ``mib`` MiB (``None``: one part), read once: the parts' names,
    in order, and the GGUF's SHA-256 (hex)."""
    size = max(gguf.stat().st_size, 1) if mib is None else mib << 20
    digest = hashlib.sha256()
    names: list[str] = []
    with open(gguf, "rb") as src:
        while chunk := src.read(size):
            digest.update(chunk)
            names.append(f"model.gguf.{len(names)}")
            (out / names[-1]).write_bytes(chunk)
    return names, digest.hexdigest()
