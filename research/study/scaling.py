"""The corpus-size study: what a larger corpus buys in accept length, and what it costs to build and look up.

For each corpus (:mod:`research.study.sizes`: code at 1x, 3x and all of this interpreter's Python source, scored on
HumanEval; ShareGPT at 10%, 33% and 100%, scored on Spec-Bench) and each size:

1. **tokenize** the size once (cached under the study's folder), in a child process, timed, its peak memory sampled;
2. **build** a datastore from the tokens at each top-t: the fixed ones (default 2M) and one scaled with the corpus
   (``scaled_top_t`` at the largest size, proportionally fewer n-grams at the smaller ones), each in a child process
   (:func:`research.study.measure.run_measured`: wall time, stage timings, peak RSS of the process tree);
3. **gate** it: the build's contamination screen must not hold a scored prompt (:func:`evaluation.require_clean`);
4. **replay** the report half of the evaluation set against the target's saved greedy outputs for the datastore
   alone and for the merged drafter, draft trees and chains at each budget (:func:`evaluation.simulate.replay`,
   exact for greedy decoding), pooled and per category;
5. **look up**: the longest-match lookup's p50/p99 over contexts of the scored text, through Postgres (one round
   trip each) and through the host-local replica (written afresh, warm page cache);
6. drop the datastore (unless ``keep``).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from benchmarks.peer_drafters import RetrievalDrafter
from datastore import Datastore
from datastore.admin.catalog import drop_datastore
from datastore.errors import DatastoreNotFound
from drafting import DatastoreSource, Drafter, DraftingService
from evaluation.contamination import PARTS, require_clean
from evaluation.prompts import Prompt
from evaluation.simulate import replay
from ingest.build import BuildConfig, BuildResult, TokenizedCorpus, build_datastore, tokenize_corpus
from toolkit.tokenizer import load_tokenizer, tokenizer_fingerprint

from .measure import run_measured
from .sizes import SizePoint

__all__ = ["AcceptRow", "BuildRow", "ScalingGrid", "run_size"]

METHODS = ("datastore", "merged")


@dataclass(frozen=True)
class ScalingGrid:
    """What the corpus-size study measures at each size.

    Attributes:
        top_t: the fixed top-t values (n-grams kept per n), each >= 1.
        scaled_top_t: the top-t at the corpus's largest size; a smaller size keeps proportionally fewer
            (``round(scaled_top_t * tokens / largest tokens)``, at least 1); ``None``: no scaled line.
        tree_budgets / chain_budgets: draft nodes per step replayed as trees / as chains (each 1..1024).
        lookups: contexts timed per lookup path (>= 1).
        keep: keep the datastores built (default: each is dropped once measured).

    Raises:
        ValueError: when a value is out of range or nothing is replayed.
    """

    top_t: tuple[int, ...] = (2_000_000,)
    scaled_top_t: int | None = 2_000_000
    tree_budgets: tuple[int, ...] = (8, 16)
    chain_budgets: tuple[int, ...] = (4, 8)
    lookups: int = 5000
    keep: bool = False

    def __post_init__(self) -> None:
        budgets = self.tree_budgets + self.chain_budgets
        if not all(t >= 1 for t in self.top_t) or (self.scaled_top_t is not None and self.scaled_top_t < 1):
            raise ValueError("every top-t must be >= 1")
        if not self.top_t and self.scaled_top_t is None:
            raise ValueError("give a fixed top-t or a scaled one: nothing would be built")
        if not budgets or not all(1 <= b <= 1024 for b in budgets):
            raise ValueError(f"budgets {budgets}: give at least one, each in 1..1024")
        if self.lookups < 1:
            raise ValueError(f"lookups={self.lookups}: must be >= 1")

    def shapes(self) -> list[tuple[str, int]]:
        """``(shape, budget)`` pairs replayed: trees first."""
        return [("tree", b) for b in self.tree_budgets] + [("chain", b) for b in self.chain_budgets]

    def top_ts(self, tokens: int, largest_tokens: int) -> list[tuple[str, int]]:
        """``(rule, top-t)`` of the builds of a size of ``tokens`` tokens: ``fixed``, ``scaled``, or
        ``fixed+scaled`` for a scaled top-t equal to a fixed one (built once, on both lines)."""
        scaled = None if self.scaled_top_t is None else max(1, round(self.scaled_top_t * tokens /
                                                                     max(largest_tokens, 1)))
        out = [("fixed+scaled" if t == scaled else "fixed", t) for t in self.top_t]
        if scaled is not None and scaled not in self.top_t:
            out.append(("scaled", scaled))
        return out


@dataclass
class BuildRow:
    """One build of one size (a row of ``study_corpus_size_builds.csv``).

    Attributes:
        corpus / size / rule: the corpus, the size's label and how it was chosen. top_t / top_t_rule: n-grams kept
            per n, and ``fixed``, ``scaled`` or ``fixed+scaled`` (:meth:`ScalingGrid.top_ts`).
        documents / tokens: what the size holds. digest: the source's digest (what was read).
        tokenize_s: seconds to tokenize the size (0 when cached: see ``tokenize_cached``). build_s: seconds from
            tokens to a ready datastore. wall_s: their sum. tokens_per_s: tokens / wall_s.
        peak_rss_bytes: the largest process-tree resident memory of the two stages; peak_process_bytes: of one
            process.
        stages: seconds per build stage (JSON; trees and encode are summed over worker processes).
        ngrams / bytes / bytes_per_ngram: rows stored, bytes on disk (table, TOAST and index), their ratio.
        screen_shared_any / screen_contaminated: scored items with any 13-gram in the corpus / contaminated ones
            (prompts or, for HumanEval, canonical solutions); screen_max_share: the largest share.
        lookup_pg_p50_ms / lookup_pg_p99_ms: longest-match lookups through Postgres (a round trip each);
        lookup_replica_p50_ms / lookup_replica_p99_ms: through the host-local replica (warm page cache);
        replica_bytes / replica_write_s: the replica file and the seconds to write it.
    """

    corpus: str
    size: str
    rule: str
    top_t: int
    top_t_rule: str
    documents: int
    tokens: int
    digest: str
    tokenize_s: float
    tokenize_cached: bool
    build_s: float
    wall_s: float
    tokens_per_s: float
    peak_rss_bytes: int
    peak_process_bytes: int
    stages: str
    ngrams: int
    bytes: int
    bytes_per_ngram: float
    screen_shared_any: int
    screen_contaminated: int
    screen_max_share: float
    lookup_pg_p50_ms: float
    lookup_pg_p99_ms: float
    lookup_replica_p50_ms: float
    lookup_replica_p99_ms: float
    replica_bytes: int
    replica_write_s: float


@dataclass
class AcceptRow:
    """One replay (a row of ``study_corpus_size_accept.csv``): ``category`` is ``all`` for the pooled figure.

    Attributes:
        accept_length: tokens committed per verification step (bonus included). steps / prompts: what was pooled.
    """

    corpus: str
    size: str
    tokens: int
    top_t: int
    top_t_rule: str
    method: str
    shape: str
    budget: int
    category: str
    accept_length: float
    steps: int
    prompts: int
    replay_s: float


def _tokenize(config: BuildConfig, path: str) -> TokenizedCorpus:
    """Child stage: tokenize ``config``'s corpus into ``path`` (names beside it)."""
    return tokenize_corpus(config, load_tokenizer(config.tokenizer), Path(path), progress=False)


