"""The storage study: accept length against bytes on disk, REST vs CREST vs merged.

For one corpus the study measures, through the replay simulator (exact for greedy
decoding), the accept length on the corpus's evaluation set of:

- ``rest``: REST over growing prefixes of the corpus (suffix array, bytes as REST counts them);
- ``crest-single``: CREST datastores of one n-gram length over a top-t grid (CREST §5.3);
- ``crest-combined``: an equal top-t for every n <= m (CREST §5.4);
- ``merged``: each combined datastore merged by our drafter (:class:`drafting.service.DraftingService`: with each
  request's own tokens and the outputs of the requests replayed before it);
- ``trie``: the N-Gram-Trie paper's drafter alone (0 bytes: a reference line).

Every point's cost (build and replay seconds) is recorded with it.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from benchmarks.peer_drafters import RetrievalDrafter
from datastore import Datastore
from datastore.admin.catalog import drop_datastore
from datastore.errors import DatastoreNotFound
from drafting import DatastoreSource, Drafter, DraftingService
from evaluation.contamination import require_clean
from evaluation.prompts import Prompt
from evaluation.simulate import replay
from research.drafters import Trie
from toolkit.tokenizer import tokenizer_fingerprint

from .corpus import StudyCorpus, rest_index
from .crest import CrestPoint, effective_sizes, full_build, materialize
from .overlap import prompt_overlaps

_K = 1000


@dataclass(frozen=True)
class StudyGrid:
    """The points of one study (the defaults are the default grid: 17 min for chat and 31 min for code
    on a clean cache on a 2-core CPU, references included).

    Attributes:
        combined_top_t: top-t values of the combined datastores (every n <= m), each >= 1.
        single_top_t: top-t values of the single-n datastores.
        single_n: the n of the single-n lines, each in 1..8.
        combined_m: the m of the combined lines (CREST §5.4 varies it), each in 2..8; the
            largest is the default datastore's configuration and the one the merged drafter drafts from.
        rest_fractions: corpus prefixes indexed for REST, each in (0, 1].
        budget: draft tree nodes verified per step, 1..1024 (REST and CREST trees hold <= 64).
        merged: also replay each combined datastore with the merged drafter (its own tokens and outputs too).

    Raises:
        ValueError: when a value is out of range.
    """

    combined_top_t: tuple[int, ...] = tuple(x * _K for x in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
    single_top_t: tuple[int, ...] = tuple(x * _K for x in (1, 4, 16, 64, 256))
    single_n: tuple[int, ...] = (1, 2, 3, 4, 5)
    combined_m: tuple[int, ...] = (2, 3, 5)
    rest_fractions: tuple[float, ...] = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0)
    budget: int = 64
    merged: bool = True

    def __post_init__(self) -> None:
        checks = [
            (all(t >= 1 for t in self.combined_top_t + self.single_top_t), "every top-t must be >= 1"),
            (all(2 <= m <= 8 for m in self.combined_m), f"combined m={self.combined_m}: each must be in 2..8"),
            (all(1 <= n <= 8 for n in self.single_n), f"single n={self.single_n}: each must be in 1..8"),
            (bool(self.combined_m) or not self.combined_top_t, "combined top-t values need at least one m"),
            (all(0.0 < f <= 1.0 for f in self.rest_fractions), "REST fractions must be in (0, 1]"),
            (1 <= self.budget <= 1024, f"budget={self.budget}: must be in 1..1024"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def max_n(self) -> int:
        """The largest n any point keeps (the full build's ``max_n``)."""
        return max(self.combined_m + self.single_n, default=1)

    @property
    def merged_m(self) -> int:
        """The m whose combined datastores are also drafted from by the merged drafter (the largest)."""
        return max(self.combined_m, default=0)

    @property
    def largest_top_t(self) -> int:
        """The top-t of the full build every CREST point is cut from."""
        return max(self.combined_top_t + self.single_top_t, default=1)

    def crest_points(self) -> list[CrestPoint]:
        """Combined points, then single-n points, smallest first."""
        combined = [CrestPoint(tuple(range(1, m + 1)), t) for m in sorted(self.combined_m)
                    for t in sorted(self.combined_top_t)]
        single = [CrestPoint((n,), t) for n in self.single_n for t in sorted(self.single_top_t)]
        return combined + single


@dataclass
class StudyRow:
    """One measured point (a CSV row).

    Attributes:
        corpus / eval_set: what was indexed and what was scored.
        method: rest | crest-single | crest-combined | merged | trie.
        n: the single n, or m for combined/merged (0 for rest and trie).
        top_t: n-grams per n (0 for rest and trie). fraction: REST's corpus share (0 otherwise).
        corpus_tokens: tokens indexed by REST (0 otherwise). ngrams: CREST rows (0 otherwise).
        bytes: bytes on disk (REST: tokens + suffix array; CREST: table + TOAST + hash index).
        accept_length: tokens committed per verification step (bonus included), all prompts pooled.
        steps / prompts: verification steps and prompts replayed.
        mean_tree_nodes: mean nodes per stored tree (CREST), or per retrieved tree (REST).
        build_s / replay_s: seconds this point cost (0 build when reused from the cache).
    """

    corpus: str
    eval_set: str
    method: str
    n: int
    top_t: int
    fraction: float
    corpus_tokens: int
    ngrams: int
    bytes: int
    accept_length: float
    steps: int
    prompts: int
    mean_tree_nodes: float
    build_s: float
    replay_s: float
    per_n_nodes: dict = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Replayed:
    """A drafter replayed over a prompt set, pooled.

    Attributes:
        accept_length: tokens committed per verification step (bonus included).
        steps: verification steps. seconds: replay wall time.
        mean_drafted: mean draft nodes over the steps that drafted anything (for REST at the
            study's budget of 64, REST's own tree limit: the mean retrieved tree size).
    """

    accept_length: float
    steps: int
    seconds: float
    mean_drafted: float


def _same(value):
    """``value`` itself (an already open backend handed to :class:`DatastoreSource` as its opener)."""
    return value


def replay_accept_length(drafter, prompts: Sequence[Prompt], references: Sequence[Sequence[int]],
                         budget: int) -> Replayed:
    """Replay every prompt against its reference and pool the steps."""
    t0 = time.perf_counter()
    accepted = steps = drafted = drafting = 0
    for p, ref in zip(prompts, references):
        for s in replay(drafter, p.token_ids, ref, budget).steps:
            accepted += s.accepted
            steps += 1
            drafted += s.drafted
            drafting += s.drafted > 0
    return Replayed(accepted / max(steps, 1), steps, time.perf_counter() - t0, drafted / max(drafting, 1))


def _log_overlap(index, prompts: Sequence[Prompt], log: Callable[[str], None]) -> None:
    """Report how much of the evaluation prompts occurs verbatim in the corpus (a contamination check)."""
    t0 = time.perf_counter()
    found = sorted(prompt_overlaps(index, prompts), key=lambda o: o.run)
    if not found:
        return
    worst = found[-1]
    log(f"evaluation overlap with the corpus ({time.perf_counter() - t0:.0f} s): longest verbatim run of prompt "
        f"content per prompt, median {found[len(found) // 2].run} tokens, max {worst.run} of {worst.length} "
        f"({worst.prompt_id})")
    suspect = [o for o in found if o.run >= 32 and o.run >= o.length / 2]
    if suspect:
        log(f"[red]possible contamination: {len(suspect)} prompts have half or more of their content in the corpus "
            f"verbatim: {', '.join(o.prompt_id for o in suspect[:10])}[/red]")


def run_corpus(corpus: StudyCorpus, eval_set: str, prompts: Sequence[Prompt], references: Sequence[Sequence[int]],
               grid: StudyGrid, *, url: str, tokenizer, tokenizer_spec: str,
               report: Callable[[StudyRow], None], log: Callable[[str], None] = lambda text: None,
               prefix: str = "study", progress: bool = True) -> list[StudyRow]:
    """Measure every point of ``grid`` on one corpus; ``report`` is called as each row is done and
    ``log`` with one-off costs (the full CREST build). Datastores are named ``<prefix>-<corpus>-full``
    (kept for later runs) and ``<prefix>-<corpus>-point`` (each point in turn, dropped at the end).

    Raises:
        datastore.connection.DatabaseUnavailable: when Postgres is unreachable.
    """
    rows: list[StudyRow] = []
    fingerprint = tokenizer_fingerprint(tokenizer)
    budget = grid.budget

    def emit(row: StudyRow) -> None:
        rows.append(row)
        report(row)

    def base(method: str) -> dict:
        return {"corpus": corpus.name, "eval_set": eval_set, "method": method, "prompts": len(prompts)}

    vocab = len(tokenizer)
    r = replay_accept_length(Trie(vocab_size=vocab), prompts, references, budget)
    emit(StudyRow(**base("trie"), n=0, top_t=0, fraction=0.0, corpus_tokens=0, ngrams=0, bytes=0,
                  accept_length=r.accept_length, steps=r.steps, mean_tree_nodes=0.0, build_s=0.0, replay_s=r.seconds))

    for fraction in sorted(grid.rest_fractions):
        index, build_s = rest_index(corpus, fraction)
        drafter = RetrievalDrafter(DatastoreSource(functools.partial(_same, index)), name="rest", vocab_size=vocab)
        r = replay_accept_length(drafter, prompts, references, budget)
        emit(StudyRow(**base("rest"), n=0, top_t=0, fraction=fraction, corpus_tokens=index.num_tokens, ngrams=0,
                      bytes=index.nbytes, accept_length=r.accept_length, steps=r.steps,
                      mean_tree_nodes=r.mean_drafted, build_s=build_s, replay_s=r.seconds))

    if grid.rest_fractions:
        _log_overlap(rest_index(corpus, max(grid.rest_fractions))[0], prompts, log)
    points = grid.crest_points()
    if not points:
        return rows
    full = full_build(corpus, grid.largest_top_t, grid.max_n, url=url, tokenizer=tokenizer,
                      tokenizer_spec=tokenizer_spec, prefix=prefix, progress=progress)
    require_clean(url, full.name, eval_set, [p.id for p in prompts])  # refuses a corpus that holds a scored prompt
    log(f"CREST full build {full.name} (top-t {full.top_t:,}, n <= {full.max_n}): "
        + (f"{full.seconds:.0f} s" if full.seconds else "reused") + "; each point below is a server-side copy of it")
    name = f"{prefix}-{corpus.name}-point"
    seen: set[tuple] = set()
    try:
        for point in points:
            sizes = effective_sizes(full, point)
            if (point.ns, sizes) in seen:  # every n of the point ran out of n-grams: same datastore as before
                continue
            seen.add((point.ns, sizes))
            made = materialize(full, point, name, url=url, tokenizer_spec=tokenizer_spec, fingerprint=fingerprint)
            nodes = sum(k * m for k, m in made.per_n.values()) / max(made.ngrams, 1)
            kinds: list[tuple[str, Callable[[DatastoreSource], Drafter]]] = [
                (point.method, lambda source: RetrievalDrafter(source, name="datastore", vocab_size=vocab))]
            if grid.merged and point.method == "crest-combined" and max(point.ns) == grid.merged_m:
                kinds.append(("merged", lambda source: DraftingService(source, vocab_size=vocab)))
            for method, make in kinds:
                source = DatastoreSource(lambda: Datastore.open(name, fingerprint=fingerprint, database_url=url))
                try:
                    r = replay_accept_length(make(source), prompts, references, budget)
                finally:
                    source.close()
                emit(StudyRow(**base(method), n=max(point.ns), top_t=point.top_t, fraction=0.0, corpus_tokens=0,
                              ngrams=made.ngrams, bytes=made.bytes, accept_length=r.accept_length, steps=r.steps,
                              mean_tree_nodes=nodes, build_s=made.seconds if method != "merged" else 0.0,
                              replay_s=r.seconds, per_n_nodes={n: m for n, (_, m) in made.per_n.items()}))
    finally:
        with contextlib.suppress(DatastoreNotFound):  # nothing was materialized
            drop_datastore(url, name)
    return rows
