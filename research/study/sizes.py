"""The corpus ladder of the corpus-size study: the same kind of text at growing sizes.

- ``code``: this interpreter's Python source, deduplicated by content (``--source code``):
  ``1x``, the standard library alone; ``3x``, the standard library plus a seeded share of site-packages
  (:func:`site_package_subset`); ``all``, the standard library and every site-packages folder (what
  ``python -m ingest build --source code`` reads with no ``--path``).
- ``sharegpt``: the packaged ShareGPT corpus's first 10%, 33% and 100% of records (``--limit``: whole
  records, in file order).

Each size is a :class:`ingest.build.BuildConfig` of the corpus alone (its source, paths and limit), so a size is
rebuilt from the command line exactly (``python -m ingest build --source code --path ...``). What a size holds
depends on what is installed; every build records what it read (the packages and their versions, and a digest of
the file list: :class:`ingest.sources.SourceReport`).
"""

from __future__ import annotations

import os
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ingest.build import BuildConfig
from ingest.files import python_source_roots

__all__ = ["CORPUS_SIZES", "SizePoint", "corpus_ladder", "site_package_subset"]

CORPUS_SIZES = {"code": ("1x", "3x", "all"), "sharegpt": ("10%", "33%", "100%")}
"""The sizes of each corpus, smallest first."""
SHAREGPT_FRACTIONS = (0.10, 0.33, 1.0)


@dataclass(frozen=True)
class SizePoint:
    """One size of a corpus.

    Attributes:
        corpus: ``code`` or ``sharegpt``. label: the size's label (``1x``, ``10%`` ...).
        config: the corpus's source, paths and limit (every other field at its default).
        rule: how the size was chosen, in words (printed and written to the CSV).
    """

    corpus: str
    label: str
    config: BuildConfig
    rule: str


def _py_bytes(root: Path) -> int:
    """Bytes of the ``*.py`` files under ``root`` (a file: its own size when it is one), site-packages folders below it
    left out (the code source reads them only when they are given)."""
    if root.is_file():
        return root.stat().st_size if root.suffix == ".py" else 0
    total = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("site-packages", "dist-packages")]  # as list_files skips them
        total += sum(os.path.getsize(os.path.join(folder, f)) for f in files if f.endswith(".py"))
    return total


def site_package_subset(site_dirs: tuple[Path, ...], want_bytes: int, seed: int) -> tuple[list[Path], int]:
    """A seeded share of site-packages: its top-level entries (packages and modules holding Python source), sorted
    by name, shuffled by ``random.Random(seed)``, taken whole in that order while the ``*.py`` bytes taken stay
    within ``want_bytes`` (an entry that would pass it is skipped, the next ones tried).

    Returns:
        ``(entries, bytes)``: the chosen folders and files, sorted, and their ``*.py`` bytes.
    """
    entries = sorted(p for d in site_dirs for p in d.iterdir()
                     if (p.is_dir() and not p.name.endswith((".dist-info", ".egg-info")) and p.name != "__pycache__")
                     or p.suffix == ".py")
    random.Random(seed).shuffle(entries)
    chosen, taken = [], 0
    for entry in entries:
        size = _py_bytes(entry)
        if size and taken + size <= want_bytes:
            chosen.append(entry)
            taken += size
    return sorted(chosen), taken


def corpus_ladder(corpus: str, *, seed: int = 0, sharegpt_records: int | None = None) -> list[SizePoint]:
    """The sizes of ``corpus`` (:data:`CORPUS_SIZES`), smallest first.

    Args:
        corpus: ``code`` or ``sharegpt``. seed: the seed of the ``3x`` code subset.
        sharegpt_records: the records the whole ShareGPT corpus yields (the fractions' base; its build's
            ``documents``).

    Raises:
        ValueError: for another corpus, for ``sharegpt`` without ``sharegpt_records``, or an interpreter without
            site-packages (``code``).
    """
    if corpus == "sharegpt":
        if not sharegpt_records:
            raise ValueError("the ShareGPT ladder needs the whole corpus's record count (sharegpt_records)")
        return [SizePoint("sharegpt", label, BuildConfig(source="sharegpt", limit=max(1, round(f * sharegpt_records))
                                                         if f < 1 else None),
                          f"the first {f:.0%} of ShareGPT's {sharegpt_records:,} records")
                for label, f in zip(CORPUS_SIZES["sharegpt"], SHAREGPT_FRACTIONS)]
    if corpus != "code":
        raise ValueError(f"unknown corpus {corpus!r}: choose code or sharegpt")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sites = tuple(p for p in python_source_roots() if p.name in ("site-packages", "dist-packages"))
    if not sites:
        raise ValueError("this interpreter has no site-packages folder: the code ladder needs one")
    base = _py_bytes(stdlib)
    subset, taken = site_package_subset(sites, 2 * base, seed)
    return [
        SizePoint("code", "1x", BuildConfig(source="code", path=(stdlib,)),
                  f"the standard library ({base / 1e6:.1f} MB)"),
        SizePoint("code", "3x", BuildConfig(source="code", path=(stdlib, *subset)),
                  f"the standard library + {len(subset)} of site-packages' top-level entries, shuffled with seed "
                  f"{seed} and taken whole up to twice the standard library's bytes ({taken / 1e6:.1f} MB)"),
        SizePoint("code", "all", BuildConfig(source="code", path=(stdlib, *sites)),
                  "the standard library + all of site-packages"),
    ]
