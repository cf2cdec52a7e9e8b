"""Background children: started at idle priority from their first line, and gone once their parent is, however the
parent ends (SIGKILL included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

from support import REPO, alive_after
from toolkit.children import spawn_idle

PROBE = """import os, sys, time
print(os.sched_getscheduler(0), *sys.argv[1:], flush=True)
time.sleep(float(os.environ.get("PROBE_SLEEP", "0")))
"""


def _probe_env(folder: Path, sleep: float = 0.0) -> dict[str, str]:
    """An environment whose ``python -m probe`` prints its scheduling policy and arguments, then sleeps."""
    (folder / "probe.py").write_text(PROBE)
    path = os.pathsep.join([str(folder), str(REPO)])
    return dict(os.environ, PYTHONPATH=path, PROBE_SLEEP=str(sleep))


def test_a_child_runs_its_module_at_idle_priority_from_its_first_line(tmp_path):
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = spawn_idle("probe", ["a", "b c"], _probe_env(tmp_path), out, err)
        code = child.wait()
        out.seek(0)
        policy, *args = out.read().decode().split(" ", 1)
    assert code == 0
    assert int(policy) == os.SCHED_IDLE and os.sched_getscheduler(0) != os.SCHED_IDLE  # the child only
    assert args == ["a b c\n"]  # the module's own arguments, as `python -m probe a "b c"` gets them


def test_a_child_ends_within_seconds_of_a_parent_killed_with_sigkill(tmp_path):
    """A parent starts a child that would run a minute, then is killed with SIGKILL (no cleanup of its own): the child
    is gone within 5 s."""
    env = _probe_env(tmp_path, sleep=60)
    parent = subprocess.Popen([sys.executable, "-c", "import sys, time; from toolkit.children import spawn_idle; "
                               "spawn_idle('probe', [], dict(__import__('os').environ), None, None); "
                               "print('started', flush=True); time.sleep(60)"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "started"
        children = [c.pid for c in psutil.Process(parent.pid).children(recursive=True)]
        assert children and alive_after(children, 0) == children  # running
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        assert not alive_after(children, 5), "a child outlived its parent by 5 s"
    finally:
        parent.kill()
        parent.wait()


def test_a_child_of_a_parent_gone_before_it_starts_ends_at_once(tmp_path):
    """The parent's pid is handed over, not read: a child whose parent is gone already ends before the module runs."""
    env = _probe_env(tmp_path)
    out = subprocess.run([sys.executable, "-m", "toolkit.children", "1", "probe"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stdout == ""
