"""Optional dependencies: the package's extras, and the error that names the one to install.

The core install (``pip install crest-spec``) holds what lookups and drafting need. Building datastores,
the embedded server, the HF decoding loop, fitting the calibration, the storage study and Spark are
extras (``pyproject.toml``); ``scripts/setup.sh`` installs them all.
"""

from __future__ import annotations

import importlib.util

__all__ = ["require", "require_all", "MissingExtra"]


class MissingExtra(ModuleNotFoundError):
    """A feature's optional dependency is not installed (the message names the extra that brings it)."""


def require(module: str, extra: str, feature: str) -> None:
    """Check that ``module`` can be imported, before a feature that needs it runs.

    Args:
        module: the top-level module to find (``duckdb``, ``torch`` ...).
        extra: the package extra that installs it (``ingest``, ``hf`` ...).
        feature: what needs it, for the message.

    Raises:
        MissingExtra: naming the extra to install.
    """
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(f"{feature} needs {module}, which is not installed: "
                           f"pip install 'crest-spec[{extra}]'", name=module)


def require_all(modules: tuple[str, ...], extra: str, feature: str) -> None:
    """:func:`require` for each of ``modules`` (a package's or command's dependencies, checked on import).

    Raises:
        MissingExtra: naming the first missing module and the extra.
    """
    for module in modules:
        require(module, extra, feature)
