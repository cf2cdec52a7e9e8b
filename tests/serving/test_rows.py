"""Keying an engine's rows to drafting requests by their tokens (:mod:`serving.rows`): rows that grow, move, are
replaced and finish, as vLLM's batch condensing and preemption produce them; each request's state always mirrors its
tokens, which only the service holds."""

from __future__ import annotations

import numpy as np

from drafting import DraftingService
from serving.rows import RowTracker

VOCAB = 49_152


def _service() -> DraftingService:
    return DraftingService(None, vocab_size=VOCAB)


def _seq(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, n).astype(np.int32)  # as vLLM's token_ids_cpu holds them


def _fresh_drafts(rows, budget: int = 4) -> list[list[int]]:
    """The drafts a service started from scratch on each row's tokens gives: what tracking must reproduce."""
    svc = _service()
    for i, (_, tokens) in enumerate(rows):
        svc.start_request(i, tokens.tolist())
    return [d.token_ids.tolist() for d in svc.propose([(i, t, budget) for i, (_, t) in enumerate(rows)], chain=True)]


def test_rows_grow_move_start_and_stop():
    service = _service()
    tracker = RowTracker(service)
    a, b, c = (np.concatenate([_seq(s, 40), _seq(s, 40)]) for s in (1, 2, 3))  # repeats: the trie drafts
    ids = tracker.step([(0, a[:50]), (1, b[:50])])
    assert tracker.started == 2 and len(set(ids)) == 2

    grown = tracker.step([(0, a[:53]), (1, b[:51])])  # the same requests, 3 and 1 new tokens
    assert grown == ids and tracker.started == 2

    # a finishes; b moves from row 1 to row 0 (condensed) and gains a token; c is new in row 1
    rows = [(0, b[:52]), (1, c[:60])]
    moved = tracker.step(rows)
    assert moved[0] == ids[1] and moved[1] not in ids
    assert (tracker.started, tracker.moved, tracker.stopped) == (3, 1, 1)
    assert service.active_requests == set(moved)
    got = [d.token_ids.tolist() for d in service.propose([(r, t, 4) for r, (_, t) in zip(moved, rows)], chain=True)]
    assert got == _fresh_drafts(rows) and any(got)

    # a row whose tokens do not extend its state (a preempted request's row reused): a new request
    other = np.concatenate([b[:30], _seq(9, 25)])
    again = tracker.step([(0, other), (1, c[:61])])
    assert again[0] not in moved and again[1] == moved[1] and ids[1] not in service.active_requests

    assert tracker.step([]) == [] and not service.active_requests and tracker.active == 0


def test_identical_rows_and_swapped_rows():
    service = _service()
    tracker = RowTracker(service)
    a, b = _seq(4, 30), _seq(5, 30)
    first = tracker.step([(0, a), (1, a.copy())])  # two requests with the same tokens so far
    assert first[0] != first[1]
    swapped = tracker.step([(0, b), (1, a)])  # row 1 keeps an `a`; row 0 now holds a new request
    assert swapped[1] == first[1] and swapped[0] not in first
    long_row = np.concatenate([a, _seq(6, 500)])  # grows past the state's buffer
    assert tracker.step([(0, long_row)]) == [swapped[1]]
    rows = [(0, long_row)]
    assert [d.token_ids.tolist() for d in service.propose([(swapped[1], long_row, 4)], chain=True)] == \
        _fresh_drafts(rows)
