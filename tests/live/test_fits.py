"""The fleet's online calibration (:class:`live.FitFeed`, ``calibration_fits``): a process that starts drafts from the
fit of the processes before it, every process's verdicts reach the stored learner, a restart keeps it, a reader's role
adopts it without writing, a stored state that is no state of the fit is replaced (warned), a calibration of its own
keeps its own row, and a database fault changes nothing but the count. Real Postgres."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from datastore.admin.grants import grant_appender, grant_reader
from datastore.connection import connect
from drafting import Calibration, DatastoreCatalog, DraftingService
from live import FitFeed
from support import UNREACHABLE

VOCAB = 1000
CYCLE = list(range(100, 140))
"""A request's text: this cycle over and over, so its own earlier tokens draft the next ones."""


def _service(name: str, calibration: Calibration | None = None) -> DraftingService:
    """A drafter for datastore ``name`` (no datastore opened: the request's own tokens and the outputs draft), sharing
    its verdicts with the fleet."""
    return DraftingService(DatastoreCatalog(None, name), vocab_size=VOCAB, sources=("local", "outputs"),
                           calibration=calibration, online_share=100_000)


def _serve(service: DraftingService, req: str, steps: int, seed: int) -> None:
    """A request whose target follows the cycle, drafted for ``steps`` steps: each step commits the draft's tokens the
    target takes (a chain of 4) and its own next one, and now and then one it did not expect."""
    rng = np.random.default_rng(seed)
    text = CYCLE * 3
    service.start_request(req, text)
    at = len(text)
    for _ in range(steps):
        (draft,) = service.step([req], [4], chain=True).drafts
        taken = 0
        for t in draft.token_ids.tolist():
            if t != CYCLE[(at + taken) % len(CYCLE)]:
                break
            taken += 1
        new = [CYCLE[(at + k) % len(CYCLE)] for k in range(taken + 1)]
        if rng.random() < 0.3:
            new[-1] = 999  # the target goes elsewhere
        at += len(new)
        service.step([req], [0], tokens=[new], chain=True)
    service.stop_request(req)


def _stored(url: str, name: str) -> tuple[int, int]:
    """(outcomes, folds) of the datastore's stored fit without the model; AssertionError where there is no row."""
    with connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT outcomes, folds FROM calibration_fits WHERE name = %s AND NOT with_model",
                           [name]).fetchone()
    assert row is not None, f"no stored fit for {name}"
    return int(row[0]), int(row[1])


@pytest.fixture
def fit_name(database_url):
    name = "fits-test"
    yield name
    with connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM calibration_fits WHERE name = %s", [name])


def test_a_process_starts_from_the_fleet_s_fit_and_a_restart_keeps_it(database_url, fit_name):
    first = _service(fit_name)
    feed = FitFeed(first, database_url, poll_s=30)
    try:
        assert feed.flush(30)  # the first round: nothing learnt yet, the row made
        _serve(first, "a", 60, seed=1)
        learnt = first.fit()
        assert learnt[2] > 100 and not np.array_equal(learnt[0], first.calibration.coef)
        assert feed.flush(60)
        assert _stored(database_url, fit_name)[0] == learnt[2]
        np.testing.assert_array_equal(first.fit()[0], learnt[0])  # a fold of its own outcomes changes nothing
    finally:
        feed.close()
        first.close()
    second = _service(fit_name)  # another process, or this one restarted
    assert second.fit()[2] == 0
    feed = FitFeed(second, database_url, poll_s=30)
    try:
        assert feed.flush(30)
        coef, intercept, outcomes = second.fit()
        np.testing.assert_array_equal(coef, learnt[0])
        assert (intercept, outcomes) == (learnt[1], learnt[2])
        _serve(second, "b", 40, seed=2)  # its own verdicts go on from the fleet's
        more = second.fit()[2]
        assert more > outcomes
    finally:
        feed.close()  # a last round folds them
        second.close()
    assert _stored(database_url, fit_name)[0] == more


