"""Our vLLM plugin: the entry point ``crest = serving.plugin:register`` in vLLM's ``vllm.general_plugins`` group
(installed with this package; vLLM loads it in each of its processes, ``vllm.plugins.load_general_plugins``, once per
process; ``VLLM_PLUGINS`` can leave it out). It installs every change we make to vLLM, each from one module that names
the vLLM versions it applies to (``VERSIONS``) and the module it changes (``MODULE``):

- :mod:`serving.runner_hook`: the model runner hands our proposer its batch by request id, and the target's state;
- :mod:`serving.vllm_fixes`: vLLM-CPU's rejection sampler, fixed (on vLLM's CPU platform only).

Each is applied when vLLM imports the module it changes (or at once, where it is imported already), so a process that
never loads it (the API server) pays nothing, and each says once in the log whether it applied. Nothing here raises
into vLLM: a change that cannot apply is logged and left out, and the proposer then drafts without it (keying rows by
their tokens, :mod:`drafting.rows`; without the target's state). A constructor patches nothing.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.util
import logging
import sys
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["applied", "closing_at_exit", "register"]

log = logging.getLogger(__name__)

_APPLIED: dict[str, bool] = {}  # this process's changes, by name: applied or not (told once each)
_OPEN: weakref.WeakSet = weakref.WeakSet()  # proposers closed at exit


def register() -> None:
    """vLLM's plugin entry point: install each change once in this process (see the module docstring)."""
    from . import runner_hook, vllm_fixes

    for name, change in (("runner_hook", runner_hook), ("vllm_fixes", vllm_fixes)):
        if name not in _APPLIED:
            _APPLIED[name] = False
            _when_imported(change.MODULE, functools.partial(_apply, name, change))


def applied(name: str) -> bool:
    """Whether change ``name`` (``"runner_hook"``, ``"vllm_fixes"``) is in place in this process."""
    return _APPLIED.get(name, False)


def closing_at_exit(proposer: Any) -> None:
    """Close ``proposer`` (its ``close()``) when the interpreter exits, unless it is gone or closed before."""
    if not _OPEN:
        atexit.register(_close_all)
    _OPEN.add(proposer)


def _close_all() -> None:
    for proposer in list(_OPEN):
        proposer.close()


def _apply(name: str, change: Any, module: ModuleType) -> None:
    """Apply ``change`` to ``module`` when this vLLM is one it names; say once which it did."""
    import vllm

    version = _version(getattr(vllm, "__version__", ""))
    low, high = change.VERSIONS
    if version is None or not low <= version < high:
        log.warning("crest plugin: %s not applied: vLLM %s is not %d.%d-%d.%d", name, vllm.__version__, *low,
                    high[0], high[1] - 1)
        return
    try:
        why = change.install(module)
    except Exception:  # a vLLM whose insides moved: told, left out; never raised into vLLM's import
        log.exception("crest plugin: %s not applied (vLLM %s): it failed", name, vllm.__version__)
        return
    if why is None:
        _APPLIED[name] = True
        log.info("crest plugin: %s applied (vLLM %s)", name, vllm.__version__)
    else:
        log.info("crest plugin: %s not applied (vLLM %s): %s", name, vllm.__version__, why)


def _version(text: str) -> tuple[int, int] | None:
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


def _when_imported(name: str, then: Callable[[ModuleType], None]) -> None:
    """Call ``then(module)`` once module ``name`` is imported: now, when it is already, else right after its code runs
    (a finder at the front of ``sys.meta_path`` for that name alone, removed once used)."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
        return
    sys.meta_path.insert(0, _AfterImport(name, then))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for module ``name`` it lets the other finders find it and wraps its loader, so that
    ``then`` runs on the module once its code has run."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _Then(spec.loader, self.then)
        return spec


class _Then(importlib.abc.Loader):
    """A loader that runs another's module, then ``then`` on it."""

    def __init__(self, loader: Any, then: Callable[[ModuleType], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def __getattr__(self, name: str):  # the rest of the loader's protocol (get_source, is_package ...) is its own
        return getattr(self.loader, name)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.then(module)
