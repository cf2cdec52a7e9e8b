"""Source records -> validated, tokenized documents, one Arrow batch at a time (the Spark job's first kernel).

Runs inside Spark's Python workers (``mapInArrow``) but needs no Spark: the same per-record checks as the single-node
readers (:func:`ingest.chats.chat_document`, :func:`ingest.sources.check_text`) and the same tokenizer call as
:func:`ingest.build.tokenize_source`; chat files are read by :func:`ingest.chat_files.read_chat_file`.

Input batches carry the order columns ``o1, o2, o3`` (int64; :mod:`ingest.spark.sources`) and the source's payload:
``sharegpt`` a ``record`` string (:func:`split_json_arrays`), ``code`` a ``path``, ``chat`` a ``record`` (a pickled
pair, :func:`split_chat_files`), ``jsonl`` a ``value`` (one line, binary), ``parquet`` a ``value`` (the text column);
``sharegpt`` and ``chat`` rows may carry a ``reason`` and ``note`` instead.

Output batches (:data:`RECORD_SCHEMA`): the order columns, ``reason`` (null for a document, else why the record was
skipped), ``digest`` (16 bytes), ``ids`` (``list<int32>`` token ids, null for a skipped record) and ``note`` (a remark
on the source, on a row of its own). A chat turn skipped in a kept record gets a row of its own after its record's.
"""

from __future__ import annotations

import functools
import json
import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..chat_files import TAIL_BYTES, read_chat_file, truncation_note
from ..chats import SHAREGPT_FIELDS, ChatDocument, chat_document
from ..sources import SOURCES, check_text, document_digest

RECORD_SCHEMA = pa.schema([("o1", pa.int64()), ("o2", pa.int64()), ("o3", pa.int64()), ("reason", pa.string()),
                           ("digest", pa.binary()), ("ids", pa.list_(pa.int32())), ("note", pa.string())])
RECORD_DDL = "o1 long, o2 long, o3 long, reason string, digest binary, ids array<int>, note string"
ELEMENT_SCHEMA = pa.schema([("o1", pa.int64()), ("o2", pa.int64()), ("o3", pa.int64()), ("record", pa.string()),
                            ("reason", pa.string()), ("note", pa.string())])
ELEMENT_DDL = "o1 long, o2 long, o3 long, record string, reason string, note string"
CHAT_SCHEMA = pa.schema([("o1", pa.int64()), ("o2", pa.int64()), ("o3", pa.int64()), ("record", pa.binary()),
                         ("reason", pa.string()), ("note", pa.string())])
CHAT_DDL = "o1 long, o2 long, o3 long, record binary, reason string, note string"


