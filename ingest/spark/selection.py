"""CREST's top-t selection from distributed counts, in two small steps on the driver.

The corpus counts live in Spark, spread over the count reducers by n-gram hash. Sorting them
all to take the first t would move every n-gram; instead:

1. :func:`thresholds` reads the count histogram (rows ``(n, c, how many n-grams have count c)``,
   a few thousand rows) and finds, per n, the smallest count ``c_t`` still inside the top-t,
   along with the statistics the single-node build records (distinct, occurrences, eligible).
2. The job collects only the rows with ``c >= c_t``: the top-t plus the ties at ``c_t``.
   :func:`select` sorts them by count descending, then token ids ascending (DuckDB, the ORDER BY of
   :func:`ingest.counting.count_top_t`), and keeps t.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np
import pyarrow as pa

from ..counting import KeptNgrams


@dataclass(frozen=True)
class NgramHistogram:
    """One n's counts summarized.

    Attributes:
        n: n-gram length. distinct: distinct n-grams. occurrences: windows counted.
        eligible: distinct n-grams with count >= min_count. threshold: the smallest count
            inside the top-t (``None`` when no n-gram is eligible).
    """

    n: int
    distinct: int
    occurrences: int
    eligible: int
    threshold: int | None


def thresholds(histogram: list[tuple[int, int, int]], top_t: int, min_count: int) -> dict[int, NgramHistogram]:
    """Per n, the statistics and the top-t count threshold.

    Args:
        histogram: ``(n, count, number of n-grams with that count)`` rows, any order.
        top_t / min_count: the selection's parameters (>= 1).

    Returns:
        ``{n: NgramHistogram}`` for every n present.
    """
    by_n: dict[int, list[tuple[int, int]]] = {}
    for n, c, k in histogram:
        by_n.setdefault(int(n), []).append((int(c), int(k)))
    out = {}
    for n, rows in sorted(by_n.items()):
        rows.sort(reverse=True)  # count descending
        threshold, taken = None, 0
        for c, k in rows:
            if c < min_count or taken >= top_t:
                break
            threshold, taken = c, taken + k
        out[n] = NgramHistogram(n, sum(k for _, k in rows), sum(c * k for c, k in rows),
                                sum(k for c, k in rows if c >= min_count), threshold)
    return out


def select(n: int, ngrams: np.ndarray, counts: np.ndarray, stats: NgramHistogram, top_t: int) -> KeptNgrams:
    """The top-t n-grams of one n from the candidate rows (every n-gram with ``c >= threshold``).

    Args:
        ngrams: ``[k, n]`` uint32 candidates. counts: ``[k]`` their corpus counts.

    Returns:
        The :class:`ingest.counting.KeptNgrams`, the same as :func:`ingest.counting.count_top_t` returns.
    """
    ngrams = np.asarray(ngrams, dtype=np.uint32).reshape(-1, n)
    names = [f"t{i}" for i in range(n)]
    table = pa.table([pa.array(ngrams[:, i]) for i in range(n)] + [pa.array(np.asarray(counts, dtype=np.uint64))],
                     names=names + ["c"])
    con = duckdb.connect()
    try:
        con.execute("SET enable_progress_bar = false")  # stdout carries --json
        con.register("candidates", table)
        cols = ", ".join(names)
        top = con.sql(f"SELECT {cols}, c FROM candidates ORDER BY c DESC, {cols} LIMIT {int(top_t)}").to_arrow_table()
    finally:
        con.close()
    kept = np.stack([top.column(c).to_numpy() for c in names], axis=1).astype(np.uint32) if top.num_rows \
        else np.zeros((0, n), dtype=np.uint32)
    return KeptNgrams(n, kept, top.column("c").to_numpy().astype(np.uint64), stats.distinct, stats.occurrences,
                      stats.eligible)
