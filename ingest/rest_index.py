"""The REST baseline's datastore: a corpus tokenized exactly as for a CREST build, then suffix-sorted.

``python -m ingest rest-index`` writes it to a folder that a decoder memory-maps
(:meth:`datastore.SuffixIndex.load`); by default the folder is
:func:`ingest.suffix_index.default_index_dir`, where ``python -m evaluation
--drafter rest`` looks for it. The index is written to a temporary folder and
renamed into place, so an interrupted run never leaves a half-written index.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from ingest.suffix_index import SuffixIndex
from toolkit.tokenizer import load_tokenizer

from .build import BuildConfig, tokenize_corpus
from .tokens import open_stream


def build_rest_index(config: BuildConfig, out: Path, progress: bool = True) -> tuple[SuffixIndex, dict]:
    """Tokenize ``config``'s corpus and save its REST suffix index in ``out`` (replacing one there).

    Only the corpus fields of ``config`` (source, path, limit, glob, text_field, chat_field,
    tokenizer) are used. The token stream and the index are staged beside ``out`` (same file
    system, so the final rename is atomic).

    Returns:
        ``(index, report)``: the saved index (memory-mapped) and what was read (documents,
        tokens, malformed records by reason, seconds per stage).

    Raises:
        ingest.errors.SourceError: when the corpus cannot be read.
        ValueError: when the corpus yields no tokens.
    """
    out = Path(out)
    tokenizer = load_tokenizer(config.tokenizer)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-", dir=out.parent) as tmp:
        t0 = time.perf_counter()
        corpus = tokenize_corpus(config, tokenizer, Path(tmp) / "tokens.u32", progress)
        t1 = time.perf_counter()
        if corpus.num_tokens == 0:
            raise ValueError(f"the corpus at {corpus.report['path']} produced no tokens "
                             f"(malformed: {corpus.report['malformed']})")
        staged = Path(tmp) / "index"
        SuffixIndex.build(open_stream(corpus.path), len(tokenizer)).save(staged)
        t2 = time.perf_counter()
        if out.exists():
            shutil.rmtree(out)
        staged.rename(out)
    report = corpus.report | {"tokens": corpus.num_tokens, "tokenize_s": round(t1 - t0, 3),
                              "index_s": round(t2 - t1, 3)}
    return SuffixIndex.load(out), report