def split_json_arrays(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """ShareGPT files (rows of ``o1``, ``content`` binary: one whole file each) -> one row per array element.

    Streams each file with ijson, as the single-node reader does, so a file cut off part-way
    still yields every complete record, and its end is reported the same way: a row with a
    ``note`` (cut off) or with ``reason`` ``"invalid JSON (rest of file)"`` and a note.
    Output: :data:`ELEMENT_SCHEMA`, ``o3`` numbering the elements of a file.
    """
    import io

    import ijson

    for batch in batches:
        for o1, content in zip(batch.column("o1").to_pylist(), batch.column("content").to_pylist()):
            records: list[str] = []
            extra: list[tuple[str | None, str]] = []
            try:
                for item in ijson.items(io.BytesIO(content), "item", use_float=True):
                    records.append(json.dumps(item, ensure_ascii=False))
            except ijson.IncompleteJSONError as exc:
                extra.append((None, truncation_note(content[-TAIL_BYTES:], len(content), exc)))
            except ijson.JSONError as exc:
                extra.append(("invalid JSON (rest of file)",
                              f"invalid JSON after {len(records)} records ({exc}); the rest was not read"))
            m = len(records)
            reasons = [None] * m + [r for r, _ in extra]
            notes = [None] * m + [nt for _, nt in extra]
            yield pa.RecordBatch.from_arrays(
                [pa.array(np.full(m + len(extra), o1, dtype=np.int64)), pa.array(np.zeros(m + len(extra), np.int64)),
                 pa.array(np.arange(m + len(extra), dtype=np.int64)),
                 pa.array(records + [None] * len(extra), pa.string()),
                 pa.array(reasons, pa.string()), pa.array(notes, pa.string())], schema=ELEMENT_SCHEMA)


def split_chat_files(batches: Iterator[pa.RecordBatch], chat_field: str | None = None,
                     rows_per_batch: int = 1024) -> Iterator[pa.RecordBatch]:
    """Chat files (rows of ``o1``, ``path``: one file each) -> one row per record, as the single-node reader
    meets them (:func:`ingest.chat_files.read_chat_file`, the same function): ``o3`` numbers the file's items.

    Args:
        batches: rows of ``o1`` (the file's position) and ``path``.
        chat_field: ``--chat-field`` (``None``: choose per file as the single-node reader does).
        rows_per_batch: rows per output batch.

    Returns:
        Batches of :data:`CHAT_SCHEMA`: ``record`` is the pickled ``(record, fields)`` pair, null on the
        rows with a ``reason`` (a malformed record) or a ``note`` (a file's damaged end).

    Raises:
        ingest.errors.SourceError: for a Parquet file without a chat column (the driver checks them first).
    """
    def flush(o1: int, start: int, rows: list) -> pa.RecordBatch:
        m = len(rows)
        return pa.RecordBatch.from_arrays(
            [pa.array(np.full(m, o1, dtype=np.int64)), pa.array(np.zeros(m, np.int64)),
             pa.array(np.arange(start, start + m, dtype=np.int64)),
             pa.array([r[0] for r in rows], pa.binary()), pa.array([r[1] for r in rows], pa.string()),
             pa.array([r[2] for r in rows], pa.string())], schema=CHAT_SCHEMA)

    for batch in batches:
        for o1, path in zip(batch.column("o1").to_pylist(), batch.column("path").to_pylist()):
            rows: list[tuple[bytes | None, str | None, str | None]] = []
            start = 0
            for item in read_chat_file(Path(path), chat_field):
                plain = item.reason is None and item.note is None
                payload = pickle.dumps((item.record, item.fields), protocol=pickle.HIGHEST_PROTOCOL) if plain else None
                rows.append((payload, item.reason, item.note))
                if len(rows) >= rows_per_batch:
                    yield flush(o1, start, rows)
                    start += len(rows)
                    rows = []
            if rows:
                yield flush(o1, start, rows)


@functools.lru_cache(maxsize=2)
def tokenizer_for(spec: str):
    """The target tokenizer, loaded once per worker process (:func:`toolkit.tokenizer.load_tokenizer`)."""
    from toolkit.tokenizer import load_tokenizer

    return load_tokenizer(spec)


def _sharegpt(batch: pa.RecordBatch, tokenizer) -> list[ChatDocument]:
    out = []
    for raw, reason in zip(batch.column("record").to_pylist(), batch.column("reason").to_pylist()):
        out.append(ChatDocument(None, reason) if raw is None
                   else chat_document(json.loads(raw), tokenizer, SHAREGPT_FIELDS))
    return out


def _chat(batch: pa.RecordBatch, tokenizer) -> list[ChatDocument]:
    out = []
    for raw, reason in zip(batch.column("record").to_pylist(), batch.column("reason").to_pylist()):
        # the pickle was written by split_chat_files in this job, from the parsed records
        if raw is None:
            out.append(ChatDocument(None, reason))
            continue
        record, fields = pickle.loads(raw)
        out.append(chat_document(record, tokenizer, fields))
    return out


def _code(batch: pa.RecordBatch) -> list[tuple[str | None, str | None]]:
    out: list[tuple[str | None, str | None]] = []
    for path in batch.column("path").to_pylist():
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            out.append((None, "unreadable file"))
            continue
        try:
            out.append(check_text(data.decode("utf-8"), "content"))
        except UnicodeDecodeError:
            out.append((None, "undecodable bytes"))
    return out


def _jsonl(batch: pa.RecordBatch, field_name: str) -> list[tuple[str | None, str | None]]:
    out: list[tuple[str | None, str | None]] = []
    for line in batch.column("value").to_pylist():
        if not line.strip():
            out.append((None, None))  # a blank line is no record
            continue
        try:
            record = json.loads(line)
        except UnicodeDecodeError:
            out.append((None, "undecodable bytes"))
            continue
        except json.JSONDecodeError:
            out.append((None, "invalid JSON"))
            continue
        if not isinstance(record, dict):
            out.append((None, "record is not an object"))
        else:
            out.append(check_text(record.get(field_name), field_name))
    return out


def _parquet(batch: pa.RecordBatch, field_name: str) -> list[tuple[str | None, str | None]]:
    out: list[tuple[str | None, str | None]] = []
    for value in batch.column("value").to_pylist():
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                out.append((None, "undecodable bytes"))
                continue
        out.append(check_text(value, field_name))
    return out


def parse_records(batches: Iterator[pa.RecordBatch], source: str, tokenizer_spec: str,
                  text_field: str = "content") -> Iterator[pa.RecordBatch]:
    """Validate and tokenize source records (see the module docstring for the columns).

    Blank JSONL lines produce no row. Token ids are int32 (a vocabulary past 2**31 - 1 ids is
    refused by the build before this runs).

    Args:
        batches: the source's records (:func:`ingest.spark.sources.read_records`).
        source: the source kind. tokenizer_spec: the target tokenizer (loaded once per worker).
        text_field: the text field of ``jsonl`` and ``parquet``.

    Returns:
        Batches of :data:`RECORD_SCHEMA`.

    Raises:
        ValueError: for an unknown ``source``.
    """
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}")
    tokenizer = tokenizer_for(tokenizer_spec)
    backend = tokenizer.backend_tokenizer
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    for batch in batches:
        parsed: list[ChatDocument]
        if source == "sharegpt":
            parsed = _sharegpt(batch, tokenizer)
        elif source == "chat":
            parsed = _chat(batch, tokenizer)
        else:
            plain = (_code(batch) if source == "code" else _jsonl(batch, text_field) if source == "jsonl"
                     else _parquet(batch, text_field))
            parsed = [ChatDocument(text, reason) for text, reason in plain]
        notes = batch.column("note").to_pylist() if source in ("sharegpt", "chat") else [None] * len(parsed)
        rows: list[tuple[int, str | None, str | None, str | None]] = []  # (record, text, reason, note)
        for i, outcome in enumerate(parsed):
            if outcome.text is not None or outcome.reason is not None or notes[i]:
                rows.append((i, outcome.text, outcome.reason, notes[i]))
            rows.extend((i, None, turn, None) for turn in outcome.skipped)
        texts = [text for _, text, _, _ in rows if text is not None]
        encodings = iter(encode(texts, add_special_tokens=False)) if texts else iter(())
        digests, ids = [], []
        for _, text, _, _ in rows:
            digests.append(None if text is None else document_digest(text))
            ids.append(None if text is None else np.asarray(next(encodings).ids, dtype=np.int32))
        take = pa.array(np.asarray([r[0] for r in rows], dtype=np.int64))
        columns = [batch.column(c).take(take) for c in ("o1", "o2", "o3")]
        yield pa.RecordBatch.from_arrays(
            columns + [pa.array([r[2] for r in rows], pa.string()), pa.array(digests, pa.binary()),
                       pa.array(ids, pa.list_(pa.int32())),
                       pa.array([r[3] for r in rows], pa.string())], schema=RECORD_SCHEMA)
