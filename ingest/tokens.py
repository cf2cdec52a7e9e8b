"""The on-disk token stream: every document's token ids, uint32, separated by a reserved id.

The stream lives in one flat file (native little-endian uint32) so that corpora
larger than memory can be counted and scanned through a memory map. Documents
are separated by :data:`SEPARATOR`; no n-gram and no continuation crosses it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ingest.continuations import SEPARATOR

__all__ = ["SEPARATOR", "open_stream"]


class TokenStreamWriter:
    """Append tokenized documents to a stream file.

    Args:
        path: the file to create (truncated if it exists).

    Attributes:
        num_documents: documents written.
        num_tokens: token ids written, separators excluded.
        max_token: the largest token id written (-1 before the first).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fh = open(self.path, "wb")  # noqa: SIM115 - closed by close() / __exit__
        self.num_documents = 0
        self.num_tokens = 0
        self.max_token = -1

    def write(self, documents: list[np.ndarray]) -> None:
        """Append documents, each a ``[len]`` array of token ids (< 2**32 - 1).

        Raises:
            ValueError: when a token id equals or exceeds the separator id.
        """
        parts: list[np.ndarray] = []
        for doc in documents:
            ids = np.asarray(doc, dtype=np.uint64)
            if len(ids) == 0:
                continue
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

    def close(self) -> None:
        """Flush and close the file."""
        self._fh.close()

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
