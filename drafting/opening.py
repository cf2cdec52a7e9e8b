"""Composing the merged drafter for a datastore name (:meth:`drafting.DraftingService.open`): its fault-tolerant
lookups over the shared datastore and its live layer, the catalog of the datastores a request may name, the tokenizer
checked against each build's, and the calibration's token term kept only for the tokenizer it was fitted for."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from datastore.cache import CACHE_BYTES

from .calibration import Calibration
from .catalog import MAX_OPEN, DatastoreCatalog
from .source import DatastoreSource
from .step import OutputSink

if TYPE_CHECKING:
    from .service import DraftingService

__all__ = ["open_service"]

log = logging.getLogger("drafting.service")


def open_service(cls: type[DraftingService], datastore: str, *, tokenizer, database_url: str | None = None,
                 live: bool = True, cache_bytes: int = CACHE_BYTES, replicas: bool = True,
                 vocab_size: int | None = None, calibration: Calibration | None = None, min_score: float = 0.0,
                 outputs_bytes: int | None = None, max_tokens: int = 0, live_writer: OutputSink | None = None,
                 datastores: Sequence[str] = (), max_open: int = MAX_OPEN, online_strength: float | None = None,
                 online_share: int | None = None, reopen_in_background: bool = True) -> DraftingService:
    """The merged drafter over the shared datastore ``datastore`` and the datastores ``datastores`` a request may name
    (:mod:`drafting.catalog`), their lookups composed in one place (what an engine's proposer uses).

    Args:
        datastore: the shared datastore's name. tokenizer: the target's tokenizer (checked against each build's, and
            against the calibration's token term: a term fitted for another tokenizer is dropped, with a warning).
        database_url: libpq URL (default ``DATABASE_URL`` or the embedded server).
        live: also draft from each datastore's live layer ``<name>.live`` (once it is compacted), read with it.
        cache_bytes: each datastore's round-trip tree cache bound, bytes.
        replicas: read host-local replicas of the builds (:mod:`datastore.replica`) once they are ready;
            ``False``: every step is a round trip.
        vocab_size: as the constructor (default ``len(tokenizer)``; an engine's model may have a larger one).
        calibration / min_score / outputs_bytes / max_tokens / live_writer / online_strength / online_share: as the
            constructor.
        datastores: the names a request may give (the operator's list; any other drafts from the shared datastore).
        max_open: most of them open at once (the least recently named with no request closed first), >= 1.
        reopen_in_background: a failed datastore is reopened on a background thread, so no step ever waits for a
            connection attempt (an engine's step must not stall while the server is down).

    Raises:
        ValueError: as the constructor, and for ``max_open < 1``.
    """
    from datastore.layers import live_name
    from datastore.shared import SharedDatastore
    from toolkit.tokenizer import tokenizer_fingerprint

    fingerprint = tokenizer_fingerprint(tokenizer)  # once: it serializes the whole tokenizer (0.5 s here)
    calibration = calibration or Calibration.load()
    mine = calibration.for_tokenizer(fingerprint)
    if mine is not calibration:
        log.warning("the calibration's token term was fitted for another tokenizer: drafting without it (fit one "
                    "for yours with python -m evaluation calibrate)")

    def connect(name: str) -> SharedDatastore:
        return SharedDatastore.open(name, fingerprint=fingerprint, database_url=database_url, cache_bytes=cache_bytes,
                                    live=live_name(name) if live else None, replicas=replicas)

    shared = DatastoreSource(lambda: connect(datastore), reopen_in_background=reopen_in_background)
    catalog = DatastoreCatalog(shared, datastore, connect=connect, allowed=datastores, max_open=max_open)
    return cls(catalog, vocab_size=vocab_size or len(tokenizer), key_vocab=len(tokenizer), calibration=mine,
               min_score=min_score, outputs_bytes=outputs_bytes, max_tokens=max_tokens, online_strength=online_strength,
               online_share=online_share, live_writer=live_writer)
