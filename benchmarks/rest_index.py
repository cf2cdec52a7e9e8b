"""REST's datastore, the peer ``rest`` of :mod:`benchmarks.peers`: a corpus token stream and its suffix array, with
REST's retrieval; ``python -m benchmarks.rest_index [--source ...] [--out DIR]`` builds one.

A retrieval backend beside the Postgres datastore (:mod:`datastore.client`): both answer ``lookup(context)`` with a
:class:`datastore.tree.Match`, so a drafter uses either the same way. The corpus is tokenized exactly as for a CREST
build (``python -m ingest build``'s corpus options), then suffix-sorted; the index is written to a temporary folder
and renamed into place, so an interrupted run never leaves a half-written index.

REST (He et al., "REST: Retrieval-Based Speculative Decoding", NAACL 2024, §3.1-3.2) finds the longest suffix of the
current sequence (16 down to 2 tokens) that occurs in the corpus, takes at most 5000 of its occurrences, and drafts the
trie of their next 10 tokens, pruned to 64 nodes by prefix counts. The occurrences are the matching suffix-array range
read from its start, as REST's retriever reads them.

The suffix array is built by libdivsufsort (PyPI ``pydivsufsort``). Its size is counted as REST counts its datastore:
the token array (16-bit ids when the vocabulary fits, else 32-bit) plus the suffix array (32-bit entries below 2**31
tokens, else 64-bit), uncompressed. Documents are separated by one reserved id (``separator`` = vocabulary size), so no
match and no continuation crosses a document boundary.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from datastore.context import TokenIds, check_batch, check_context
from datastore.lookup import Retrieval
from datastore.tree import Match
from ingest.build import BuildConfig, tokenize_corpus
from ingest.cli import check_corpus_paths, corpus_options
from ingest.continuations import SEPARATOR, build_trees
from ingest.tokens import open_stream
from toolkit.tokenizer import cache_dir, load_tokenizer, tokenizer_fingerprint


def default_index_dir(tokenizer, source: str = "sharegpt") -> Path:
    """Where ``python -m benchmarks.rest_index --source SOURCE`` saves its index by default, and where the peers
    look for it: ``<cache>/rest/<source>-<fingerprint[:12]>``."""
    return Path(cache_dir()) / "rest" / f"{source}-{tokenizer_fingerprint(tokenizer)[:12]}"

__all__ = ["SuffixIndex", "build_rest_index", "default_index_dir", "main"]


@dataclass(frozen=True)
class RestParams:
    """REST's retrieval parameters (REST §4.1; the defaults are the paper's).

    Attributes:
        min_len / max_len: shortest and longest suffix of the sequence matched, tokens (2 and 16).
        max_matches: occurrences used per retrieval, from the start of the suffix-array range (5000).
        depth: continuation tokens (10).
        budget: nodes of the retrieved tree (64).

    Raises:
        ValueError: when a value is below 1 or ``max_len < min_len``.
    """

    min_len: int = 2
    max_len: int = 16
    max_matches: int = 5000
    depth: int = 10
    budget: int = 64

    def __post_init__(self) -> None:
        if min(self.min_len, self.max_matches, self.depth, self.budget) < 1 or self.max_len < self.min_len:
            raise ValueError(f"REST parameters out of range: {self}; each must be >= 1 and max_len >= min_len")


class _Column:
    """``column[i]`` = the token ``offset`` places into suffix ``sa[i]`` (-1 past the end): a sorted
    sequence inside a suffix-array range whose suffixes share their first ``offset`` tokens."""

    def __init__(self, tokens: np.ndarray, sa: np.ndarray, offset: int) -> None:
        self.tokens, self.sa, self.offset, self.n = tokens, sa, offset, len(tokens)

    def __getitem__(self, i: int) -> int:
        p = int(self.sa[i]) + self.offset
        return int(self.tokens[p]) if p < self.n else -1

    def __len__(self) -> int:
        return len(self.sa)


class SuffixIndex:
    """A token array and its suffix array, answering REST lookups.

    Attributes:
        tokens: ``[N]`` uint16 (or uint32 for vocabularies past 65,535 ids) token ids,
            documents separated by ``separator``.
        suffix_array: ``[N]`` int32 (int64 from 2**31 tokens): suffix start positions in
            lexicographic order.
        separator: the document separator id (the vocabulary size).
        params: the retrieval parameters :meth:`lookup` uses.
    """

    def __init__(self, tokens: np.ndarray, suffix_array: np.ndarray, separator: int,
                 params: RestParams = RestParams()) -> None:
        if len(tokens) != len(suffix_array):
            raise ValueError(f"tokens ({len(tokens)}) and suffix array ({len(suffix_array)}) differ in length")
        self.tokens = tokens
        self.suffix_array = suffix_array
        self.separator = int(separator)
        self.params = params

    @classmethod
    def build(cls, stream: np.ndarray, vocab_size: int) -> SuffixIndex:
        """Index a token stream.

        Args:
            stream: ``[N]`` uint32 token stream (documents separated by
                :data:`ingest.continuations.SEPARATOR`).
            vocab_size: the tokenizer's vocabulary size (the separator becomes this id).

        Raises:
            ValueError: when a token id is >= ``vocab_size`` or the stream is empty.
        """
        stream = np.asarray(stream)
        if len(stream) == 0:
            raise ValueError("the token stream is empty: nothing to index")
        is_sep = stream == SEPARATOR
        top = int(stream[~is_sep].max(initial=0))
        if top >= vocab_size:
            raise ValueError(f"token id {top} >= vocab_size {vocab_size}: "
                             "index with the tokenizer that made the stream")
        from pydivsufsort import divsufsort

        dtype = np.uint16 if vocab_size < (1 << 16) else np.uint32
        tokens = stream.astype(dtype)
        tokens[is_sep] = vocab_size
        sa = divsufsort(tokens)
        sa = sa.astype(np.int32 if len(tokens) < (1 << 31) else np.int64, copy=False)
        return cls(tokens, sa, vocab_size)

    @property
    def nbytes(self) -> int:
        """Bytes on disk as REST counts them: token array + suffix array, uncompressed."""
        return int(self.tokens.nbytes + self.suffix_array.nbytes)

    @property
    def num_tokens(self) -> int:
        """Tokens indexed (document separators included)."""
        return len(self.tokens)

    def save(self, directory: Path) -> None:
        """Write ``tokens.npy``, ``suffix_array.npy`` and ``meta.json`` into ``directory``."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / "tokens.npy", self.tokens)
        np.save(d / "suffix_array.npy", self.suffix_array)
        (d / "meta.json").write_text(json.dumps({"separator": self.separator, "num_tokens": self.num_tokens}))

    @classmethod
    def load(cls, directory: Path, params: RestParams = RestParams()) -> SuffixIndex:
        """Memory-map an index written by :meth:`save` (``meta.json`` is written last, so a half-written
        index is never loaded).

        Raises:
            FileNotFoundError: when ``directory`` holds no saved index.
        """
        d = Path(directory)
        if not (d / "meta.json").exists():
            raise FileNotFoundError(f"{d} holds no REST suffix index (meta.json missing); build one with "
                                    f"`python -m benchmarks.rest_index --out {d}`")
        meta = json.loads((d / "meta.json").read_text())
        return cls(np.load(d / "tokens.npy", mmap_mode="r"), np.load(d / "suffix_array.npy", mmap_mode="r"),
                   meta["separator"], params)

    def identity(self) -> dict:
        """What this index serves: its size and retrieval parameters."""
        return {"suffix_index_tokens": self.num_tokens, **asdict(self.params)}

    def close(self) -> None:
        """Nothing to release (the memory maps close with the index); here so both backends close alike."""

    def lookup(self, context: TokenIds) -> Match | None:
        """REST's draft for ``context`` under :attr:`params` (see :meth:`retrieve`).

        Returns:
            The matched suffix and its continuation tree (``root_count`` = occurrences used),
            or ``None``.

        Raises:
            datastore.errors.InvalidContext: when ``context`` is not a sequence of token ids of the index's
                vocabulary.
        """
        return self.retrieve(check_context(context, self.separator, self.params.max_len), self.params)

    def lookup_batch(self, contexts: Sequence[TokenIds] | np.ndarray) -> list[Match | None]:
        """:meth:`lookup` for each context (in memory: no round trip to save); raises as :meth:`lookup`."""
        return [self.retrieve(c, self.params) for c in check_batch(contexts, self.separator, self.params.max_len)]

    def candidates_batch(self, contexts: Sequence[TokenIds] | np.ndarray) -> list[list[Match]]:
        """REST's one draft per context as the only candidate (REST chooses by its own longest-suffix rule)."""
        return [[] if m is None else [m] for m in self.lookup_batch(contexts)]

    def retrieve_batch(self, contexts: Sequence[TokenIds] | np.ndarray, back_off: Sequence[bool]) -> list[Retrieval]:
        """A drafting step's lookups (:meth:`datastore.lookup.LookupClient.retrieve_batch`): REST's draft as the one
        candidate of each context (REST does not back off); an index has no live layer."""
        return [Retrieval(c, None) for c in self.candidates_batch(contexts)]

    def stores(self) -> None:
        """No replicas: the index is in this process's memory."""
        return None

    def replica_damaged(self, replica) -> None:
        """Never called: an index hands out no replicas."""

    def find(self, pattern: Sequence[int]) -> tuple[int, int]:
        """The suffix-array range ``[lo, hi)`` of the suffixes that start with ``pattern``."""
        lo, hi = 0, len(self.suffix_array)
        for offset, token in enumerate(pattern):
            col = _Column(self.tokens, self.suffix_array, offset)
            lo = bisect_left(col, int(token), lo, hi)
            hi = bisect_right(col, int(token), lo, hi)
            if lo == hi:
                break
        return lo, hi

    def longest_match(self, context: Sequence[int], min_len: int = 2, max_len: int = 16) -> tuple[int, int, int] | None:
        """The longest suffix of ``context`` (``min_len..max_len`` tokens) that occurs in the corpus.

        A suffix occurs only if every shorter one does, so the length is found by binary search.

        Returns:
            ``(length, lo, hi)`` (its suffix-array range), or ``None`` when not even ``min_len`` tokens match.

        Raises:
            ValueError: when ``min_len < 1`` or ``max_len < min_len``.
        """
        if min_len < 1 or max_len < min_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
        ctx = [int(t) for t in context[-max_len:]]
        low, high, best = min_len, len(ctx), None
        while low <= high:
            k = (low + high) // 2
            lo, hi = self.find(ctx[len(ctx) - k:])
            if hi > lo:
                best, low = (k, lo, hi), k + 1
            else:
                high = k - 1
        return best

    def retrieve(self, context: Sequence[int], params: RestParams) -> Match | None:
        """REST's draft for ``context``: the pruned continuation tree of its longest match.

        Args:
            context: the sequence so far (token ids; only the last ``params.max_len`` are used).
            params: suffix lengths tried, occurrences used (from the start of the range),
                continuation depth and tree budget.

        Returns:
            The :class:`~datastore.tree.Match` (``tree.root_count`` = occurrences used), or ``None``
            when no suffix of ``params.min_len`` tokens occurs or none of its occurrences has a
            continuation.
        """
        found = self.longest_match(context, params.min_len, params.max_len)
        if found is None:
            return None
        k, lo, hi = found
        depth = params.depth
        starts = np.asarray(self.suffix_array[lo:min(hi, lo + params.max_matches)], dtype=np.int64)
        idx = starts[:, None] + k + np.arange(depth)  # [m, depth]
        inside = idx < len(self.tokens)
        windows = np.full((len(starts), depth + 1), SEPARATOR, dtype=np.uint32)  # [m, depth + 1], last col separates
        body = windows[:, :depth]
        body[inside] = self.tokens[idx[inside]]
        body[body == self.separator] = SEPARATOR
        batch = build_trees(windows.ravel(), np.arange(len(starts), dtype=np.int64) * (depth + 1),
                            np.zeros(len(starts), dtype=np.int64), np.array([len(starts)], dtype=np.uint64),
                            0, depth, params.budget)
        tree = batch.tree(0)
        if len(tree) == 0:
            return None
        return Match(tuple(int(t) for t in context[len(context) - k:]), tree)


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


