"""The datastore's stored suffixes of a context for a script that measures drafts: looked up again after a fault.

A :class:`drafting.DatastoreSource` drafts without the datastore for ``retry_s`` after a fault (a lookup that timed
out on a fresh build's cold pages, a restart), which keeps a server's output unchanged but changes what a replay
measures: a position read without the datastore is not the union being fitted or scored."""

from __future__ import annotations

import time

ATTEMPTS = 5
"""Lookups of one context before the script stops."""


def stored_suffixes(source, context: list[int]) -> list:
    """Every stored suffix of ``context`` (token ids), longest first (``[]``: none), from ``source`` (a
    :class:`drafting.DatastoreSource`; a short ``retry_s`` keeps the wait short), looked up again after a fault.

    Raises:
        SystemExit: when the datastore faults :data:`ATTEMPTS` times running (the message names the faults).
    """
    for _ in range(ATTEMPTS):
        faults = sum(source.faults.values())
        got = source.candidates_batch([context])[0]
        if source.client is not None and sum(source.faults.values()) == faults:  # answered, not down
            return got
        time.sleep(source.retry_s * 1.1)  # the source reopens its backend at its first lookup after retry_s
    raise SystemExit(f"error: the datastore faulted {ATTEMPTS} times running ({dict(source.faults)}); rerun when the "
                     "server is reachable")
