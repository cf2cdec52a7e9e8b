"""A stage run in a child process of its own, timed, with the peak memory of its whole process tree.

A build's memory is that of its process and of the worker processes it starts; measured from outside, in a fresh
interpreter, it is what ``python -m ingest build`` would use, without the study's own memory (its tokenizer, its
replays). Postgres's memory is not included.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

__all__ = ["Measured", "run_measured"]

SAMPLE_S = 0.2
"""Seconds between samples of the process tree's resident memory."""


@dataclass(frozen=True)
class Measured:
    """What :func:`run_measured` saw.

    Attributes:
        value: the function's return value. seconds: wall time in the child, start to return.
        peak_tree_bytes: the largest sum of resident memory over the child and its descendants (sampled every
            :data:`SAMPLE_S` s). peak_process_bytes: the largest resident memory of one process of that tree.
    """

    value: Any
    seconds: float
    peak_tree_bytes: int
    peak_process_bytes: int


def _child(fn: Callable, args: tuple, out) -> None:
    t0 = time.perf_counter()
    try:
        value = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, which re-raises it
        out.send(("error", exc, 0.0))
    else:
        out.send(("ok", value, time.perf_counter() - t0))
    finally:
        out.close()


def _sample(pid: int, stop: threading.Event, peaks: list[int]) -> None:
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    while not stop.wait(SAMPLE_S):
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        sizes = []
        for p in procs:
            try:
                sizes.append(p.memory_info().rss)
            except psutil.NoSuchProcess:
                continue
        peaks[0] = max(peaks[0], sum(sizes))
        peaks[1] = max(peaks[1], max(sizes, default=0))


def run_measured(fn: Callable, *args) -> Measured:
    """Call ``fn(*args)`` in a fresh (spawned) child process and measure it; ``fn`` and its arguments and result
    must be picklable (a module-level function).

    Raises:
        Whatever ``fn`` raised, re-raised here; RuntimeError when the child died without an answer (killed).
    """
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(fn, args, send), name="study-stage")
    proc.start()
    send.close()
    peaks = [0, 0]
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(proc.pid, stop, peaks), daemon=True)
    sampler.start()
    try:
        status, value, seconds = recv.recv()
    except EOFError:
        raise RuntimeError(f"the child running {fn.__name__} died (exit code {proc.exitcode}) without an answer; "
                           "was it killed for memory?") from None
    finally:
        stop.set()
        sampler.join()
        proc.join()
    if status == "error":
        raise value
    return Measured(value, seconds, peaks[0], peaks[1])
