"""The native core (C++, nanobind): the lowest layer, imported by :mod:`datastore` and :mod:`drafting`.

- :class:`Core` holds the merged drafter's request table; :meth:`Core.step` follows a :class:`Batch` of requests and
  drafts it in one call, its datastore trees read from host-local replicas (:class:`Replica`) or given by a round trip
  (:class:`Trees`), and answers a :class:`Step`; :class:`Options` are its settings (:data:`DEFAULTS`),
  :class:`EngineRows` an engine's rows, :class:`Curve` a step-cost curve, :data:`MAX_BUDGET` the limit on a budget,
  :class:`Head` a draft head the core reads a row's state through (:meth:`Core.set_model`);
- :class:`Replica` maps a host-local replica (``docs/replica-format.md``), :class:`ReplicaWriter` writes one,
  :class:`ReplicaError` (an ``OSError``) names what is wrong with one;
- :func:`blob_header`, :func:`parse_blob` and :func:`parse_tree_payload` read token-tree blobs
  (``docs/tree-format.md``); :func:`chain_cut`, :func:`tree_cut` and :func:`goodput_keep` cut scored trees and chains;
- :data:`FEATURES` names the calibration's columns and :data:`SOURCES` the sources, in union order;
  :data:`MODEL_FEATURES` the columns a with-model calibration weighs after them (:meth:`Core.set_model`).

The Python oracle of every stage is in ``tests/oracle/``. Importing fails with :class:`ImportError` naming the fix when
the extension is not built, or was built from other sources than the ``csrc/`` beside it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

__all__ = ["COMPRESSION_IDS", "Batch", "Core", "Curve", "DEFAULTS", "EngineRows", "FEATURES", "Head", "MAX_BUDGET",
           "MODEL_FEATURES", "NodeTable", "Options", "OutputsInfo", "Replica", "ReplicaError", "ReplicaWriter",
           "SOURCES", "START", "Step", "StoreSets", "Trees", "blob_header", "chain_cut", "goodput_keep", "key_hash",
           "parse_blob", "parse_tree_payload", "tree_cut"]

_FIX = "build it with `pip install -e .` (or `bash scripts/setup.sh`) from the checkout"

try:
    from ._core import (
        COMPRESSION_IDS,
        FEATURES,
        MAX_BUDGET,
        MODEL_FEATURES,
        SOURCE_DIGEST,
        SOURCES,
        START,
        Batch,
        Core,
        Curve,
        EngineRows,
        Head,
        NodeTable,
        Options,
        OutputsInfo,
        Replica,
        ReplicaError,
        ReplicaWriter,
        Step,
        StoreSets,
        Trees,
        blob_header,
        chain_cut,
        goodput_keep,
        key_hash,
        parse_blob,
        parse_tree_payload,
        tree_cut,
    )
except ImportError as exc:  # what a checkout that was never built sees
    raise ImportError(f"the native drafting core (crest_native._core) is not built ({exc}); {_FIX}") from None


def source_digest(csrc: Path) -> str:
    """The digest ``CMakeLists.txt`` compiles into the module: SHA-256 of the concatenated hex SHA-256 of every file
    of ``csrc``, in name order."""
    files = sorted(p for p in csrc.iterdir() if p.is_file())
    return hashlib.sha256("".join(hashlib.sha256(p.read_bytes()).hexdigest() for p in files).encode()).hexdigest()


_CHECKOUT = Path(__file__).resolve().parent.parent  # in a checkout (an editable install), the sources are beside it
_IN_CHECKOUT = (_CHECKOUT / "CMakeLists.txt").is_file() and (_CHECKOUT / "csrc").is_dir()
if _IN_CHECKOUT and source_digest(_CHECKOUT / "csrc") != SOURCE_DIGEST:
    raise ImportError(f"the native drafting core was built from other sources than {_CHECKOUT / 'csrc'} "
                      f"(a stale build); {_FIX}")

DEFAULTS: dict = {name: getattr(Options(), name) for name in Options.names}
"""Every core setting's default, by name (``csrc/core.hpp``'s ``crest::Options``, where each is written once)."""
