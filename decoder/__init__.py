"""The decoder: the merged drafter (datastore + live layer + prompt trie, calibrated node scores), tree
verification, the HF decoding loop, replay and benchmarks.

Public API: :class:`DraftingService` (the merged drafter: request-keyed, batched, thread-safe), its scorer
:class:`Calibration`, the fault-tolerant :class:`DatastoreSource` it draws on, the :class:`Draft` every
drafter proposes (and its :class:`ScoreKind`), and the HF loop: :func:`load_target`,
:func:`speculative_generate` (lossless; greedy or sampled) and :func:`greedy_generate` (the baseline).
The papers' own drafters are in ``decoder.drafters``; the replay simulator in ``decoder.simulate``.

Names are imported on first use: drafting needs numpy and the datastore client only; the HF loop (torch,
transformers: the ``hf`` extra) loads when one of its names is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["Calibration", "DatastoreSource", "Draft", "DraftingService", "ScoreKind", "greedy_generate",
           "load_target", "speculative_generate"]

_WHERE = {"Calibration": ".calibration", "DatastoreSource": ".drafters.source", "Draft": ".draft",
          "ScoreKind": ".draft", "DraftingService": ".service", "greedy_generate": ".generate",
          "speculative_generate": ".generate", "load_target": ".model"}
_HF = frozenset({".generate", ".model"})

if TYPE_CHECKING:
    from .calibration import Calibration
    from .draft import Draft, ScoreKind
    from .drafters.source import DatastoreSource
    from .generate import greedy_generate, speculative_generate
    from .model import load_target
    from .service import DraftingService


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'decoder' has no attribute {name!r}")
    if module in _HF:
        from datastore.extras import require

        require("torch", "hf", f"decoder.{name} (the HF decoding loop)")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
