"""The fleet's outputs in a process's output index (:class:`live.OutputFeed`,
:meth:`drafting.DraftingService.learn_outputs`): another process's finished output drafts here, those already in the
layer at start too (a restart), this process's own are not learned twice, an output whose commit comes after a later
one's is still found, and a database fault or an output of another vocabulary changes nothing else. Real Postgres."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

from datastore.connection import connect
from datastore.errors import ClosedError, InvalidContext
from drafting import DraftingService
from live import OutputFeed
from live.store import LiveOutputs, encode_output
from support import UNREACHABLE, append_outputs

VOCAB = 49_152


def _service() -> DraftingService:
    """A drafter from the request's own tokens and the output index only (no datastore)."""
    return DraftingService(None, vocab_size=VOCAB, sources=("local", "outputs"))


def _answer(seed: int, n: int = 40) -> list[int]:
    return (np.random.default_rng(seed).permutation(VOCAB)[:n] + 0).tolist()  # no token twice: one continuation


def _drafts(service: DraftingService, output: list[int], at: int = 12, budget: int = 8) -> list[int]:
    """The chain drafted for a request whose prompt ends with ``output[:at]`` (nothing else of it repeats)."""
    service.start_request("probe", [7, 8, 9, *output[:at]])
    try:
        (draft,) = service.step(["probe"], [budget], chain=True).drafts
        return draft.token_ids.tolist()
    finally:
        service.stop_request("probe")


def _until(feed: OutputFeed, done, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < end, "the feed did not learn in time"
        feed.wait(5)


def test_another_process_output_drafts_here_and_a_restart_keeps_the_fleets(database_url, live_ds):
    yesterday, today, own = _answer(1), _answer(2), _answer(3)
    append_outputs(database_url, live_ds, [yesterday], "host:1")  # before this process started
    service = _service()
    assert _drafts(service, yesterday) == []  # nothing learned yet
    feed = OutputFeed(service, LiveOutputs(live_ds, database_url), skip_origin=lambda: "host:2", poll_s=0.05)
    try:
        _until(feed, lambda: feed.learned == 1)  # the warm start: the layer's newest
        assert _drafts(service, yesterday) == yesterday[12:20]
        append_outputs(database_url, live_ds, [today], "host:1")  # another process, now
        append_outputs(database_url, live_ds, [own], "host:2")    # this process's own: in its index when it stopped
        _until(feed, lambda: feed.learned == 2)
        feed.wait(5)
        assert _drafts(service, today) == today[12:20] and _drafts(service, own) == []
        assert service.outputs_info()["outputs"] == 2  # the two fed (the probes generated nothing)
        assert (feed.failed, feed.refused) == (0, 0)
    finally:
        feed.close()
        service.close()


def test_without_a_warm_start_only_new_outputs_are_learned(database_url, live_ds):
    old, new = _answer(7), _answer(8)
    append_outputs(database_url, live_ds, [old], "a")
    service = _service()
    feed = OutputFeed(service, LiveOutputs(live_ds, database_url), poll_s=0.05, warm_tokens=0)
    try:
        _until(feed, lambda: feed.reads >= 2)
        append_outputs(database_url, live_ds, [new], "a")
        _until(feed, lambda: feed.learned == 1)
        assert _drafts(service, new) == new[12:20] and _drafts(service, old) == []
    finally:
        feed.close()
        service.close()


def test_a_late_commit_below_a_read_id_is_found(database_url, live_ds):
    early, later = _answer(4), _answer(5)
    service = _service()
    feed = OutputFeed(service, LiveOutputs(live_ds, database_url), poll_s=0.05, settle_s=30)
    try:
        _until(feed, lambda: feed.reads >= 2)
        with connect(database_url) as slow:  # a COPY that takes its id first and commits last
            slow.execute("INSERT INTO live_outputs (name, tokens, num_tokens, origin) VALUES (%s, %s, %s, 'slow')",
                         [live_ds, encode_output(early), len(early)])
            append_outputs(database_url, live_ds, [later], "fast")
            _until(feed, lambda: feed.learned == 1)
            slow.commit()
        _until(feed, lambda: feed.learned == 2)
        assert _drafts(service, early) == early[12:20] and _drafts(service, later) == later[12:20]
    finally:
        feed.close()
        service.close()


def test_a_fault_or_another_vocabulary_changes_nothing_else(database_url, live_ds, caplog):
    good = _answer(6)
    append_outputs(database_url, live_ds, [[VOCAB + 5, 1, 2], good], "other")  # the first is of a larger vocabulary
    service = _service()
    with caplog.at_level(logging.WARNING, logger="live.feed"):
        feed = OutputFeed(service, LiveOutputs(live_ds, database_url), poll_s=0.05)
        down = OutputFeed(service, LiveOutputs(live_ds, UNREACHABLE), poll_s=0.05)
        try:
            _until(feed, lambda: feed.learned == 1)
            _until(down, lambda: down.failed >= 2)
            assert feed.refused == 1 and down.learned == 0
            assert _drafts(service, good) == good[12:20]
        finally:
            feed.close()
            down.close()
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("could not be read" in w for w in warnings) == 1  # once, however many reads fail
    assert sum("not of this vocabulary" in w for w in warnings) == 1
    service.close()


def test_learn_outputs_is_checked_at_the_door():
    service = _service()
    with pytest.raises(InvalidContext, match=r"outputs\[1\]"):
        service.learn_outputs([[1, 2, 3], [4, VOCAB]])
    assert service.outputs_info()["outputs"] == 0  # none of them added
    with pytest.raises(TypeError, match="list of token id sequences"):
        service.learn_outputs(np.arange(4))  # type: ignore[arg-type]
    assert service.learn_outputs([[1, 2, 3], [], np.arange(5, 9)]) == 7
    assert service.outputs_info()["outputs"] == 2  # the empty one skipped
    with pytest.raises(ValueError, match="poll_s"):
        OutputFeed(service, LiveOutputs("x", UNREACHABLE), poll_s=0)
    service.close()
    with pytest.raises(ClosedError):
        service.learn_outputs([[1, 2]])
