"""A client-side cache of decoded token trees, keyed by build and n-gram, bounded in bytes (LRU).

CREST keeps only the most frequent n-grams, and a decoder looks up the last few
tokens of every sequence at every step, so a small set of hot n-grams serves most
lookups. The cache holds decoded trees and also *absent* keys (n-grams the build
does not hold): a longest-match lookup probes several lengths and the longer ones
usually miss, so remembering misses is what lets a lookup be answered without
the server. Entries of one build are never served for another: the build id is
part of the key, and :meth:`TreeCache.drop_build` frees a replaced build's entries.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from toolkit.settings import DEFAULTS

from .tree import TokenTree

__all__ = ["CACHE_BYTES", "TreeCache"]

CACHE_BYTES = int(DEFAULTS.cache_mb * 2**20)
"""The tree cache's default bound, bytes (``CREST_CACHE_MB``'s default)."""

_ENTRY_OVERHEAD = 200  # dict slot, key tuple and bytes object, TokenTree and three ndarray headers (measured ~190 B)


def entry_bytes(key: bytes, tree: TokenTree | None) -> int:
    """Estimated resident bytes of one entry: the key, the tree's three arrays and Python overhead."""
    size = _ENTRY_OVERHEAD + len(key)
    if tree is not None:
        size += tree.token_ids.nbytes + tree.parents.nbytes + tree.counts.nbytes
    return size


class TreeCache:
    """Thread-safe LRU of ``(build id, key) -> TokenTree or None (absent)``, bounded in bytes.

    Args:
        max_bytes: the bound, >= 0 (0 disables the cache).

    Attributes:
        hits / misses: :meth:`get` calls that found / did not find the key.
        evictions: entries dropped to stay within ``max_bytes``.

    Raises:
        ValueError: when ``max_bytes < 0``.
    """

    _ABSENT = object()

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes={max_bytes}: must be >= 0")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0
        self._entries: OrderedDict[tuple[int, bytes], tuple[TokenTree | None, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, build: int, key: bytes):
        """``(True, tree or None)`` when cached (``None``: the build does not hold the key), else ``(False, None)``."""
        with self._lock:
            entry = self._entries.get((build, key))
            if entry is None:
                self.misses += 1
                return False, None
            self._entries.move_to_end((build, key))
            self.hits += 1
            return True, entry[0]

    def get_many(self, build: int, keys: list[bytes]) -> list[tuple[bool, TokenTree | None]]:
        """:meth:`get` for many keys under one lock (a lookup step asks for several suffixes of many contexts)."""
        out: list[tuple[bool, TokenTree | None]] = []
        with self._lock:
            entries, move = self._entries, self._entries.move_to_end
            for key in keys:
                entry = entries.get((build, key))
                if entry is None:
                    out.append((False, None))
                else:
                    move((build, key))
                    out.append((True, entry[0]))
            hits = sum(found for found, _ in out)
            self.hits += hits
            self.misses += len(out) - hits
        return out

    def put(self, build: int, key: bytes, tree: TokenTree | None) -> None:
        """Remember ``tree`` (or that the build does not hold ``key``), evicting the least recently used."""
        size = entry_bytes(key, tree)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop((build, key), None)
            if old is not None:
                self.bytes -= old[1]
            self._entries[(build, key)] = (tree, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.bytes -= dropped
                self.evictions += 1

    def drop_build(self, build: int) -> int:
        """Forget every entry of ``build`` (a replaced build); returns how many were dropped."""
        with self._lock:
            stale = [k for k in self._entries if k[0] == build]
            for k in stale:
                self.bytes -= self._entries.pop(k)[1]
            return len(stale)
