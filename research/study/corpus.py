"""The study's corpora: tokenized once into a cached stream, cut into prefixes for REST.

A corpus is read through ingest's sources (``sharegpt``: the packaged ShareGPT
JSON; ``code``: the interpreter's standard library and site-packages, deduplicated
by content hash) and tokenized with the target tokenizer into
``<cache>/study/<corpus>-<tokenizer fingerprint>/tokens.u32``; later runs reuse it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.rest_index import SuffixIndex
from ingest.build import BuildConfig, TokenizedCorpus, tokenize_corpus
from ingest.tokens import SEPARATOR, open_stream
from toolkit.tokenizer import cache_dir, tokenizer_fingerprint

CORPORA = ("sharegpt", "code")
EVAL_SETS = {"sharegpt": "spec_bench", "code": "humaneval"}
"""The evaluation set each corpus is scored on (chat: Spec-Bench's MT-Bench categories)."""


@dataclass(frozen=True)
class StudyCorpus:
    """A tokenized study corpus.

    Attributes:
        name: ``sharegpt`` or ``code``. dir: its cache folder.
        tokenized: the stream and its source report. tokenize_s: seconds it took (0 when cached).
        vocab_size: the tokenizer's vocabulary size.
    """

    name: str
    dir: Path
    tokenized: TokenizedCorpus
    tokenize_s: float
    vocab_size: int

    def stream(self) -> np.ndarray:
        """``[num_tokens + num_documents]`` uint32 memory map of the stream."""
        return open_stream(self.tokenized.path)


def prepare_corpus(name: str, tokenizer, tokenizer_spec: str, root: Path | None = None, limit: int | None = None,
                   progress: bool = True) -> StudyCorpus:
    """Tokenize corpus ``name`` (or reuse its cached stream).

    Args:
        name: one of :data:`CORPORA`. tokenizer / tokenizer_spec: the target's tokenizer and its spec.
        root: the study's folder (default ``<cache>/study``). limit: first documents only (default all).
        progress: show a progress bar.

    Raises:
        ValueError: for a corpus name not in :data:`CORPORA`.
        ingest.sources.SourceError: when the corpus cannot be read.
    """
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}: choose one of {', '.join(CORPORA)}")
    fp = tokenizer_fingerprint(tokenizer)[:12]
    folder = Path(root or Path(cache_dir()) / "study") / (f"{name}-{fp}" + (f"-limit{limit}" if limit else ""))
    folder.mkdir(parents=True, exist_ok=True)
    meta, stream = folder / "corpus.json", folder / "tokens.u32"
    if meta.exists() and stream.exists():
        m = json.loads(meta.read_text())
        tok = TokenizedCorpus(stream, m["num_documents"], m["num_tokens"], m["max_token"], m["report"])
        return StudyCorpus(name, folder, tok, 0.0, len(tokenizer))
    t0 = time.perf_counter()
    partial = folder / "tokens.partial"
    tok = tokenize_corpus(BuildConfig(source=name, tokenizer=tokenizer_spec, limit=limit), tokenizer, partial, progress)
    partial.replace(stream)
    tok = TokenizedCorpus(stream, tok.num_documents, tok.num_tokens, tok.max_token, tok.report)
    meta.write_text(json.dumps({"num_documents": tok.num_documents, "num_tokens": tok.num_tokens,
                                "max_token": tok.max_token, "report": tok.report}))
    return StudyCorpus(name, folder, tok, time.perf_counter() - t0, len(tokenizer))


def prefix_end(stream: np.ndarray, fraction: float) -> int:
    """Length of the shortest document-aligned prefix of ``stream`` holding ``fraction`` of it.

    The cut falls just after a document separator (or at the end), so a REST index over
    ``stream[:end]`` holds whole documents only.

    Raises:
        ValueError: when ``fraction`` is not in (0, 1].
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction={fraction}: must be in (0, 1]")
    want = int(np.ceil(fraction * len(stream)))
    if want >= len(stream):
        return len(stream)
    seps = np.flatnonzero(np.asarray(stream[want - 1:]) == SEPARATOR)
    return len(stream) if len(seps) == 0 else want + int(seps[0])


def rest_index(corpus: StudyCorpus, fraction: float) -> tuple[SuffixIndex, float]:
    """The REST suffix index over the first ``fraction`` of the corpus (built once, then memory-mapped).

    Returns:
        ``(index, build_seconds)``; 0 seconds when it was cached.
    """
    folder = corpus.dir / "rest" / f"{fraction:.6f}"
    if (folder / "meta.json").exists():
        return SuffixIndex.load(folder), 0.0
    t0 = time.perf_counter()
    stream = corpus.stream()
    index = SuffixIndex.build(np.asarray(stream[:prefix_end(stream, fraction)]), corpus.vocab_size)
    index.save(folder)
    return SuffixIndex.load(folder), time.perf_counter() - t0
