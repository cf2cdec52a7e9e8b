"""Command-line options shared by every entry point (argparse parents), declared once."""

from __future__ import annotations

import argparse

__all__ = ["database_options"]


def database_options() -> argparse.ArgumentParser:
    """``--database-url``: where the datastores live (a parent parser for ``argparse``)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--database-url", default=None, metavar="URL",
                   help="libpq URL, e.g. postgresql://user@host:5432/db (default: $DATABASE_URL, else an embedded "
                        "PostgreSQL in a per-user data directory)")
    return p
