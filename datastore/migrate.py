"""Bring the registry schema up to date: ``alembic upgrade head``, run on first use."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine

from .connection import sqlalchemy_url

__all__ = ["alembic_config", "ensure_schema", "engine_for"]

_ROOT = Path(__file__).resolve().parents[1]


def alembic_config() -> Config:
    """The project's Alembic config (``alembic.ini`` and ``migrations/`` at the repository root).

    Raises:
        FileNotFoundError: when the package runs outside its checkout (the
            migrations are not shipped in wheels; install with ``pip install -e .``).
    """
    ini = _ROOT / "alembic.ini"
    if not ini.exists():
        raise FileNotFoundError(f"{ini} not found: run from the repository checkout (pip install -e .)")
    cfg = Config(str(ini))
    cfg.set_main_option("script_location", str(_ROOT / "migrations"))
    return cfg


@lru_cache(maxsize=8)
def engine_for(url: str) -> Engine:
    """One SQLAlchemy engine per libpq URL, created on first use."""
    return create_engine(sqlalchemy_url(url), pool_pre_ping=True)


_upgraded: set[str] = set()


def ensure_schema(url: str) -> Engine:
    """Run ``alembic upgrade head`` once per process and URL; return the engine.

    Concurrent callers are serialized by an advisory lock in ``migrations/env.py``.
    """
    engine = engine_for(url)
    if url not in _upgraded:
        cfg = alembic_config()
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
        _upgraded.add(url)
    return engine
