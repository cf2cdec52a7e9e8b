"""When the live layer is compacted, and how: what the layer looks like to a compactor at one check (:class:`Layer`)
and the rule that reads it (:class:`CompactionPolicy`: a delta once enough outputs wait, a fold once the delta holds
``fold_tokens``). :class:`live.LiveCompactor` asks the server and acts on it."""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.settings import DEFAULTS

__all__ = ["CompactionPolicy", "Layer"]


@dataclass(frozen=True)
class Layer:
    """What the live layer looks like to a compactor at one check (:data:`DUE_QUERY`'s row).

    Attributes:
        waiting / oldest_s / since_s / delta_busy: outputs beyond what the builds served hold (main and delta), the
            oldest's wait in seconds, seconds since the build serving the newest completed (``None``: none), and
            whether a delta compaction runs (anywhere).
        unfolded_tokens / unfolded / unfolded_oldest_s / main_since_s / fold_busy: the same about the main build
            alone (tokens and outputs it does not hold yet, their oldest's wait, its completion), and whether a fold
            runs.
    """

    waiting: int
    oldest_s: float | None
    since_s: float | None
    delta_busy: bool
    unfolded_tokens: int
    unfolded: int
    unfolded_oldest_s: float | None
    main_since_s: float | None
    fold_busy: bool


@dataclass(frozen=True)
class CompactionPolicy:
    """When a drafting service compacts its live layer, and how (the proposer's ``CREST_COMPACT_*`` settings).

    Two kinds of compaction keep the layer (:mod:`live.compaction`): a *delta* compaction builds only the outputs
    appended
    since the main build into the layer's delta (seconds, whatever the layer's size), and a *fold* rebuilds the main
    build from every output kept (its cost grows with the layer). A delta compaction is due (:meth:`due`) when outputs
    wait beyond what the builds served hold and either ``outputs`` of them wait or the oldest has waited ``after_s``
    seconds, and the build serving the newest completed at least ``gap_s`` seconds ago (so back-to-back compactions
    leave the cores to decoding at least that long). A fold is due (:meth:`fold_due`) once the outputs the main build
    does not hold reach ``fold_tokens`` tokens, so the delta stays small; it runs beside the delta compactions. With
    ``fold_tokens=0`` there is no delta: every compaction is a fold, due by the delta's rule.

    Attributes:
        outputs: outputs waiting that make a compaction due at once (>= 1; default 64).
        after_s: seconds the oldest waiting output may wait (>= 0; default 2).
        gap_s: seconds after the last compaction completed before the next may start (>= 0; default 2).
        fold_tokens: tokens outside the main build that make a fold due (>= 0; 0: no delta; default 262,144, whose
            delta compacts in a few seconds on two cores: ``python -m benchmarks.live_layer``).
        check_s: seconds between two checks, one query each (> 0; default 1).
        top_t / max_bytes: as ``python -m live compact`` (n-grams per n; the layer's byte bound).
        retry_s: seconds before retrying after a failed compaction, doubling to :data:`MAX_RETRY_S` (> 0; default 30).
        timeout_s: a compaction still running after this many seconds is killed (> 0; default 1800).

    Raises:
        ValueError: naming the setting, when one is out of range.
    """

    outputs: int = DEFAULTS.compact_outputs
    after_s: float = DEFAULTS.compact_after_s
    gap_s: float = DEFAULTS.compact_gap_s
    fold_tokens: int = DEFAULTS.compact_fold_tokens
    check_s: float = 1.0
    top_t: int = DEFAULTS.live_top_t
    max_bytes: int = DEFAULTS.live_max_bytes
    retry_s: float = 30.0
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        checks = [(self.outputs >= 1, f"outputs={self.outputs}: must be >= 1"),
                  (self.after_s >= 0, f"after_s={self.after_s}: must be >= 0"),
                  (self.gap_s >= 0, f"gap_s={self.gap_s}: must be >= 0"),
                  (self.fold_tokens >= 0, f"fold_tokens={self.fold_tokens}: must be >= 0 (0: no delta)"),
                  (self.check_s > 0, f"check_s={self.check_s}: must be > 0"),
                  (self.top_t >= 1, f"top_t={self.top_t}: must be >= 1"),
                  (self.max_bytes >= 1024, f"max_bytes={self.max_bytes}: must be >= 1024"),
                  (self.retry_s > 0, f"retry_s={self.retry_s}: must be > 0"),
                  (self.timeout_s > 0, f"timeout_s={self.timeout_s}: must be > 0")]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    def due(self, waiting: int, oldest_s: float | None, since_s: float | None) -> bool:
        """Whether a compaction of ``waiting`` outputs is due, the oldest ``oldest_s`` seconds old, the build serving
        the newest completed ``since_s`` seconds ago (``None``: there is none)."""
        if waiting == 0 or (since_s is not None and since_s < self.gap_s):
            return False
        return waiting >= self.outputs or (oldest_s is not None and oldest_s >= self.after_s)

    def delta_due(self, layer: Layer) -> bool:
        """Whether a delta compaction is due (never with ``fold_tokens=0``)."""
        return self.fold_tokens > 0 and not layer.delta_busy and self.due(layer.waiting, layer.oldest_s,
                                                                          layer.since_s)

    def fold_due(self, layer: Layer) -> bool:
        """Whether a fold is due."""
        if layer.fold_busy:
            return False
        if self.fold_tokens == 0:
            return self.due(layer.unfolded, layer.unfolded_oldest_s, layer.main_since_s)
        return layer.unfolded_tokens >= self.fold_tokens and (layer.main_since_s is None
                                                              or layer.main_since_s >= self.gap_s)
