"""Compaction of the live layer: finished outputs (``live_outputs``, appended through :class:`live.LiveWriter`) folded
into the datastore ``<name>.live`` by the same top-t rule as a corpus build.

Run by :class:`live.LiveCompactor`, or by ``python -m live compact --name NAME`` as the datastores' owner. One
compaction takes the datastore's compactor lock (:func:`datastore.registry.compactor_lock_key`), or does nothing when
another process holds it; keeps the newest outputs whose tokens fit in half of ``--max-bytes`` (4 bytes a token; the
older ones are evicted once the new build serves); builds them like a corpus (:func:`ingest.build.build_datastore`),
recording ``corpus.source = "outputs"`` and ``corpus.last_output_id``; and rebuilds once with top-t scaled down when the
trees exceed the other half of ``--max-bytes``.

``--delta`` (:func:`compact_delta`) compacts only the outputs appended after the main build's newest into
``NAME.live.delta``, which readers take with the main build (:func:`datastore.layers.delta_serves`): it costs what the
new outputs cost. Folds and deltas hold separate locks; a delta deletes nothing. A compaction that fails or is killed
leaves the previous build serving and deletes nothing.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import psycopg

from datastore.connection import APPLICATION_NAME, connect, one_row, resolve_database_url
from datastore.layers import delta_name, live_name
from datastore.registry import compactor_lock_key
from datastore.schema import require_schema
from ingest.build import BuildConfig, BuildResult, TokenizedCorpus, build_datastore
from ingest.tokens import TokenStreamWriter
from toolkit.settings import DEFAULTS

from .store import decode_output

__all__ = ["CompactionResult", "compact_delta", "compact_live"]

RESCALES = 2
"""Builds again with a smaller top-t at most this many times when a layer's trees overflow their half of the bound
(bytes per n-gram rise as top-t falls, the kept n-grams being the most frequent: one estimate may fall short)."""


class CompactionResult:
    """What a compaction did.

    Attributes:
        name: the datastore. layer: the datastore built (``name.live``, or its delta ``name.live.delta``).
        outputs / tokens: outputs and tokens folded in.
        evicted: outputs deleted as older than the byte budget. build: the layer's build (``None`` when there
        were no outputs, or when ``busy``). top_t: the top-t used. seconds: wall time.
        busy: another compactor held the datastore's compactor lock, so nothing was done.
        last_output_id: the newest output folded in (``None``: none). base_output_id: for a delta, the newest output of
        the main build it was built on (0: no main build); ``None`` for a fold.
    """

    def __init__(self, name: str, layer: str, outputs: int, tokens: int, evicted: int, build: BuildResult | None,
                 top_t: int, seconds: float, *, busy: bool = False, last_output_id: int | None = None,
                 base_output_id: int | None = None) -> None:
        self.name, self.layer, self.outputs, self.tokens, self.evicted = name, layer, outputs, tokens, evicted
        self.build, self.top_t, self.seconds = build, top_t, seconds
        self.busy, self.last_output_id, self.base_output_id = busy, last_output_id, base_output_id

    def as_dict(self) -> dict:
        """JSON-ready form (``python -m live compact --json``)."""
        b = self.build
        return {"name": self.name, "layer": self.layer, "outputs": self.outputs, "tokens": self.tokens,
                "evicted": self.evicted, "top_t": self.top_t, "seconds": round(self.seconds, 3), "busy": self.busy,
                "last_output_id": self.last_output_id, "base_output_id": self.base_output_id,
                "ngrams": None if b is None else b.num_trees, "bytes_on_disk": None if b is None else b.bytes_on_disk,
                "build_id": None if b is None else b.build_id}


def compact_live(name: str, *, top_t: int = DEFAULTS.live_top_t, max_bytes: int = DEFAULTS.live_max_bytes,
                 database_url: str | None = None, config: BuildConfig | None = None,
                 progress: bool = False) -> CompactionResult:
    """Fold ``name``'s appended outputs into the datastore ``live_name(name)``, unless another compactor of ``name``
    is running (then nothing is done and the result says ``busy``).

    Args:
        name: the datastore whose outputs to compact.
        top_t: n-grams kept per n (the corpus build's rule).
        max_bytes: the layer's bound: half for the outputs kept (4 bytes a token), half for its trees on disk.
        database_url: the owner's URL (``None``: ``DATABASE_URL`` or the embedded server).
        config: other build settings (max n, depth, tree budget, tokenizer ...; default the corpus build's
            defaults and the tokenizer ``name`` was built with).

    Raises:
        ValueError: when ``top_t < 1`` or ``max_bytes < 1024``.
        datastore.errors.DatabaseUnavailable / SchemaMismatch: as for a build.
    """
    _check(top_t, max_bytes)
    started = time.perf_counter()
    url = resolve_database_url(database_url)
    layer = live_name(name)
    with _compacting(url, "compact-live", name) as held:
        if held is None:
            return CompactionResult(name, layer, 0, 0, 0, None, top_t, time.perf_counter() - started, busy=True)
        conn, tmp = held
        kept, total, oldest, newest = _newest_outputs(conn, name, max_bytes // 2 // 4, after=0)
        if not kept:
            return CompactionResult(name, layer, 0, 0, 0, None, top_t, time.perf_counter() - started)
        build, top_t = _build_layer(conn, tmp, name, layer, kept, {"last_output_id": newest}, top_t, max_bytes,
                                    url, config, progress)
        # evicted only now that the new build serves: a compaction that fails or is killed deletes nothing
        evicted = conn.execute("DELETE FROM live_outputs WHERE name = %s AND id < %s", [name, oldest]).rowcount
    return CompactionResult(name, layer, len(kept), total, evicted, build, top_t, time.perf_counter() - started,
                            last_output_id=newest)


def compact_delta(name: str, *, top_t: int = DEFAULTS.live_top_t, max_bytes: int = DEFAULTS.live_max_bytes,
                  database_url: str | None = None, config: BuildConfig | None = None,
                  progress: bool = False) -> CompactionResult:
    """Compact the outputs of ``name`` appended after the newest one its live layer's main build holds into the
    layer's delta, the datastore ``delta_name(name)``, unless another delta compaction of ``name`` is running (then
    nothing is done and the result says ``busy``). Deletes nothing; records ``corpus.base_output_id`` (the main build's
    newest output, 0 with no main build) and ``corpus.last_output_id``, by which readers take the delta
    (:func:`datastore.layers.delta_serves`).

    Args:
        name: the datastore whose outputs to compact.
        top_t: n-grams kept per n (the corpus build's rule).
        max_bytes: the layer's bound, as :func:`compact_live`: the newest outputs whose tokens fit in half of it are
            taken (older ones wait for the next fold), and the trees are held to the other half.
        database_url / config / progress: as :func:`compact_live`.

    Raises:
        ValueError: when ``top_t < 1`` or ``max_bytes < 1024``.
        datastore.errors.DatabaseUnavailable / SchemaMismatch: as for a build.
    """
    _check(top_t, max_bytes)
    started = time.perf_counter()
    url = resolve_database_url(database_url)
    layer = delta_name(name)
    with _compacting(url, "compact-live --delta", layer) as held:
        if held is None:
            return CompactionResult(name, layer, 0, 0, 0, None, top_t, time.perf_counter() - started, busy=True)
        conn, tmp = held
        row = conn.execute("SELECT coalesce((corpus->>'last_output_id')::bigint, 0) FROM datastores "
                           "WHERE name = %s AND state = 'ready'", [live_name(name)]).fetchone()
        base = 0 if row is None else int(row[0])
        kept, total, _, newest = _newest_outputs(conn, name, max_bytes // 2 // 4, after=base)
        if not kept:
            return CompactionResult(name, layer, 0, 0, 0, None, top_t, time.perf_counter() - started,
                                    base_output_id=base)
        build, top_t = _build_layer(conn, tmp, name, layer, kept,
                                    {"last_output_id": newest, "base_output_id": base}, top_t, max_bytes, url, config,
                                    progress)
    return CompactionResult(name, layer, len(kept), total, 0, build, top_t, time.perf_counter() - started,
                            last_output_id=newest, base_output_id=base)


@contextmanager
def _compacting(url: str, command: str, lock: str) -> Iterator[tuple[psycopg.Connection, Path] | None]:
    """A compaction's connection (named after ``command``, schema checked) holding the compactor lock of ``lock``
    (:func:`datastore.registry.compactor_lock_key`; released when the connection closes) and its scratch folder;
    ``None`` when another compactor holds that lock."""
    with connect(url, autocommit=True, application_name=f"{APPLICATION_NAME} {command}") as conn, \
            tempfile.TemporaryDirectory(prefix="crest-live-") as tmp:
        require_schema(conn)
        held = one_row(conn, "SELECT pg_try_advisory_lock(%s)", [compactor_lock_key(lock)])[0]
        yield (conn, Path(tmp)) if held else None


def _check(top_t: int, max_bytes: int) -> None:
    if top_t < 1 or max_bytes < 1024:
        raise ValueError(f"top_t={top_t} must be >= 1 and max_bytes={max_bytes} >= 1024")


def _build_layer(conn, tmp: Path, name: str, layer: str, kept: list[np.ndarray], ids: dict, top_t: int,
                 max_bytes: int, url: str, config: BuildConfig | None, progress: bool) -> tuple[BuildResult, int]:
    """Build ``kept`` (outputs, newest first) into the datastore ``layer`` like a corpus, with the tokenizer ``name``
    was built with, its trees held to half of ``max_bytes`` (top-t scaled down and built again when over, at most
    :data:`RESCALES` times; a build still over after that serves as it is); ``ids``:
    the output ids recorded in the build's corpus. A layer at its bound would so build twice at every fold: the build
    starts instead from the top-t of the serving build when that one was scaled down under the same bound and fits it
    (a top-t proven to fit, never one that did not: the top-t never drifts down). Returns the build and the top-t
    used."""
    tree_budget = max_bytes - max_bytes // 2
    prev = conn.execute("SELECT (params->>'top_t')::bigint, (corpus->>'max_bytes')::bigint, bytes_on_disk "
                        "FROM datastores WHERE name = %s AND state = 'ready'", [layer]).fetchone()
    if prev is not None and prev[1] == max_bytes and prev[0] is not None and 0 < prev[0] < top_t \
            and prev[2] is not None and prev[2] <= tree_budget:
        top_t = int(prev[0])
    row = conn.execute("SELECT tokenizer, tokenizer_fingerprint, (params->>'vocab_size')::int FROM datastores "
                       "WHERE name = %s AND state = 'ready'", [name]).fetchone()
    base = config or BuildConfig()
    known = None  # the datastore's tokenizer, as its build recorded it: the compaction does not load it
    if row is not None and config is None:
        base = replace(base, tokenizer=row[0])
        known = None if row[2] is None else (row[1], int(row[2]))
    stream = tmp / "outputs.u32"
    with TokenStreamWriter(stream) as writer:
        writer.write(kept[::-1])  # oldest first, as appended
    corpus = TokenizedCorpus(stream, writer.num_documents, writer.num_tokens, writer.max_token,
                             {"source": "outputs", "path": f"live_outputs:{name}", "documents": len(kept),
                              "malformed": {}, "max_bytes": max_bytes} | ids, tokenizer=known)
    cfg = replace(base, name=layer, top_t=top_t, database_url=url, workers=1, screen=False)
    build = build_datastore(cfg, progress=progress, corpus=corpus)
    for _ in range(RESCALES):  # over the bound: the top-t whose n-grams fit, estimated from this build, and again
        if build.bytes_on_disk <= tree_budget or top_t == 1:
            break
        top_t = min(top_t - 1, _fitting_top_t(build.ngram_stats, build.bytes_on_disk, tree_budget))
        build = build_datastore(replace(cfg, top_t=top_t), progress=progress, corpus=corpus)
    return build, top_t


def _fitting_top_t(stats: dict, bytes_on_disk: int, budget: int) -> int:
    """The largest top-t whose n-grams (per n, the fewer of top-t and the n-grams there are: ``stats``' ``distinct``,
    else ``kept``) fit in 90% of ``budget`` bytes at the build's bytes per stored n-gram (>= 1)."""
    kept = [int(v.get("kept", 0)) for v in stats.values()]
    distinct = [int(v.get("distinct") or v.get("kept", 0)) for v in stats.values()]
    fit = 0.9 * budget / (bytes_on_disk / max(sum(kept), 1))
    lo, hi = 1, max(distinct, default=1)
    while lo < hi:  # the largest t with sum(min(d, t)) <= fit
        mid = (lo + hi + 1) // 2
        if sum(min(d, mid) for d in distinct) <= fit:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _newest_outputs(conn, name: str, keep_tokens: int, after: int) -> tuple[list[np.ndarray], int, int | None,
                                                                              int | None]:
    """The newest outputs of ``name`` with ids above ``after`` whose tokens fit in ``keep_tokens``, newest first, read a
    page at a time; returns ``(outputs, tokens, oldest id kept, newest id kept)``."""
    kept: list[np.ndarray] = []
    total, oldest, newest, last = 0, None, None, None
    while True:
        page = conn.execute("SELECT id, tokens FROM live_outputs WHERE name = %s AND id > %s "
                            "AND (%s::bigint IS NULL OR id < %s) ORDER BY id DESC LIMIT 1000",
                            [name, after, last, last]).fetchall()
        for out_id, blob in page:
            toks = decode_output(bytes(blob))
            if total + len(toks) > keep_tokens:
                return kept, total, oldest, newest
            kept.append(toks)
            total += len(toks)
            oldest = out_id
            newest = out_id if newest is None else newest
        if len(page) < 1000:
            return kept, total, oldest, newest
        last = page[-1][0]
