"""The contamination screen: how much of each evaluation item a corpus holds verbatim, recorded with every build.

An evaluation set must never be part of a datastore scored on it. Every build screens its token stream against the
evaluation sets (:func:`toolkit.eval_sets.screened_texts`: Spec-Bench's questions, HumanEval's prompts and its canonical
solutions), tokenized by the build's tokenizer as written in the set (no chat template: a chat corpus holds the template
by design).

The rule (n-gram overlap, as GPT-3 §C and PaLM §8 screen their evaluations): an item's **share** is the fraction of its
token 13-grams that occur anywhere in the corpus (no 13-gram crosses a document boundary). An item is **contaminated**
when its share is at least :data:`THRESHOLD` (one half). The count of items with any shared 13-gram (GPT-3's rule) is
recorded beside it, as a figure; the share decides. Items shorter than 13 tokens are never flagged.

The scan is exact: 13-grams are hashed (64-bit, polynomial), looked up through a bitmap and a sorted table, and every
hit is compared token by token, in one pass over the stream in chunks (memory: a few bytes per token of one chunk).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolkit.eval_sets import item_digests, screened_texts

from .tokens import SEPARATOR, document_names, open_stream

__all__ = ["NGRAM", "THRESHOLD", "screen_corpus", "screen_documents", "screen_items", "screen_stream"]

NGRAM = 13
"""Tokens per screened n-gram (GPT-3's 13-gram rule)."""
THRESHOLD = 0.5
"""An item whose share of 13-grams found in the corpus is at least this is contaminated."""
MAX_DOCUMENTS = 5
"""Documents named per overlapping item (those holding most of its 13-grams)."""
_CHUNK = 1 << 23
_MULT = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xBF58476D1CE4E5B9)
_BITMAP_BITS = 24


@dataclass(frozen=True)
class _Table:
    """The screened 13-grams, deduplicated: ``hashes`` ``[u]`` uint64 sorted; ``rows`` ``[u, 13]`` uint64, the
    tokens of each; ``bitmap`` ``[2**24]`` bool over the hashes' top bits; per item ``(part, id, [k] unique
    indices of its 13-grams, one per window)``."""

    hashes: np.ndarray
    rows: np.ndarray
    bitmap: np.ndarray
    items: list[tuple[str, str, np.ndarray]]


def _hash(tokens: np.ndarray, n: int) -> np.ndarray:
    """``[len - n + 1]`` uint64 hashes of every n-gram of ``tokens`` (``[len]`` uint64), mixed so that the top bits
    spread."""
    m = len(tokens) - n + 1
    h = np.zeros(max(m, 0), dtype=np.uint64)
    if m <= 0:
        return h
    for j in range(n):
        h *= _MULT
        h += tokens[j:j + m]
    h ^= h >> np.uint64(31)
    h *= _MIX
    h ^= h >> np.uint64(29)
    return h


def screen_items(tokenizer, data_dir: str | Path | None = None) -> dict[str, list[tuple[str, np.ndarray]]]:
    """The evaluation items to screen, tokenized: per part (``spec_bench``, ``humaneval``, ``humaneval_solutions``)
    ``(item id, [len] uint32 token ids)`` pairs.

    Raises:
        FileNotFoundError: when an evaluation set's file is missing.
    """
    backend = tokenizer.backend_tokenizer
    out = {}
    for part, pairs in screened_texts(data_dir).items():
        encodings = backend.encode_batch([text for _, text in pairs], add_special_tokens=False)
        out[part] = [(item, np.asarray(e.ids, dtype=np.uint32)) for (item, _), e in zip(pairs, encodings)]
    return out


def screen_corpus(stream_path: Path, tokenizer, data_dir: str | Path | None = None) -> dict:
    """A build's screen: :func:`screen_stream` of the evaluation sets in ``data_dir`` (default: ``CREST_EVAL_DATA``
    or the packaged sets), with ``screened``: per part, the digest of every item screened
    (:func:`toolkit.eval_sets.item_digests`), which the gate before scoring checks the scored items against.

    Raises:
        FileNotFoundError: when an evaluation set's file is missing.
    """
    return screen_stream(stream_path, screen_items(tokenizer, data_dir)) | {"screened": item_digests(data_dir)}


def _table(items: Mapping[str, Sequence[tuple[str, np.ndarray]]], n: int) -> _Table:
    hashes, rows, owners = [], [], []
    for part, pairs in items.items():
        for item, ids in pairs:
            ids64 = np.asarray(ids, dtype=np.uint64)
            h = _hash(ids64, n)
            hashes.append(h)
            rows.append(np.lib.stride_tricks.sliding_window_view(ids64, n) if len(h) else np.zeros((0, n), np.uint64))
            owners.append((part, item, len(h)))
    every = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
    unique, first, inverse = np.unique(every, return_index=True, return_inverse=True)
    table_rows = np.concatenate(rows)[first] if len(every) else np.zeros((0, n), np.uint64)
    bitmap = np.zeros(1 << _BITMAP_BITS, dtype=bool)
    bitmap[unique >> np.uint64(64 - _BITMAP_BITS)] = True
    split, at = [], 0
    for part, item, k in owners:
        split.append((part, item, inverse[at:at + k]))
        at += k
    return _Table(unique, table_rows, bitmap, split)


