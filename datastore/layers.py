"""How a datastore's layers are named: its live layer (``NAME.live``, every decoder's finished outputs compacted,
:mod:`live`) and that layer's delta (``NAME.live.delta``, the outputs appended since the layer's main build), which
readers take with the main build as one source (:func:`delta_serves`; the native core's ``crest::live_layer`` joins
their trees). The read path and the registry's administration name layers through these alone.
"""

from __future__ import annotations

from .registry import DatastoreInfo

__all__ = ["DELTA_SUFFIX", "LIVE_SUFFIX", "delta_name", "delta_of", "delta_serves", "live_name"]

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
    layer's main build, compacted on their own (``python -m live compact --delta``)."""
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
