"""Background children: started at idle priority from their first line, and gone once their parent is."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import pytest

from toolkit.children import spawn_idle


def test_a_child_runs_at_idle_priority_from_its_first_line():
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = spawn_idle([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"], dict(os.environ),
                           out, err)
        code = child.wait()
        out.seek(0)
        policy = int(out.read())
    assert code == 0
    assert policy == os.SCHED_IDLE and os.sched_getscheduler(0) != os.SCHED_IDLE  # the child only, not this process
    with pytest.raises(OSError):
        spawn_idle(["/nonexistent/python"], {}, None, None)


def test_a_child_watching_its_parent_exits_when_the_parent_is_killed(tmp_path):
    """A middle process starts a grandchild that calls ``exit_with_parent``, then is killed with SIGKILL: the
    grandchild is gone within a few of its checks."""
    pid_file = tmp_path / "pid"
    grandchild = ("import os, sys, time; from toolkit.children import exit_with_parent; "
                  f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); exit_with_parent(os.getppid(), 0.05); "
                  "time.sleep(60)")
    middle = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; "
                               f"subprocess.Popen([sys.executable, '-c', {grandchild!r}]); time.sleep(60)"])
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.02)
    pid = int(pid_file.read_text())
    middle.kill()
    middle.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    else:
        raise AssertionError("the grandchild outlived its parent by 10 s")