def _build(config: BuildConfig, corpus: TokenizedCorpus) -> BuildResult:
    """Child stage: build ``config`` from the tokenized ``corpus``."""
    return build_datastore(config, progress=False, corpus=corpus)


@dataclass(frozen=True)
class Tokenized:
    """A tokenized size: the corpus, and what tokenizing it cost (``cached``: measured by an earlier run)."""

    corpus: TokenizedCorpus
    seconds: float
    peak_tree_bytes: int
    peak_process_bytes: int
    cached: bool


def tokenize_size(point: SizePoint, folder: Path) -> Tokenized:
    """Tokenize ``point`` into ``folder`` (kept: a later run reuses it and its measured cost).

    Raises:
        ingest.errors.SourceError: when the corpus cannot be read.
    """
    meta, stream = folder / "corpus.json", folder / "tokens.u32"
    if meta.exists() and stream.exists():
        m = json.loads(meta.read_text())
        tok = TokenizedCorpus(stream, m["num_documents"], m["num_tokens"], m["max_token"], m["report"])
        return Tokenized(tok, m["seconds"], m["peak_tree_bytes"], m["peak_process_bytes"], True)
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / "tokens.partial"
    got = run_measured(_tokenize, point.config, str(partial))
    partial.replace(stream)
    (folder / "tokens.partial.names").replace(folder / "tokens.u32.names")
    tok = replace(got.value, path=stream)
    meta.write_text(json.dumps({"num_documents": tok.num_documents, "num_tokens": tok.num_tokens,
                                "max_token": tok.max_token, "report": tok.report, "seconds": got.seconds,
                                "peak_tree_bytes": got.peak_tree_bytes,
                                "peak_process_bytes": got.peak_process_bytes}))
    return Tokenized(tok, got.seconds, got.peak_tree_bytes, got.peak_process_bytes, False)


