"""The on-disk token stream: every document's token ids, uint32, separated by a reserved id.

The stream lives in one flat file (native little-endian uint32) so that corpora
larger than memory can be counted and scanned through a memory map. Documents
are separated by :data:`SEPARATOR`; no n-gram and no continuation crosses it. Beside it, a names file
(:func:`names_path`) may hold each document's name, one JSON string per line, in stream order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from ingest.continuations import SEPARATOR

__all__ = ["SEPARATOR", "document_names", "names_path", "open_stream"]


def names_path(stream_path: Path) -> Path:
    """The names file beside the stream file ``stream_path`` (``<stream>.names``)."""
    stream_path = Path(stream_path)
    return stream_path.with_name(stream_path.name + ".names")


def document_names(stream_path: Path, indices: Iterable[int]) -> dict[int, str]:
    """The names of the documents at ``indices`` (0-based, stream order) from the names file beside
    ``stream_path``; empty when the stream has none (a stream written without names)."""
    wanted = set(indices)
    path = names_path(stream_path)
    if not wanted or not path.exists():
        return {}
    out: dict[int, str] = {}
    with path.open(encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i in wanted:
                out[i] = json.loads(line)
                if len(out) == len(wanted):
                    break
    return out


class TokenStreamWriter:
    """Append tokenized documents to a stream file.

    Args:
        path: the file to create (truncated if it exists).
        with_names: also write the documents' names beside it (:func:`names_path`).

    Attributes:
        num_documents: documents written.
        num_tokens: token ids written, separators excluded.
        max_token: the largest token id written (-1 before the first).
    """

    def __init__(self, path: Path, with_names: bool = False) -> None:
        self.path = Path(path)
        self._fh = open(self.path, "wb")  # noqa: SIM115 - closed by close() / __exit__
        self._names = open(names_path(self.path), "w", encoding="utf-8") if with_names else None  # noqa: SIM115
        self.num_documents = 0
        self.num_tokens = 0
        self.max_token = -1

    def write(self, documents: list[np.ndarray], names: Sequence[str] | None = None) -> None:
        """Append documents, each a ``[len]`` array of token ids (< 2**32 - 1); a document of no tokens is skipped
        (and so is its name).

        Args:
            documents: the documents' token ids. names: their names (written when the writer keeps names).

        Raises:
            ValueError: when a token id equals or exceeds the separator id, or a writer that keeps names is given
                none (or a different number).
        """
        if self._names is not None and (names is None or len(names) != len(documents)):
            raise ValueError(f"this stream keeps document names: give one per document ({len(documents)})")
        parts: list[np.ndarray] = []
        kept: list[str] = []
        for k, doc in enumerate(documents):
            ids = np.asarray(doc, dtype=np.uint64)
            if len(ids) == 0:
                continue
            if names is not None:
                kept.append(json.dumps(names[k]))
            top = int(ids.max())
            if top >= int(SEPARATOR):
                raise ValueError(f"token id {top} collides with the document separator 2**32-1")
            self.max_token = max(self.max_token, top)
            parts.append(ids.astype(np.uint32))
            parts.append(np.array([SEPARATOR], dtype=np.uint32))
            self.num_documents += 1
            self.num_tokens += len(ids)
        if parts:
            np.concatenate(parts).astype("<u4", copy=False).tofile(self._fh)
        if self._names is not None and kept:
            self._names.write("\n".join(kept) + "\n")

    def close(self) -> None:
        """Flush and close the files."""
        self._fh.close()
        if self._names is not None:
            self._names.close()

    def __enter__(self) -> TokenStreamWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_stream(path: Path) -> np.ndarray:
    """Memory-map a stream file read-only as a ``[num_tokens + num_documents]`` uint32 array."""
    path = Path(path)
    if path.stat().st_size == 0:
        return np.zeros(0, dtype=np.uint32)
    return np.memmap(path, dtype="<u4", mode="r")


def check_corpus(num_tokens: int, max_token: int, vocab_size: int, report: dict) -> None:
    """Refuse a corpus that produced no tokens, or ids beyond the tokenizer's vocabulary.

    Raises:
        ValueError: naming the corpus and what it produced.
    """
    if num_tokens == 0:
        raise ValueError(f"the corpus at {report.get('path')} produced no tokens "
                         f"(malformed: {report.get('malformed')})")
    if max_token >= vocab_size:
        raise ValueError(f"the corpus at {report.get('path')} produced token id {max_token}, beyond the tokenizer's "
                         f"{vocab_size:,} ids")
