"""Exact n-gram counting and CREST's top-t selection, on DuckDB.

CREST (§4, §5.4) keeps, for every n up to m, the t most frequent n-grams of
that n. Counting is a GROUP BY over the token stream's n-token windows; DuckDB
does it out of core (it spills to ``temp_directory`` past ``memory_limit``), and
the stream is fed to it in Arrow record batches read from the memory-mapped
stream file, so a corpus larger than RAM still counts with bounded memory.

Ties at the top-t boundary are broken by the n-gram's token ids, ascending, so
a selection is a pure function of the corpus and the parameters.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from .tokens import SEPARATOR

_CHUNK = 1 << 23  # window start positions per Arrow batch


@dataclass(frozen=True)
class KeptNgrams:
    """The n-grams kept for one n.

    Attributes:
        n: n-gram length.
        ngrams: ``[t, n]`` uint32, most frequent first.
        counts: ``[t]`` uint64 occurrences of each kept n-gram.
        distinct: distinct n-grams in the corpus before selection.
        occurrences: n-gram occurrences in the corpus (windows without a separator).
        eligible: distinct n-grams seen at least ``min_count`` times (-1 when unknown).
    """

    n: int
    ngrams: np.ndarray
    counts: np.ndarray
    distinct: int
    occurrences: int
    eligible: int = -1

    def __len__(self) -> int:
        return len(self.counts)


def valid_starts(chunk: np.ndarray, n: int) -> np.ndarray:
    """``[len(chunk) - n + 1]`` bool: windows of ``n`` tokens starting there hold no separator."""
    sep = np.zeros(len(chunk) + 1, dtype=np.int32)
    np.cumsum(chunk == SEPARATOR, out=sep[1:])
    return (sep[n:] - sep[:-n]) == 0


def ngram_windows(stream: np.ndarray, n: int, chunk: int = _CHUNK) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yield ``(start, valid, windows)`` per chunk of window start positions.

    ``windows`` is ``[n, m]`` (column ``i`` is the token at offset ``i``), ``valid``
    ``[m]`` bool; window ``j`` starts at ``start + j``. Windows at the stream's end
    that would run past it are not yielded.
    """
    total = len(stream) - n + 1
    for s in range(0, max(total, 0), chunk):
        e = min(s + chunk, total)
        block = np.asarray(stream[s:e + n - 1])
        valid = valid_starts(block, n)
        yield s, valid, np.stack([block[i:i + (e - s)] for i in range(n)])


def _batches(stream: np.ndarray, n: int, names: list[str]) -> Iterator[pa.RecordBatch]:
    for _, valid, win in ngram_windows(stream, n):
        yield pa.RecordBatch.from_arrays([pa.array(win[i][valid]) for i in range(n)], names=names)


def count_top_t(
    stream: np.ndarray,
    n: int,
    top_t: int,
    min_count: int = 1,
    workdir: Path | None = None,
    memory_limit: str = "4GB",
    threads: int = 2,
) -> KeptNgrams:
    """Count every n-gram of one length exactly and keep the top-t.

    Args:
        stream: ``[num_tokens]`` uint32 token stream (see :mod:`ingest.tokens`).
        n: n-gram length, >= 1.
        top_t: how many n-grams to keep (the most frequent), >= 1.
        min_count: drop n-grams seen fewer times than this.
        workdir: where DuckDB may spill; ``None`` keeps everything in memory.
        memory_limit: DuckDB memory limit, e.g. ``"4GB"``.
        threads: DuckDB worker threads.

    Returns:
        The :class:`KeptNgrams`, sorted by count descending, then tokens ascending.

    Raises:
        ValueError: when ``n``, ``top_t`` or ``min_count`` is below 1.
    """
    if n < 1 or top_t < 1 or min_count < 1:
        raise ValueError(f"n, top_t and min_count must be >= 1 (got n={n}, top_t={top_t}, min_count={min_count})")
    names = [f"t{i}" for i in range(n)]
    schema = pa.schema([(c, pa.uint32()) for c in names])
    reader = pa.RecordBatchReader.from_batches(schema, _batches(stream, n, names))
    con = duckdb.connect()
    try:
        con.execute(f"SET threads={int(threads)}")
        con.execute("SET memory_limit=?", [memory_limit])
        con.execute("SET preserve_insertion_order=false")
        con.execute("SET enable_progress_bar=false")
        if workdir is not None:
            con.execute("SET temp_directory=?", [str(workdir)])
        con.register("windows", reader)
        cols = ", ".join(names)
        con.sql(f"CREATE TEMP TABLE grams AS SELECT {cols}, count(*)::UBIGINT AS c FROM windows GROUP BY ALL")
        distinct, occurrences, eligible = con.sql(
            f"SELECT count(*), coalesce(sum(c), 0)::UBIGINT, count(*) FILTER (WHERE c >= {int(min_count)}) FROM grams"
        ).fetchall()[0]
        table = con.sql(
            f"SELECT {cols}, c FROM grams WHERE c >= {int(min_count)} ORDER BY c DESC, {cols} LIMIT {int(top_t)}"
        ).to_arrow_table()
    finally:
        con.close()
    ngrams = np.stack([table.column(c).to_numpy() for c in names], axis=1).astype(np.uint32) if table.num_rows \
        else np.zeros((0, n), dtype=np.uint32)
    return KeptNgrams(n, ngrams, table.column("c").to_numpy().astype(np.uint64), int(distinct), int(occurrences),
                      int(eligible))
