"""Reading chat files: one file -> its records, in order, as :class:`ChatItem` (both engines read every chat file
with :func:`read_chat_file`).

Formats: JSON Lines (also read by ``--source jsonl``, through :func:`json_line_items`), ShareGPT JSON arrays
(streamed by ijson; ``--source sharegpt`` reads them through :func:`json_array_items`) and Hugging Face Parquet
(:func:`chat_column`), the JSON ones decompressed as they stream (:func:`ingest.files.open_corpus_file`). A file
cut off or corrupt keeps the records before the damage and ends with a note (:func:`truncation_note` for a
ShareGPT array cut off part-way). The records are rendered by :func:`ingest.chats.chat_document`.

A record that cannot be read is reported by reason:

    invalid JSON                  a JSON line that does not parse
    invalid JSON (rest of file)   a JSON array (ShareGPT) that stops parsing; the rest of the file is not read
    undecodable bytes             bytes that are not UTF-8
"""

from __future__ import annotations

import io
import json
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import ijson
import pyarrow as pa
import pyarrow.parquet as pq

from .chats import CHAT_FIELDS
from .errors import SourceError
from .files import STREAM_ERRORS, open_corpus_file

_ARRAY_FIELDS = ("conversations", "messages")  # a ShareGPT JSON array: ShareGPT's field first
TAIL_BYTES = 1 << 20
"""Bytes of a cut-off file's end read to describe the partial record lost (:func:`truncation_note`)."""


class ChatItem(NamedTuple):
    """One thing a chat file holds (:func:`read_chat_file`): a record, or a reason, or a note.

    Attributes:
        record: the parsed record (meaningful when ``reason`` and ``note`` are ``None``).
        fields: the chat fields to read it with (:func:`ingest.chats.chat_document`).
        reason: a malformed record, counted by this reason. note: a remark on the file (a cut-off end).
    """

    record: Any = None
    fields: tuple[str, ...] = CHAT_FIELDS
    reason: str | None = None
    note: str | None = None


def _kind(file: Path) -> str:
    """How a compressed or plain file is described in a note."""
    return "gzip file" if file.name.endswith(".gz") else "zstd file" if file.name.endswith(".zst") else "file"


def _damage_note(file: Path, records: int, exc: BaseException) -> str:
    return (f"{file}: the {_kind(file)} is cut off or corrupt ({type(exc).__name__}: {exc}); the {records:,} "
            "records before the damage were read, the rest of the file was not")


def truncation_note(tail: bytes, size: int, exc: Exception) -> str:
    """Describe the partial record at the end of a cut-off ShareGPT file from its last bytes
    (``tail``, up to 1 MiB) and its ``size`` in bytes.

    Args:
        tail: the file's last bytes. size: the file's size (decompressed). exc: the parser's error.

    Returns:
        The note (the partial record's id and where it starts, when they can be found).
    """
    tail_len = len(tail)
    start = tail.rfind(b'{\n    "id"')
    if start < 0:
        start = tail.rfind(b'{"id"')
    if start < 0:
        return f"file ends part-way ({exc}); the partial record at its end was dropped"
    lost = tail_len - start
    ident = tail[start:start + 200].split(b'"id"', 1)[1].split(b'"')[1].decode("utf-8", "replace")
    return (f"file is cut off: the partial record id={ident!r} (its last {lost:,} bytes, from byte "
            f"{size - lost:,}) was dropped; every complete record before it was recovered")


class _Tail:
    """A binary stream that keeps its last bytes read and their total (to describe a cut-off end). Each read
    returns what one read of the stream below gives (``read1``), so that a damaged compressed stream raises
    only after every byte decompressed before the damage was handed on."""

    def __init__(self, stream: io.BufferedIOBase) -> None:
        self._stream = stream
        self._read = getattr(stream, "read1", stream.read)
        self._chunks: deque[bytes] = deque()
        self._kept = 0
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._read(n)
        if data:
            self.size += len(data)
            self._chunks.append(data)
            self._kept += len(data)
            while self._kept - len(self._chunks[0]) >= TAIL_BYTES:
                self._kept -= len(self._chunks.popleft())
        return data

    def tail(self) -> bytes:
        return b"".join(self._chunks)[-TAIL_BYTES:]


def json_array_items(file: Path, stream: io.BufferedIOBase, fields: tuple[str, ...]) -> Iterator[ChatItem]:
    """The elements of a JSON array (ShareGPT), streamed by ijson: a file cut off part-way yields every complete
    record and a note on the partial one (:func:`truncation_note`); invalid JSON ends the file with a reason and a
    note; a damaged compressed stream ends it with a note.

    Args:
        file: the file the stream reads (named in a note). stream: its bytes (:func:`ingest.files.open_corpus_file`).
        fields: the chat fields the records are read with (:attr:`ChatItem.fields`).

    Returns:
        An iterator of :class:`ChatItem`, one per element, then at most one with a reason or note.
    """
    tail = _Tail(stream)
    records = 0
    try:
        for record in ijson.items(tail, "item"):
            records += 1
            yield ChatItem(record, fields)
    except GeneratorExit:  # closed part-way (a reader that stopped early), perhaps as the interpreter exits: the
        raise  # clauses below read module globals that may be gone by then
    except ijson.IncompleteJSONError as exc:
        yield ChatItem(note=truncation_note(tail.tail(), tail.size, exc))
    except ijson.JSONError as exc:
        yield ChatItem(reason="invalid JSON (rest of file)",
                       note=f"invalid JSON after {records} records ({exc}); the rest was not read")
    except STREAM_ERRORS as exc:
        yield ChatItem(note=_damage_note(file, records, exc))


