"""Run a benchmark's child process while sampling the memory of its whole process tree."""

from __future__ import annotations

import subprocess
import threading
import time

import psutil

__all__ = ["run_sampled"]


def run_sampled(cmd: list[str], cwd, interval: float = 0.2) -> tuple[subprocess.CompletedProcess, float, int, int]:
    """Run ``cmd`` to completion, capturing its text output.

    Returns ``(completed, wall seconds, peak RSS of the largest process, peak RSS summed over the
    process and all its descendants)``, both in bytes, sampled every ``interval`` seconds.
    """
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0, 0]
    stop = threading.Event()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                rss = [p.memory_info().rss for p in [root, *root.children(recursive=True)]]
                peak[0], peak[1] = max(peak[0], max(rss)), max(peak[1], sum(rss))
            except psutil.Error:
                pass
            stop.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    stop.set()
    sampler.join()
    return (subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), time.perf_counter() - t,
            peak[0], peak[1])
