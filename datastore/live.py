"""The live layer: finished outputs of the target model, appended by every decoder process, folded into a
datastore of their own.

SuffixDecoding (Oliaro et al., https://arxiv.org/abs/2411.04975, §3) learns from the model's previous
responses in one global suffix tree per process. Here the outputs are shared across processes and hosts:

- a decoder hands each finished request's output to a :class:`datastore.admin.live_writer.LiveWriter`, which
  appends it to the
  ``live_outputs`` table on a background thread, never on the decoding path; the writer's queue is bounded
  in bytes (outputs beyond it are dropped and counted), and its role needs only ``INSERT``
  (``python -m datastore grant-appender``);
- ``python -m ingest compact-live --name NAME`` keeps the newest outputs within a byte budget (evicting the
  rest), counts their n-grams and builds the trees of the top-t ones exactly like a corpus build, into the
  datastore ``NAME.live`` (:func:`live_name`), swapped in atomically; readers follow it as any rebuild;
- between two such compactions (folds, a rebuild of every output kept), ``python -m ingest compact-live --delta``
  compacts only the outputs appended since the main build into a small delta layer, the datastore ``NAME.live.delta``
  (:func:`delta_name`), so that a fresh output drafts within seconds whatever the main build's size (an LSM tree's
  two levels). Readers take the two builds as one source (:func:`delta_serves`; the native core's
  ``crest::live_layer`` joins their trees);
- provenance is kept per tree: a tree from ``NAME.live`` came from outputs (its build records
  ``corpus.source = "outputs"``), one from ``NAME`` from the corpus, and the drafter weighs the two by
  separate calibrated features (:mod:`drafting.calibration`).

Outputs are stored as uint32 little-endian token ids (:func:`encode_output`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .registry import DatastoreInfo

__all__ = ["DELTA_SUFFIX", "LIVE_MAX_BYTES", "LIVE_SUFFIX", "LIVE_TOP_T", "decode_output", "delta_name", "delta_of",
           "delta_serves", "encode_output", "live_name"]

LIVE_TOP_T = 200_000
"""The n-grams per n a compaction of the live layer keeps, by default (``compact-live --top-t``,
``CREST_LIVE_TOP_T``)."""
LIVE_MAX_BYTES = 256_000_000
"""The live layer's default size bound, bytes: half for the outputs kept, half for the trees (``compact-live
--max-bytes``, ``CREST_LIVE_MAX_BYTES``)."""


LIVE_SUFFIX = ".live"
"""What a datastore's name takes for its live layer's (:func:`live_name`)."""


def live_name(name: str) -> str:
    """The datastore holding the live layer of the datastore ``name``."""
    return name + LIVE_SUFFIX


DELTA_SUFFIX = ".delta"
"""What a live layer's name takes for its delta's (:func:`delta_name`)."""


def delta_of(layer: str) -> str:
    """The datastore holding the delta of the live layer ``layer`` (:func:`live_name`'s name)."""
    return layer + DELTA_SUFFIX


def delta_name(name: str) -> str:
    """The datastore holding the delta of the live layer of the datastore ``name``: the outputs appended since the
    layer's main build, compacted on their own (``python -m ingest compact-live --delta``)."""
    return delta_of(live_name(name))


def delta_serves(main: DatastoreInfo | None, delta: DatastoreInfo | None) -> bool:
    """Whether readers draft from the delta build ``delta`` beside the live layer's main build ``main`` (``None``: none
    built): only a delta built on that very main build, whose outputs are the ones appended after it. A delta built on
    an earlier main build would count again the outputs a fold has since folded into the main build; it is passed over
    until the next delta compaction replaces it."""
    if delta is None:
        return False
    base = 0 if main is None else main.last_output_id or 0
    return (delta.base_output_id or 0) == base


def encode_output(tokens: Sequence[int]) -> bytes:
    """``[n]`` token ids -> ``4 n`` bytes, uint32 little-endian.

    Raises:
        ValueError: when ``tokens`` is empty or an id is outside ``[0, 2**32)``.
    """
    arr = np.asarray(tokens, dtype=np.int64)
    if arr.ndim != 1 or len(arr) == 0:
        raise ValueError(f"an output must be a non-empty 1-D token sequence, got shape {arr.shape}")
    if arr.min() < 0 or arr.max() >= 1 << 32:
        raise ValueError("token ids must be in [0, 2**32)")
    return arr.astype("<u4").tobytes()


def decode_output(blob: bytes) -> np.ndarray:
    """``4 n`` bytes -> ``[n]`` uint32 token ids.

    Raises:
        ValueError: when the length is not a positive multiple of 4.
    """
    if len(blob) == 0 or len(blob) % 4:
        raise ValueError(f"a stored output is a positive multiple of 4 bytes, got {len(blob)}")
    return np.frombuffer(blob, dtype="<u4").astype(np.uint32)