def _contexts(prompts: Sequence[Prompt], references: Sequence[Sequence[int]], count: int) -> list[np.ndarray]:
    """``count`` contexts (the last 5 tokens before a position) spread evenly over the scored text."""
    every: list[list[int]] = []
    for p, ref in zip(prompts, references):
        seq = list(p.token_ids) + list(ref)
        every.extend(seq[max(0, i - 5):i] for i in range(1, len(seq)))
    picks = np.linspace(0, len(every) - 1, num=min(count, len(every))).astype(int)
    return [np.asarray(every[i], dtype=np.uint32) for i in picks]


def _percentiles(call: Callable, items: Sequence) -> tuple[float, float]:
    """p50 and p99 of ``call(item)``, milliseconds, after one untimed pass (warm caches)."""
    for item in items:
        call(item)
    times = []
    for item in items:
        t = time.perf_counter()
        call(item)
        times.append(time.perf_counter() - t)
    ms = np.array(times) * 1e3
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def lookup_latency(url: str, name: str, fingerprint: str, contexts: Sequence[np.ndarray],
                   folder: Path) -> tuple[float, float, float, float, int, float]:
    """Longest-match lookup latency of datastore ``name``: ``(pg p50, pg p99, replica p50, replica p99)`` in ms,
    then the replica's bytes and write seconds (written into ``folder`` and removed)."""
    from datastore.connection import connect
    from datastore.registry import resolve_build
    from datastore.replica_file import database_key, identity_of, open_replica, replica_path, write_replica

    with Datastore.open(name, fingerprint=fingerprint, database_url=url) as client:
        pg = _percentiles(lambda c: client.lookup(c.tolist()), contexts)
    with connect(url, autocommit=True) as conn:
        info, db = resolve_build(conn, name), database_key(conn)
    folder.mkdir(parents=True, exist_ok=True)
    path, identity = replica_path(folder, db, info), identity_of(info, db)
    try:
        report = write_replica(url, info, path, identity)
        replica = open_replica(path, identity)
        rep = _percentiles(replica.longest, contexts)
        del replica
    finally:
        path.unlink(missing_ok=True)
    return pg[0], pg[1], rep[0], rep[1], report.bytes, report.seconds


def _replays(name: str, url: str, fingerprint: str, vocab: int, prompts: Sequence[Prompt],
             references: Sequence[Sequence[int]], grid: ScalingGrid,
             emit: Callable[[str, str, int, str, float, int, int, float], None]) -> None:
    """Replay every method and shape; ``emit(method, shape, budget, category, accept, steps, prompts, seconds)``
    per category and for ``all``."""
    makers: dict[str, Callable[[DatastoreSource], Drafter]] = {
        "datastore": lambda source: RetrievalDrafter(source, name="datastore", vocab_size=vocab),
        "merged": lambda source: DraftingService(source, vocab_size=vocab)}
    for method in METHODS:
        for shape, budget in grid.shapes():
            source = DatastoreSource(lambda: Datastore.open(name, fingerprint=fingerprint, database_url=url))
            drafter = makers[method](source)
            t0 = time.perf_counter()
            acc: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
            try:
                for p, ref in zip(prompts, references):
                    for key in ("all", p.category):
                        acc[key][2] += 1
                    for s in replay(drafter, p.token_ids, ref, budget, chain=shape == "chain").steps:
                        for key in ("all", p.category):
                            acc[key][0] += s.accepted
                            acc[key][1] += 1
            finally:
                source.close()
            seconds = time.perf_counter() - t0
            for key, (accepted, steps, count) in acc.items():
                emit(method, shape, budget, key, accepted / max(steps, 1), steps, count, seconds)