def build_parser() -> argparse.ArgumentParser:
    """``python -m benchmarks.rest_index``'s parser: the corpus options of ``python -m ingest build`` and ``--out``."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.rest_index", parents=[corpus_options(BuildConfig())],
                                 description="Tokenize a corpus as `python -m ingest build` does and save its suffix "
                                             "array (REST's datastore), for `python -m benchmarks.peers`.")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder to write (replaced when it exists; default: <cache>/rest/<source>-<tokenizer "
                         "fingerprint>, where the peers look).")
    return ap


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.rest_index``: build REST's index of a corpus; returns the exit code (0 ok, 2 bad input,
    1 failure)."""
    from ingest.errors import SourceError
    from toolkit.console import EXIT_OK, run

    ap = build_parser()
    args = ap.parse_args(argv)
    check_corpus_paths(ap, args)

    def command() -> int:
        config = BuildConfig(source=args.source, path=None if args.path is None else tuple(args.path),
                             limit=args.limit, glob=args.glob, text_field=args.text_field, chat_field=args.chat_field,
                             tokenizer=args.tokenizer)
        out = args.out or default_index_dir(load_tokenizer(config.tokenizer), config.source)
        index, report = build_rest_index(config, out, progress=not args.quiet)
        malformed = ", ".join(f"{k}: {v}" for k, v in report["malformed"].items()) or "none"
        print(f"REST index of {report['documents']:,} documents, {report['tokens']:,} tokens in {out}: "
              f"{index.nbytes:,} bytes (tokens + suffix array); tokenize {report['tokenize_s']:.1f} s, "
              f"suffix sort {report['index_s']:.1f} s; malformed: {malformed}")
        return EXIT_OK

    return run(command, usage=(SourceError, FileNotFoundError, ValueError))


if __name__ == "__main__":
    raise SystemExit(main())
