"""Keying an engine's rows to drafting requests by their tokens (:mod:`drafting.rows`): rows that grow, move, are
replaced and finish, as vLLM's batch condensing and preemption produce them, read in place from an engine-shaped token
array (only each row's new tokens are appended); each request's state always mirrors its row's tokens, which only the
service holds: its drafts are those of a request started from the row's whole sequence."""

from __future__ import annotations

import numpy as np

from drafting import DraftingService, RowTracker

VOCAB = 49_152
WIDTH = 700


def _service() -> DraftingService:
    return DraftingService(None, vocab_size=VOCAB, outputs_bytes=0, online_strength=0.0)  # drafts compared across runs


def _seq(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, n).astype(np.int32)  # as vLLM's token_ids_cpu holds them


class Batch:
    """An engine's persistent batch, as vLLM's ``InputBatch`` keeps it: ``token_ids_cpu`` ``[rows, max_len]`` int32
    and ``num_tokens_no_spec`` int32, rows rewritten in place."""

    def __init__(self, rows: int = 8) -> None:
        self.tokens = np.zeros((rows, WIDTH), np.int32)
        self.lengths = np.zeros(rows, np.int32)

    def put(self, row: int, seq: np.ndarray) -> None:
        self.tokens[row, :len(seq)] = seq
        self.lengths[row] = len(seq)

    def step(self, tracker: RowTracker, rows: list[int]) -> list[int]:
        return tracker.step(rows, self.tokens, self.lengths)


def _drafts(service: DraftingService, ids: list, budget: int = 4) -> list[list[int]]:
    return [d.token_ids.tolist() for d in service.step(ids, [budget] * len(ids), chain=True).drafts]


def _fresh_drafts(seqs: list[np.ndarray], budget: int = 4) -> list[list[int]]:
    """The drafts a service started from scratch on each row's tokens gives: what tracking must reproduce."""
    svc = _service()
    for i, tokens in enumerate(seqs):
        svc.start_request(i, tokens)
    return _drafts(svc, list(range(len(seqs))), budget)


def test_rows_grow_move_start_and_stop():
    service = _service()
    tracker = RowTracker(service)
    batch = Batch()
    a, b, c = (np.concatenate([_seq(s, 40), _seq(s, 40)]) for s in (1, 2, 3))  # repeats: the automaton drafts
    batch.put(0, a[:50])
    batch.put(1, b[:50])
    ids = batch.step(tracker, [0, 1])
    assert tracker.started == 2 and len(set(ids)) == 2

    batch.put(0, a[:53])
    batch.put(1, b[:51])
    assert batch.step(tracker, [0, 1]) == ids and tracker.started == 2  # the same requests, 3 and 1 new tokens

    # a finishes; b moves from row 1 to row 0 (condensed) and gains a token; c is new in row 1
    batch.put(0, b[:52])
    batch.put(1, c[:60])
    moved = batch.step(tracker, [0, 1])
    assert moved[0] == ids[1] and moved[1] not in ids
    assert (tracker.started, tracker.moved, tracker.stopped) == (3, 1, 1)
    assert service.active_requests == set(moved)
    got = _drafts(service, moved)
    assert got == _fresh_drafts([b[:52], c[:60]]) and any(got)

    # a row whose tokens do not extend its state (a preempted request's row reused): a new request
    other = np.concatenate([b[:30], _seq(9, 25)])
    batch.put(0, other)
    batch.put(1, c[:61])
    again = batch.step(tracker, [0, 1])
    assert again[0] not in moved and again[1] == moved[1] and ids[1] not in service.active_requests

    assert batch.step(tracker, []) == [] and not service.active_requests and tracker.active == 0


def test_identical_rows_and_swapped_rows():
    service = _service()
    tracker = RowTracker(service)
    batch = Batch()
    a, b = _seq(4, 30), _seq(5, 30)
    batch.put(0, a)
    batch.put(1, a)
    first = batch.step(tracker, [0, 1])  # two requests with the same tokens so far
    assert first[0] != first[1]
    batch.put(0, b)  # row 1 keeps an `a`; row 0 now holds a new request
    swapped = batch.step(tracker, [0, 1])
    assert swapped[1] == first[1] and swapped[0] not in first
    long_row = np.concatenate([a, _seq(6, 500)])
    batch.put(0, long_row)
    assert batch.step(tracker, [0]) == [swapped[1]]  # a's request moved to row 0 and grew by 500 tokens
    assert _drafts(service, [swapped[1]]) == _fresh_drafts([long_row])


def test_a_shuffled_engine_is_tracked_exactly():
    """A synthetic engine for 300 steps: requests arrive (several sharing a prompt, as parallel samples do), grow by
    1..4 tokens a step, finish, are preempted and resume later with their whole sequence, and the rows are condensed
    and reordered as vLLM does. After every step, every row's request holds exactly the row's tokens: its drafts are
    those of a request started from the row's sequence, and no request is left behind."""
    rng = np.random.default_rng(11)
    service = _service()
    tracker = RowTracker(service)
    batch = Batch(rows=6)
    shared = _seq(99, 24)  # a system prompt most requests share
    seqs: list[np.ndarray] = []  # the running requests, in row order
    waiting: list[np.ndarray] = []  # preempted requests, to resume
    checked = nonempty = 0
    for step in range(300):
        roll = rng.random()
        if (roll < 0.15 or not seqs) and len(seqs) < 6:  # a new request, or a preempted one resumes
            if waiting and rng.random() < 0.5:
                seqs.insert(int(rng.integers(len(seqs) + 1)), waiting.pop(0))
            else:
                body = _seq(int(rng.integers(5)), int(rng.integers(8, 40)))  # few distinct bodies: repeats
                seqs.insert(int(rng.integers(len(seqs) + 1)), np.concatenate([shared, body]))
        elif roll < 0.25:  # one finishes (condense: the last row fills its place)
            k = int(rng.integers(len(seqs)))
            seqs[k] = seqs[-1]
            seqs.pop()
        elif roll < 0.32:  # one is preempted
            waiting.append(seqs.pop(int(rng.integers(len(seqs)))))
        elif roll < 0.40 and len(seqs) > 1:  # reordered
            i, j = rng.choice(len(seqs), 2, replace=False)
            seqs[i], seqs[j] = seqs[j], seqs[i]
        for k, s in enumerate(seqs):  # every running request is sampled: 1..4 new tokens, often copies of its own
            grow = int(rng.integers(1, 5))
            new = s[-grow - 8:-8] if len(s) > grow + 8 and rng.random() < 0.6 else _seq(1000 + step * 7 + k, grow)
            seqs[k] = np.concatenate([s, new])[:WIDTH]
            batch.put(k, seqs[k])
        ids = batch.step(tracker, list(range(len(seqs))))
        assert len(set(ids)) == len(ids) and service.active_requests == set(ids)
        if seqs:
            got = _drafts(service, ids)
            assert got == _fresh_drafts(seqs), step
            checked += len(got)
            nonempty += sum(map(bool, got))
    assert checked > 600 and nonempty > checked // 4
    assert tracker.moved > 10 and tracker.stopped > 10 and tracker.started > 30