def datastore_label(prefix: str, point: SizePoint, top_t: int) -> str:
    """The datastore name of one build: ``<prefix>-<corpus>-<size>-t<top-t>`` (``%`` written ``pct``)."""
    return re.sub(r"[^A-Za-z0-9_-]", "", f"{prefix}-{point.corpus}-{point.label.replace('%', 'pct')}-t{top_t}")


def run_size(point: SizePoint, tokenized: Tokenized, largest_tokens: int, eval_set: str, prompts: Sequence[Prompt],
             references: Sequence[Sequence[int]], grid: ScalingGrid, *, url: str, tokenizer, workdir: Path,
             prefix: str, log: Callable[[str], None]) -> tuple[list[BuildRow], list[AcceptRow]]:
    """Build, gate, replay and time the lookups of one size at each of its top-t values.

    Raises:
        evaluation.contamination.Contaminated: when a build's corpus holds a scored prompt.
        datastore.errors.DatastoreError: when Postgres fails.
    """
    corpus = tokenized.corpus
    fingerprint = tokenizer_fingerprint(tokenizer)
    corpus = replace(corpus, tokenizer=(fingerprint, len(tokenizer)))
    builds: list[BuildRow] = []
    accepts: list[AcceptRow] = []
    contexts = _contexts(prompts, references, grid.lookups)
    for top_t_rule, top_t in grid.top_ts(corpus.num_tokens, largest_tokens):
        name = datastore_label(prefix, point, top_t)
        config = replace(point.config, name=name, top_t=top_t, database_url=url)
        got = run_measured(_build, config, corpus)
        result: BuildResult = got.value
        try:
            screen = require_clean(url, name, eval_set, [p.id for p in prompts])
            pg50, pg99, rep50, rep99, rbytes, rsec = lookup_latency(url, name, fingerprint, contexts,
                                                                     workdir / "replicas")
            wall = tokenized.seconds + got.seconds
            row = BuildRow(
                point.corpus, point.label, point.rule, top_t, top_t_rule, corpus.num_documents, corpus.num_tokens,
                corpus.report.get("digest", ""), round(tokenized.seconds, 2), tokenized.cached,
                round(got.seconds, 2), round(wall, 2), round(corpus.num_tokens / max(wall, 1e-9)),
                max(tokenized.peak_tree_bytes, got.peak_tree_bytes),
                max(tokenized.peak_process_bytes, got.peak_process_bytes), json.dumps(result.timings),
                result.num_trees, result.bytes_on_disk, round(result.bytes_per_ngram, 2),
                sum(s["shared_any"] for s in screen.values()), sum(s["contaminated"] for s in screen.values()),
                max(s["max_share"] for s in screen.values()), round(pg50, 4), round(pg99, 4), round(rep50, 4),
                round(rep99, 4), rbytes, round(rsec, 2))
            builds.append(row)
            log(f"{point.corpus} {point.label} top-t {top_t:,} ({top_t_rule}): {corpus.num_tokens:,} tokens, "
                f"build {got.seconds:.0f} s (+ tokenize {tokenized.seconds:.0f} s), {row.tokens_per_s:,} tokens/s, "
                f"peak RSS {row.peak_rss_bytes / 2**30:.2f} GiB, {result.bytes_on_disk / 1e6:,.0f} MB "
                f"({row.bytes_per_ngram:.1f} B/n-gram); lookup p50/p99 Postgres {pg50:.3f}/{pg99:.3f} ms, replica "
                f"{rep50:.4f}/{rep99:.4f} ms; screen: {row.screen_contaminated} contaminated, "
                f"{row.screen_shared_any} share a 13-gram ({', '.join(PARTS[eval_set])})")

            def emit(method: str, shape: str, budget: int, category: str, accept: float, steps: int, count: int,
                     seconds: float, top_t: int = top_t, top_t_rule: str = top_t_rule) -> None:
                accepts.append(AcceptRow(point.corpus, point.label, corpus.num_tokens, top_t, top_t_rule, method,
                                         shape, budget, category, round(accept, 4), steps, count, round(seconds, 2)))
                if category == "all":
                    log(f"  {method:>9} {shape:>5} {budget:>2}: accept {accept:.3f} ({steps} steps, {seconds:.0f} s)")

            _replays(name, url, fingerprint, len(tokenizer), prompts, references, grid, emit)
        finally:
            if not grid.keep:
                with contextlib.suppress(DatastoreNotFound):
                    drop_datastore(url, name)
    return builds, accepts