def _scan(stream: np.ndarray, table: _Table, n: int) -> np.ndarray:
    """One pass over ``stream``: ``[p, 2]`` int64, the ``(unique n-gram index, document index)`` pairs found,
    deduplicated."""
    found_u, found_doc = [], []
    docs_before = 0
    shift = np.uint64(64 - _BITMAP_BITS)
    for start in range(0, len(stream), _CHUNK):
        stop = min(start + _CHUNK, len(stream))
        window = np.asarray(stream[start:min(stop + n - 1, len(stream))], dtype=np.uint64)
        seps = np.flatnonzero(window[:stop - start] == np.uint64(SEPARATOR))
        h = _hash(window, n)
        cand = np.flatnonzero(table.bitmap[h >> shift])
        if len(cand) and len(table.hashes):
            hc = h[cand]
            at = np.minimum(np.searchsorted(table.hashes, hc), len(table.hashes) - 1)
            keep = table.hashes[at] == hc
            cand, at = cand[keep], at[keep]
            exact = (window[cand[:, None] + np.arange(n)] == table.rows[at]).all(axis=1)
            cand, at = cand[exact], at[exact]
            doc = docs_before + np.searchsorted(seps, cand)  # separators of this chunk before each hit
            pairs = np.unique(np.stack([at.astype(np.int64), doc.astype(np.int64)], axis=1), axis=0)
            found_u.append(pairs[:, 0])
            found_doc.append(pairs[:, 1])
        docs_before += len(seps)
    if not found_u:
        return np.zeros((0, 2), np.int64)
    return np.unique(np.stack([np.concatenate(found_u), np.concatenate(found_doc)], axis=1), axis=0)


def screen_stream(stream_path: Path, items: Mapping[str, Sequence[tuple[str, np.ndarray]]],
                  n: int = NGRAM, threshold: float = THRESHOLD) -> dict:
    """Screen the token stream at ``stream_path`` against ``items`` (:func:`screen_items`).

    Args:
        stream_path: a token stream (:mod:`ingest.tokens`); its names file, when present, names the documents.
        items: per part, ``(item id, [len] uint32 token ids)`` pairs.
        n: tokens per n-gram (default 13). threshold: the share at which an item is contaminated (default 0.5).

    Returns:
        The JSON-ready record stored with the build under ``corpus.contamination``: ``n``, ``threshold``,
        ``seconds``, and per part ``items`` (screened), ``shared_any`` (items with at least one 13-gram in the
        corpus), ``contaminated`` (items at or above the threshold) and ``overlaps``: for every item with a shared
        13-gram, ``{"ngrams", "shared", "share", "documents"}`` (the names of the documents holding most of its
        13-grams, at most :data:`MAX_DOCUMENTS`).

    Raises:
        ValueError: when ``n`` < 1 or ``threshold`` is not in (0, 1].
    """
    if n < 1 or not 0.0 < threshold <= 1.0:
        raise ValueError(f"n={n}, threshold={threshold}: n must be >= 1 and the threshold in (0, 1]")
    t0 = time.perf_counter()
    table = _table(items, n)
    pairs = _scan(open_stream(stream_path), table, n)
    found = np.zeros(len(table.hashes), dtype=bool)
    found[pairs[:, 0]] = True
    parts: dict[str, dict] = {part: {"items": len(pairs_of), "shared_any": 0, "contaminated": 0, "overlaps": {}}
                              for part, pairs_of in items.items()}
    wanted_docs: dict[tuple[str, str], list[int]] = {}
    for part, item, uids in table.items:
        shared = int(found[uids].sum()) if len(uids) else 0
        if not shared:
            continue
        share = shared / len(uids)
        record = parts[part]
        record["shared_any"] += 1
        record["contaminated"] += share >= threshold
        record["overlaps"][item] = {"ngrams": len(uids), "shared": shared, "share": round(share, 4)}
        holders, counts = np.unique(pairs[np.isin(pairs[:, 0], np.unique(uids)), 1], return_counts=True)
        wanted_docs[(part, item)] = [int(d) for d in holders[np.argsort(-counts, kind="stable")][:MAX_DOCUMENTS]]
    names = document_names(stream_path, {d for docs in wanted_docs.values() for d in docs})
    for (part, item), docs in wanted_docs.items():
        parts[part]["overlaps"][item]["documents"] = [names.get(d, f"document #{d}") for d in docs]
    return {"n": n, "threshold": threshold, "seconds": round(time.perf_counter() - t0, 3), "parts": parts}


def screen_documents(documents: Sequence[np.ndarray], items: Mapping[str, Sequence[tuple[str, np.ndarray]]],
                     n: int = NGRAM, threshold: float = THRESHOLD) -> list[str | None]:
    """Screen each document alone (the same rule as :func:`screen_stream`, the share counted within the document):
    for each, ``"part/item"`` of the first evaluation item it holds at least ``threshold`` of, else ``None``. What
    ``python -m evaluation distill`` skips a prompt for, before the target answers it.

    Args:
        documents: token ids, each ``[len]`` integers below 2**32 (no separator token inside).
        items: per part, ``(item id, [len] uint32 token ids)`` pairs (:func:`screen_items`).
        n, threshold: as :func:`screen_stream`.

    Raises:
        ValueError: when ``n`` < 1 or ``threshold`` is not in (0, 1].
    """
    if n < 1 or not 0.0 < threshold <= 1.0:
        raise ValueError(f"n={n}, threshold={threshold}: n must be >= 1 and the threshold in (0, 1]")
    out: list[str | None] = [None] * len(documents)
    if not documents:
        return out
    table = _table(items, n)
    sep = np.array([SEPARATOR], dtype=np.uint64)
    stream = np.concatenate([piece for doc in documents for piece in (np.asarray(doc, dtype=np.uint64), sep)])
    pairs = _scan(stream, table, n)
    for doc in np.unique(pairs[:, 1]):
        held = pairs[pairs[:, 1] == doc, 0]
        for part, item, uids in table.items:
            if len(uids) and np.isin(uids, held).mean() >= threshold:
                out[int(doc)] = f"{part}/{item}"
                break
    return out
