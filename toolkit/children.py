"""Child processes for background work beside an engine: started at the lowest CPU priority there is, and ended with
their parent, however the parent ends.

An engine's threads often hold every core (vLLM-CPU's OpenMP threads, one per core, wait at a barrier for the slowest
one each layer), so any work at normal priority beside them stalls every forward pass; work in a thread of the
engine's own process also takes its GIL. The live layer's compactions (:mod:`live.compactor`) and the host's
replica writes (:mod:`datastore.replica`) run in such children.

Every child :func:`spawn_idle` starts runs its module through this one as ``python -m toolkit.children PARENT_PID
MODULE ARGS...``: before the module's first line, the child watches process ``PARENT_PID`` (:func:`exit_with_parent`)
and ends within :data:`WATCH_S` seconds of it, whether the parent exited, crashed or was killed with SIGKILL (which
runs no cleanup). A parent that is gone before the child starts is seen at once (its pid is given, not read).
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import threading
import time
from typing import IO

__all__ = ["WATCH_S", "exit_with_parent", "spawn_idle"]

WATCH_S = 0.5
"""Seconds between a child's checks that its parent is alive."""


def spawn_idle(module: str, args: list[str], env: dict[str, str], stdout: IO | None,
               stderr: IO | None) -> subprocess.Popen:
    """Start ``python -m module args...`` as a child that ends with this process (see the module docstring), at the
    lowest CPU priority there is: ``SCHED_IDLE`` (Linux: the scheduler's lowest weight, below ``nice 19``; an engine
    whose threads want every core keeps them, and the child's threads and children inherit it), else ``nice 19``. Set
    the moment the child has started (``Popen`` returns once it runs the command, before its interpreter has run a
    line), so its work is idle.

    Args:
        module: the module the child runs (as ``python -m`` runs it). args: its arguments. env: its environment.
        stdout / stderr: files it writes to (``None``: this process's); its stdin is ``/dev/null``.

    Raises:
        OSError: when it cannot be started.
    """
    argv = [sys.executable, "-m", __name__, str(os.getpid()), module, *args]
    child = subprocess.Popen(argv, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, env=env)
    try:
        os.sched_setscheduler(child.pid, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # no SCHED_IDLE here (or the child is gone already): the lowest nice instead
        try:
            os.setpriority(os.PRIO_PROCESS, child.pid, 19)
        except OSError:
            pass
    return child


def exit_with_parent(parent_pid: int, interval: float = WATCH_S) -> None:
    """End this process (exit status 1, no cleanup) once process ``parent_pid`` is no longer its parent: a parent
    killed with SIGKILL runs no cleanup, and its children would otherwise work (or wait on a job queue) for nothing. A
    daemon thread checks every ``interval`` seconds (> 0); a parent gone already ends this process at once. Also a
    ``ProcessPoolExecutor`` initializer."""
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _run(argv: list[str]) -> None:
    """``PARENT_PID MODULE ARGS...``: watch the parent, then run ``MODULE`` as ``python -m MODULE ARGS...`` would."""
    parent, module, *args = argv
    exit_with_parent(int(parent))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _run(sys.argv[1:])
