"""Source records -> validated, tokenized documents, one Arrow batch at a time (the Spark job's first kernel).

Runs inside Spark's Python workers (``mapInArrow``) but needs no Spark: it applies the
same per-record checks as the single-node readers (:func:`ingest.sources.flatten_conversation`,
:func:`ingest.sources.check_text`) and the same tokenizer call as :func:`ingest.build.tokenize_source`,
so both engines see the same documents and the same token ids.

Input batches carry the order columns ``o1, o2, o3`` (int64; the record's position in the
source, see :mod:`ingest.spark.sources`) and one payload column that depends on the source:

    sharegpt  ``record`` (string: one element of the file's JSON array, re-serialized by
              :func:`split_json_arrays`), ``reason`` and ``note`` (strings, set on the rows that
              report a file's invalid or cut-off end)
    code      ``path`` (string: a file to read)
    jsonl     ``value`` (binary: one line of a file)
    parquet   ``value`` (string or binary: the text column)

Output batches (:data:`RECORD_SCHEMA`): the order columns, ``reason`` (null for a
document, else why the record was skipped), ``digest`` (16-byte document digest),
``ids`` (``list<int32>`` token ids, null for a skipped record) and ``note`` (a remark on
the source, such as a cut-off file, on a row of its own).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from ..sources import check_text, document_digest, flatten_conversation, truncation_note

RECORD_SCHEMA = pa.schema([("o1", pa.int64()), ("o2", pa.int64()), ("o3", pa.int64()), ("reason", pa.string()),
                           ("digest", pa.binary()), ("ids", pa.list_(pa.int32())), ("note", pa.string())])
RECORD_DDL = "o1 long, o2 long, o3 long, reason string, digest binary, ids array<int>, note string"
ELEMENT_SCHEMA = pa.schema([("o1", pa.int64()), ("o2", pa.int64()), ("o3", pa.int64()), ("record", pa.string()),
                            ("reason", pa.string()), ("note", pa.string())])
ELEMENT_DDL = "o1 long, o2 long, o3 long, record string, reason string, note string"
_TAIL = 1 << 20


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
                extra.append((None, truncation_note(content[-_TAIL:], len(content), exc)))
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


@functools.lru_cache(maxsize=2)
def tokenizer_for(spec: str):
    """The target tokenizer, loaded once per worker process (:func:`toolkit.tokenizer.load_tokenizer`)."""
    from toolkit.tokenizer import load_tokenizer

    return load_tokenizer(spec)


def _sharegpt(batch: pa.RecordBatch, tokenizer) -> list[tuple[str | None, str | None]]:
    out = []
    for raw, reason in zip(batch.column("record").to_pylist(), batch.column("reason").to_pylist()):
        out.append((None, reason) if raw is None else flatten_conversation(json.loads(raw), tokenizer))
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

    Raises:
        ValueError: for an unknown ``source``.
    """
    if source not in ("sharegpt", "code", "jsonl", "parquet"):
        raise ValueError(f"unknown source {source!r}")
    tokenizer = tokenizer_for(tokenizer_spec)
    backend = tokenizer.backend_tokenizer
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)
    for batch in batches:
        if source == "sharegpt":
            parsed = _sharegpt(batch, tokenizer)
        elif source == "code":
            parsed = _code(batch)
        elif source == "jsonl":
            parsed = _jsonl(batch, text_field)
        else:
            parsed = _parquet(batch, text_field)
        notes = batch.column("note").to_pylist() if source == "sharegpt" else [None] * len(parsed)
        keep = [i for i, (text, reason) in enumerate(parsed) if text is not None or reason is not None or notes[i]]
        texts = [parsed[i][0] for i in keep if parsed[i][0] is not None]
        encodings = iter(encode(texts, add_special_tokens=False)) if texts else iter(())
        reasons, digests, ids = [], [], []
        for i in keep:
            text, reason = parsed[i]
            reasons.append(reason)
            digests.append(None if text is None else document_digest(text))
            ids.append(None if text is None else np.asarray(next(encodings).ids, dtype=np.int32))
        take = pa.array(np.asarray(keep, dtype=np.int64))
        columns = [batch.column(c).take(take) for c in ("o1", "o2", "o3")]
        yield pa.RecordBatch.from_arrays(
            columns + [pa.array(reasons, pa.string()), pa.array(digests, pa.binary()),
                       pa.array(ids, pa.list_(pa.int32())),
                       pa.array([notes[i] for i in keep], pa.string())], schema=RECORD_SCHEMA)
