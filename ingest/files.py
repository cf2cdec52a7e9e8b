"""Corpus files: finding them (directories, glob patterns, the interpreter's own source) and opening them.

:func:`list_files` turns the paths a source is given into the files it reads, in a stable order (both
engines read the same list); :func:`open_corpus_file` opens one as a byte stream, decompressing ``*.gz``
(gzip) and ``*.zst`` (zstandard) files as they are read. A damaged compressed file raises one of
:data:`STREAM_ERRORS` while it is read.
"""

from __future__ import annotations

import glob as globbing
import gzip
import io
import os
import zlib
from pathlib import Path
from typing import Any

import zstandard

from .errors import SourceError

COMPRESSED = (".gz", ".zst")
"""The suffixes of the compressed files :func:`open_corpus_file` decompresses."""
JSONL_PATTERNS = tuple(f"**/*{ext}{c}" for ext in (".jsonl", ".json") for c in ("", *COMPRESSED))
"""The files a ``jsonl`` directory holds."""
CHAT_PATTERNS = (*JSONL_PATTERNS, "**/*.parquet")
"""The files a ``chat`` directory holds."""
_GLOB_CHARS = frozenset("*?[")
STREAM_ERRORS = (EOFError, OSError, zlib.error, zstandard.ZstdError)
"""What reading a damaged stream raises: gzip (EOFError when cut off, zlib.error, BadGzipFile), zstd, a failing
read."""
_SITE_DIRS = {"site-packages", "dist-packages"}


class _ZstdReader(io.RawIOBase):
    """A zstandard file, decompressed as it is read (every frame in turn); a file that ends part-way
    through a frame raises :class:`EOFError` at its end instead of passing for a shorter file."""

    def __init__(self, raw: io.BufferedIOBase, chunk: int = 1 << 17) -> None:
        super().__init__()
        self._raw = raw
        self._chunk = chunk
        self._dctx = zstandard.ZstdDecompressor()
        self._frame: Any = None
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def _feed(self, data: bytes) -> bytes:
        out = []
        while data:
            if self._frame is None or self._frame.eof:
                self._frame = self._dctx.decompressobj()
            out.append(self._frame.decompress(data))
            data = self._frame.unused_data if self._frame.eof else b""
        return b"".join(out)

    def readinto(self, buffer) -> int:
        while not self._pending:
            data = self._raw.read(self._chunk)
            if not data:
                if self._frame is not None and not self._frame.eof:
                    raise EOFError("zstd stream ended before the end of its frame")
                return 0
            self._pending = memoryview(self._feed(data))
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def open_corpus_file(file: Path) -> io.BufferedIOBase:
    """Open ``file`` for reading its bytes, decompressed when it is named ``*.gz`` (gzip) or ``*.zst`` (zstandard):
    a buffered binary stream (``peek``, line iteration), decompressed as it is read, never whole.

    Args:
        file: a file, or a stream such as a named pipe.

    Returns:
        The open stream (close it, or use it in a ``with``).

    Raises:
        OSError: when the file cannot be opened. Reading a damaged compressed file raises
            :class:`EOFError` (cut off), :class:`OSError`, :class:`zlib.error` or :class:`zstandard.ZstdError`.
    """
    if file.name.endswith(".gz"):
        return gzip.open(file, "rb")
    raw = open(file, "rb")  # noqa: SIM115 - the caller closes the stream
    if file.name.endswith(".zst"):
        return io.BufferedReader(_ZstdReader(raw), buffer_size=1 << 17)
    return raw


def is_glob_pattern(path: Path | str) -> bool:
    """Whether ``path`` holds glob characters (``*``, ``?``, ``[``).

    Args:
        path: a path as given.

    Returns:
        ``True`` for a pattern such as ``logs/*.jsonl.gz``.
    """
    return bool(_GLOB_CHARS & set(str(path)))


def glob_matches(pattern: Path | str) -> list[Path]:
    """The paths a glob pattern matches (``**`` spans folders), in sorted order.

    Args:
        pattern: the pattern (``~`` expanded).

    Returns:
        The matching files and directories (none: an empty list).
    """
    return sorted(Path(p) for p in globbing.glob(os.path.expanduser(str(pattern)), recursive=True))


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
    directory (a file, or a named pipe streaming a corpus) is read as it is. A path that does not exist but holds
    glob characters is a glob pattern (for ``--source chat``): its matches are read in sorted order, each as a
    path given here.

    A root's site-packages subfolder is skipped unless it is itself one of ``paths``.

    Args:
        paths: files, directories or glob patterns. patterns: the file patterns to look for in a directory.

    Returns:
        The files, in order.

    Raises:
        SourceError: when a path does not exist, a pattern matches nothing, or nothing matches.
    """
    given: list[Path] = []
    for path in paths:
        if path.exists():
            given.append(path)
        elif is_glob_pattern(path):
            matches = glob_matches(path)
            if not matches:
                raise SourceError(f"--path {path} matches no file or directory")
            given.extend(matches)
        else:
            raise SourceError(f"--path {path} does not exist")
    roots = {p.resolve() for p in given}
    found: dict[Path, None] = {}
    for path in given:
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