def json_line_items(file: Path, stream: io.BufferedIOBase, fields: tuple[str, ...]) -> Iterator[ChatItem]:
    """The records of a JSON Lines stream; blank lines are no record. A line that does not parse is an item with a
    reason (``invalid JSON``, ``undecodable bytes``); a damaged compressed stream ends with a note.

    Args:
        file: the file the stream reads (named in a note). stream: its bytes (:func:`ingest.files.open_corpus_file`).
        fields: the fields the records are read with (:attr:`ChatItem.fields`: the chat fields, or the text field of
            ``--source jsonl``).

    Returns:
        An iterator of :class:`ChatItem`, one per non-blank line, then at most one with a note.
    """
    records = 0
    try:
        for line in stream:
            if not line.strip():
                continue
            records += 1
            try:
                record = json.loads(line)
            except UnicodeDecodeError:
                yield ChatItem(reason="undecodable bytes")
                continue
            except json.JSONDecodeError:
                yield ChatItem(reason="invalid JSON")
                continue
            yield ChatItem(record, fields)
    except STREAM_ERRORS as exc:
        yield ChatItem(note=_damage_note(file, records, exc))


def _first_byte(stream: io.BufferedIOBase) -> bytes:
    """The first non-space byte of a buffered stream, left unread (the spaces before it are consumed)."""
    while True:
        head = stream.peek(1)[:1]  # type: ignore[attr-defined]
        if not head or not head.isspace():
            return head
        stream.read(1)


def is_parquet(file: Path) -> bool:
    """Whether a chat file is read as Parquet (:func:`read_chat_file`).

    Args:
        file: a chat file.

    Returns:
        ``True`` for a file named ``*.parquet``.
    """
    return file.name.endswith(".parquet")


def chat_column(file: Path, chat_field: str | None = None) -> str:
    """The column a chat Parquet file is read from: ``chat_field``, else the first of :data:`CHAT_FIELDS` it has.

    Args:
        file: a Parquet file. chat_field: ``--chat-field`` (``None``: choose).

    Returns:
        The column's name.

    Raises:
        SourceError: when the file has no such column (naming the columns it has and ``--chat-field``), or the
            column is not a list of turns.
    """
    schema = pq.read_schema(file)
    wanted = (chat_field,) if chat_field else CHAT_FIELDS
    column = next((c for c in wanted if c in schema.names), None)
    if column is None:
        raise SourceError(f"{file} has no column {' or '.join(map(repr, wanted))} (columns: {schema.names}); "
                          "name the chat column with --chat-field")
    kind = schema.field(column).type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        raise SourceError(f"{file}: column {column!r} is {kind}, not a list of turns; name the chat column with "
                          "--chat-field")
    return column


def _parquet_items(file: Path, chat_field: str | None) -> Iterator[ChatItem]:
    column = chat_column(file, chat_field)
    records = 0
    try:
        for batch in pq.ParquetFile(file).iter_batches(columns=[column], batch_size=256):
            for value in batch.column(0).to_pylist():
                records += 1
                yield ChatItem({column: value}, (column,))
    except (pa.ArrowException, OSError) as exc:
        yield ChatItem(note=_damage_note(file, records, exc))


def read_chat_file(file: Path, chat_field: str | None = None) -> Iterator[ChatItem]:
    """The records of one chat file, in order (both engines read every chat file with this).

    ``*.parquet`` is Hugging Face Parquet (:func:`chat_column`); a ``.json`` file (also ``.json.gz``,
    ``.json.zst``) whose first non-space byte is ``[`` is a ShareGPT array; anything else is JSON Lines.
    A cut-off or corrupt file ends with a :class:`ChatItem` holding a note.

    Args:
        file: the file. chat_field: ``--chat-field`` (``None``: :data:`CHAT_FIELDS`; ShareGPT arrays look
            for ``conversations`` first).

    Returns:
        An iterator of :class:`ChatItem`.

    Raises:
        SourceError: for a Parquet file without a chat column (see :func:`chat_column`).
        OSError: when the file cannot be opened.
    """
    if is_parquet(file):
        yield from _parquet_items(file, chat_field)
        return
    base = file.name.removesuffix(".gz") if file.name.endswith(".gz") else file.name.removesuffix(".zst")
    with open_corpus_file(file) as stream:
        try:
            first = _first_byte(stream)
        except STREAM_ERRORS as exc:
            yield ChatItem(note=_damage_note(file, 0, exc))
            return
        if base.endswith(".json") and first == b"[":
            yield from json_array_items(file, stream, (chat_field,) if chat_field else _ARRAY_FIELDS)
        else:
            yield from json_line_items(file, stream, (chat_field,) if chat_field else CHAT_FIELDS)
