"""The decoder: speculative decoding with tree verification in the HF loop (our own decoding loop, batch size 1),
lossless for greedy decoding and for sampling, against the plain greedy loop it is measured by.

Public API: :func:`load_target` (the target model: SmolLM2-135M-Instruct's GGUF by default),
:func:`speculative_generate` (any :class:`drafting.Drafter`; greedy or sampled, token-identical to
:func:`greedy_generate` when greedy) and
:func:`greedy_generate`, and the :class:`GenerationResult` they return (which the replay simulator returns too).

The loop needs the ``hf`` extra (torch, transformers); its names are imported on first use, so
:mod:`decoder.result` loads without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["GenerationResult", "greedy_generate", "load_target", "speculative_generate"]

_WHERE = {"GenerationResult": ".result", "greedy_generate": ".generate", "speculative_generate": ".generate",
          "load_target": ".model"}

if TYPE_CHECKING:
    from .generate import greedy_generate, speculative_generate
    from .model import load_target
    from .result import GenerationResult


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'decoder' has no attribute {name!r}")
    if module != ".result":
        from toolkit.extras import require

        require("torch", "hf", f"decoder.{name} (the HF decoding loop)")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