def test_two_processes_fold_into_one_learner(database_url, fit_name):
    a, b = _service(fit_name), _service(fit_name)
    feeds = [FitFeed(s, database_url, poll_s=30) for s in (a, b)]
    try:
        for f in feeds:
            assert f.flush(30)
        _serve(a, "a", 50, seed=3)
        _serve(b, "b", 50, seed=4)
        own = a.fit()[2], b.fit()[2]
        assert feeds[0].flush(60) and feeds[1].flush(60)  # b folds a's outcomes and its own; a reads b's back
        assert feeds[0].flush(60)
        assert a.fit()[2] == b.fit()[2] == sum(own) == _stored(database_url, fit_name)[0]
        np.testing.assert_array_equal(a.fit()[0], b.fit()[0])
    finally:
        for f in feeds:
            f.close()
        a.close()
        b.close()


def test_a_reader_adopts_the_fleet_s_fit_and_writes_nothing(database_url, fit_name, reader):
    role, reader_url = reader
    writer = _service(fit_name)
    feed = FitFeed(writer, database_url, poll_s=30)
    _serve(writer, "a", 40, seed=5)
    feed.close()
    writer_fit = writer.fit()
    writer.close()
    stored = _stored(database_url, fit_name)
    grant_reader(database_url, role, fit_name, create=True, future=True)
    service = _service(fit_name)
    feed = FitFeed(service, reader_url, poll_s=30)
    try:
        assert feed.flush(30)
        assert feed.read_only and feed.adopted == 1 and feed.failed == 0
        np.testing.assert_array_equal(service.fit()[0], writer_fit[0])
        _serve(service, "b", 30, seed=6)
        assert feed.flush(30)
        assert service.fit()[2] > writer_fit[2]  # it learns alone after adopting once
    finally:
        feed.close()
        service.close()
    assert _stored(database_url, fit_name) == stored


def test_an_appender_role_folds(database_url, fit_name, reader):
    role, url = reader
    grant_appender(database_url, role, create=True)
    service = _service(fit_name)
    feed = FitFeed(service, url, poll_s=30)
    try:
        _serve(service, "a", 20, seed=7)
        assert feed.flush(30) and not feed.read_only and feed.folds >= 1
    finally:
        feed.close()
    assert _stored(database_url, fit_name)[0] == service.fit()[2] > 0
    service.close()


def test_a_damaged_state_is_replaced_and_another_calibration_keeps_its_own_row(database_url, fit_name, caplog):
    service = _service(fit_name)
    flat = _service(fit_name, Calibration.load().flat())
    with connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO calibration_fits (name, prior, with_model, state) VALUES (%s, %s, false, %s)",
                     [fit_name, service.calibration.digest(), b"not a state"])
    feeds = [FitFeed(s, database_url, poll_s=30) for s in (service, flat)]
    try:
        with caplog.at_level(logging.WARNING, logger="live.fits"):
            for f in feeds:
                assert f.flush(30)
        assert feeds[0].replaced == 1 and "replaced by this process's" in caplog.text
        assert feeds[1].replaced == 0
    finally:
        for f in feeds:
            f.close()
        service.close()
        flat.close()
    with connect(database_url, autocommit=True) as conn:
        priors = sorted(p for (p,) in conn.execute("SELECT prior FROM calibration_fits WHERE name = %s", [fit_name]))
    assert priors == sorted([Calibration.load().digest(), Calibration.load().flat().digest()])


def test_a_database_fault_changes_nothing_but_the_count(caplog):
    service = _service("fits-unreachable")
    with caplog.at_level(logging.WARNING, logger="live.fits"):
        feed = FitFeed(service, UNREACHABLE, poll_s=0.05)
        try:
            _serve(service, "a", 20, seed=8)
            assert feed.flush(30) and feed.flush(30)
            assert feed.failed >= 2 and feed.folds == 0 and service.fit()[2] > 0
        finally:
            feed.close()
            service.close()
    assert caplog.text.count("could not be folded") == 1
