"""The drafting service with the merged drafter (:mod:`drafting.service`, :mod:`drafting.merged`): a batch drafts what
each request drafts alone, in one round trip or in one native call over the host-local replicas, bit for bit the same
drafts either way; chains that are the trees' most probable paths; drafts without the datastore on every datastore
fault; its contract under threads (only the documented exceptions, a request stopped meanwhile gets an empty draft) and
under bad input (refused at the door, naming it, no row failing another's). Real datastore, real tokens (evaluation
prompts as the sequences; no model needed to check drafts)."""

from __future__ import annotations

import collections
import functools
import itertools
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from crest_native import MAX_BUDGET
from datastore import Datastore
from datastore.admin.live_writer import LiveWriter
from datastore.errors import ClosedError, InvalidContext
from datastore.live import live_name
from datastore.shared import SharedDatastore
from drafting import DatastoreSource, Draft, DraftingService, MergedMethod, ScoreKind
from drafting.draft import CostCurve
from ingest.live import compact_live
from serving.rows import RowTracker
from support import UNREACHABLE, build_small

BUDGETS = (1, 3, 8, 32)
VOCAB = 49_152


def _steps(prompt_ids, split: float = 0.5, chunk: int = 2):
    """A request's life from a real token sequence: its first half as the prompt, the rest committed
    ``chunk`` tokens at a time."""
    ids = [int(t) for t in prompt_ids]
    cut = max(4, int(len(ids) * split))
    return ids[:cut], [ids[i:i + chunk] for i in range(cut, len(ids), chunk)]


def _same(a: Draft, b: Draft) -> bool:
    return (np.array_equal(a.token_ids, b.token_ids) and np.array_equal(a.parents, b.parents)
            and a.scores.tobytes() == b.scores.tobytes())


def merged(source: DatastoreSource | None, **settings) -> tuple[DraftingService, MergedMethod]:
    """A service drafting with the merged method over ``source``, and the method."""
    method = MergedMethod(source, vocab_size=VOCAB, **settings)
    return DraftingService(method, vocab_size=VOCAB), method


@pytest.fixture
def shared_source(chat_datastore, database_url, tokenizer):
    """The round trip: a shared client with no replicas."""
    source = DatastoreSource(lambda: SharedDatastore.open(chat_datastore, tokenizer=tokenizer,
                                                          database_url=database_url, replicas=False))
    yield source
    source.close()


@pytest.fixture
def replica_source(chat_datastore, database_url, tokenizer):
    """A shared client whose replica is ready: every step is one native call."""
    source = DatastoreSource(lambda: SharedDatastore.open(chat_datastore, tokenizer=tokenizer,
                                                          database_url=database_url))
    client = cast(SharedDatastore, source.client)
    assert client.replicas is not None and client.replicas.wait_ready(60)
    yield source
    source.close()


def test_a_batch_drafts_what_each_request_drafts_alone(shared_source, chat_datastore, database_url, tokenizer,
                                                      eval_prompts):
    """Batched through the shared client (one round trip a step) = one request at a time through the plain client."""
    service, method = merged(shared_source)
    plain = DatastoreSource(lambda: Datastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url))
    alone, _ = merged(plain)
    lives = []
    for i, p in enumerate(eval_prompts):
        prompt, chunks = _steps(p.token_ids)
        service.start_request(i, prompt)
        alone.start_request(i, prompt)
        lives.append(chunks)
    budgets = itertools.cycle(BUDGETS)
    compared = nonempty = 0
    for step in range(max(map(len, lives))):
        batch = [(i, next(budgets)) for i in range(len(lives)) if step < len(lives[i])]
        trips = shared_source.client.round_trips
        drafts = service.propose(batch)
        assert shared_source.client.round_trips - trips <= 1  # one round trip for the whole batch
        for (i, budget), draft in zip(batch, drafts):
            assert len(draft) <= budget and draft.score_kind is ScoreKind.PROBABILITY
            assert _same(draft, alone.propose([(i, budget)])[0])
            compared += 1
            nonempty += len(draft) > 0
            for s in (service, alone):
                s.add_tokens(i, lives[i][step])
    assert compared > 100 and nonempty > compared // 2
    assert service.stats.steps == max(map(len, lives)) and method.stats.lookup_s > 0 and method.stats.core_s > 0
    assert method.stats.round_trip_steps == service.stats.steps and method.stats.replica_steps == 0
    alone.close()


def test_the_replica_drafts_what_the_round_trip_drafts_bit_for_bit(shared_source, replica_source, eval_prompts):
    """The same requests through the round trip and through the replica (one native call a step, no query): the same
    drafts, for trees (backing off at large budgets) and chains, step after step."""
    for chain in (False, True):
        trip, trip_method = merged(shared_source)
        local, local_method = merged(replica_source)
        lives = [_steps(p.token_ids) for p in eval_prompts]
        for svc in (trip, local):
            for i, (prompt, _) in enumerate(lives):
                svc.start_request(i, prompt)
        budgets = itertools.cycle((*BUDGETS, 64))
        compared = nonempty = 0
        client = cast(SharedDatastore, replica_source.client)
        for step in range(max(len(c) for _, c in lives)):
            batch = [(i, next(budgets)) for i, (_, c) in enumerate(lives) if step < len(c)]
            trips = client.round_trips
            got = local.propose(batch, chain=chain)
            assert client.round_trips == trips  # no query: the replica answered
            for a, b in zip(got, trip.propose(batch, chain=chain)):
                assert _same(a, b)
                compared += 1
                nonempty += len(a) > 0
            for i, _ in batch:
                for svc in (trip, local):
                    svc.add_tokens(i, lives[i][1][step])
        assert compared > 100 and nonempty > compared // 2
        assert local_method.stats.replica_steps == local.stats.steps and local_method.stats.round_trip_steps == 0
        assert trip_method.stats.backed_off > 0 or chain  # trees of 32 and 64 nodes chose among stored suffixes
        assert local_method.stats.backed_off == trip_method.stats.backed_off


class CountingCore:
    """A service's real native core with every call on it counted by name (what the service and its method call)."""

    def __init__(self, core) -> None:
        self.core = core
        self.calls: collections.Counter = collections.Counter()

    def __getattr__(self, name: str):
        attr = getattr(self.core, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.calls[name] += 1
            return attr(*args, **kwargs)

        return call


@pytest.mark.parametrize("whole", [False, True], ids=["rows named", "whole batch"])
def test_a_steady_engine_step_is_one_native_call(replica_source, eval_prompts, whole):
    """An engine's rows followed and drafted by RowTracker.propose: one native call a step while every row holds its
    request, a few when requests start, stop or move (never one per row); the drafts, cut to a step-cost curve, are bit
    for bit those of following the rows, then drafting, then cutting, in three calls. A whole batch (``index=None``, as
    vLLM steps) steps steadily through its prepared SteadyBatch: not through follow_and_propose's checks."""
    one, _ = merged(replica_source, min_score=0.1)
    checked: collections.Counter = collections.Counter()
    follow_and_propose = one.follow_and_propose

    def counted(*args, **kwargs):
        checked["calls"] += 1
        return follow_and_propose(*args, **kwargs)

    one.follow_and_propose = counted  # type: ignore[method-assign]
    two, _ = merged(replica_source, min_score=0.1)
    counting = CountingCore(one._core)
    one._core = counting
    trackers = RowTracker(one), RowTracker(two)
    lives = [_steps(p.token_ids) for p in eval_prompts[:6]]
    width = max(len(p.token_ids) for p in eval_prompts[:6]) + 8
    tokens, lengths = np.zeros((8, width), np.int32), np.zeros(8, np.int32)
    seqs = [list(prompt) for prompt, _ in lives]
    steady = compared = cut = batched = 0
    for step in range(max(len(c) for _, c in lives)):
        rows = [i for i, (_, c) in enumerate(lives) if step < len(c)]
        rows = rows[::-1] if step == 3 else rows  # the engine reorders its rows once: requests move
        for r, i in enumerate(rows):
            tokens[r, :len(seqs[i])] = seqs[i]
            lengths[r] = len(seqs[i])
        index = list(range(len(rows)))
        budgets = np.full(len(rows), 8, np.int64)
        t = trackers[0]
        before = (t.started, t.moved, t.stopped)
        counting.calls.clear()
        checked.clear()
        curve = CostCurve(np.array([1.0, 6.0]), np.array([0.020, 0.021]), 0.008)  # a knee at 6 tokens
        _, got = t.propose(None if whole else index, tokens, lengths, budgets, min_score=0.1, curve=curve)
        ids = trackers[1].step(index, tokens, lengths)
        want = two.propose([(rid, 8) for rid in ids], chain=True, min_score=0.1, curve=curve)
        cut += want.nodes < two.propose([(rid, 8) for rid in ids], chain=True, min_score=0.1).nodes
        if (t.started, t.moved, t.stopped) == before:  # every row held its request: a steady step
            assert counting.calls == {"follow_draft_stored": 1}, counting.calls
            steady += 1
            batched += whole and not checked
        else:  # a fixed number of calls, and one per request started or stopped
            assert sum(counting.calls.values()) - counting.calls["start"] - counting.calls["stop"] <= 4, counting.calls
        assert got.token_ids == want.chains().token_ids
        assert got.scores.tobytes() == want.scores.tobytes() and not got.scores.flags.writeable
        compared += len(got.token_ids)
        for i in rows:
            seqs[i] += lives[i][1][step]
    assert steady > 10 and compared > 50 and cut > 5
    assert batched >= steady - 3 if whole else batched == 0  # all but the steps after a change of rows


def test_a_steady_batch_goes_stale_when_its_requests_change(replica_source, eval_prompts):
    """A prepared SteadyBatch drafts what follow_and_propose drafts; once the service starts or stops a request,
    prepares another batch, or is closed, it answers None (the caller takes the checked path), and a bad new id is
    refused through it as the door refuses it, nothing followed."""
    service, _ = merged(replica_source, min_score=0.1)
    alone, _ = merged(replica_source, min_score=0.1)
    seqs, chunks = [], []
    for i, p in enumerate(eval_prompts[:2]):
        prompt, rest = _steps(p.token_ids)
        service.start_request(i, prompt)
        seqs.append(list(prompt))
        chunks.append(rest)
    width = max(len(p.token_ids) for p in eval_prompts[:2]) + 8
    tokens, lengths = np.zeros((2, width), np.int32), np.zeros(2, np.int32)
    budgets = np.full(2, 8, np.int64)

    def advance(step: int) -> None:
        for r in range(2):
            seqs[r] += chunks[r][step]
            tokens[r, :len(seqs[r])], lengths[r] = seqs[r], len(seqs[r])

    batch = service.steady_batch([0, 1], min_score=0.1, vocab_size=VOCAB)
    assert batch is not None and list(batch.ids) == [0, 1]
    for step in range(3):
        advance(step)
        made = batch.draft(tokens, lengths, budgets)
        assert made is not None and made[0] == [True, True] and made[1] is not None
        for r in range(2):
            alone.start_request(f"want{step}.{r}", seqs[r])
        want = alone.propose([(f"want{step}.{r}", 8) for r in range(2)], chain=True)
        assert made[1].token_ids == want.chains().token_ids
    advance(3)
    bad = tokens.copy()
    bad[1, lengths[1] - 1] = VOCAB
    with pytest.raises(InvalidContext, match=re.escape(f"holds token id {VOCAB}")):
        batch.draft(bad, lengths, budgets)
    assert service.read_request(1, lambda core, h: core.count(h)) == len(seqs[1]) - len(chunks[1][3])
    assert batch.draft(tokens.astype(np.int64), lengths, budgets) is None  # refused: the checked path names it
    service.start_request(2, seqs[0])
    assert batch.draft(tokens, lengths, budgets) is None
    again = service.steady_batch([0, 1], min_score=0.1, vocab_size=VOCAB)
    assert again is not None and again.draft(tokens, lengths, budgets) is not None
    service.stop_request(2)
    assert again.draft(tokens, lengths, budgets) is None
    last = service.steady_batch([0, 1], min_score=0.1, vocab_size=VOCAB)
    assert last is not None and service.steady_batch([1, 0], min_score=0.1, vocab_size=VOCAB) is not None
    assert last.draft(tokens, lengths, budgets) is None  # another batch was prepared since
    assert service.steady_batch([0, 5], vocab_size=VOCAB) is None  # request 5 is not active
    service.close()
    alone.close()
    assert again.draft(tokens, lengths, budgets) is None
    with pytest.raises(ClosedError):
        service.follow_and_propose([0, 1], tokens, lengths, None, budgets)


STEADY_BAD: list[tuple[Any, type[BaseException], str]] = [  # (the step's arguments spoilt, error, what it names)
    (lambda t, n, b: (t.astype(np.float32), n, None, b), InvalidContext, "float32"),
    (lambda t, n, b: (t, n.astype(np.int64), None, b), InvalidContext, "lengths is a 1-D numpy array of int64"),
    (lambda t, n, b: (t, n, [1], b), InvalidContext, "outside the 1 given"),
    (lambda t, n, b: (t, n + t.shape[1], None, b), InvalidContext, "of the rows in index are outside"),
    (lambda t, n, b: (t, np.zeros(0, np.int32), None, b), InvalidContext, "names rows outside the 0 given"),
    (lambda t, n, b: (t, n, None, b + MAX_BUDGET), ValueError,
     f"budgets[0] {MAX_BUDGET + 8} is outside 0..{MAX_BUDGET}"),
    (lambda t, n, b: (t, n, None, b - 9), ValueError, "budgets[0] -1 is outside"),
    (lambda t, n, b: (t, n, None, np.zeros(2, np.int64)), ValueError, "2 budgets for 1 rows"),
    (lambda t, n, b: (np.where(np.arange(t.shape[1]) == n[0] - 1, VOCAB, t).astype(np.int32), n, None, b),
     InvalidContext, f"holds token id {VOCAB} (outside 0..{VOCAB - 1})"),
]


@pytest.mark.parametrize("spoil,error,named", STEADY_BAD, ids=[n for *_, n in STEADY_BAD])
def test_the_one_call_refuses_bad_rows_as_the_door_does_and_changes_nothing(replica_source, eval_prompts, spoil,
                                                                              error, named):
    """A steady step's rows go to the one native call unchecked by Python; what it refuses is named as the door names
    it, before any row follows; then the same request drafts on as before. An engine's other layouts (a column slice,
    budgets as a list) are taken, not refused."""
    service, _ = merged(replica_source, min_score=0.1)
    prompt, chunks = _steps(eval_prompts[0].token_ids)
    service.start_request("a", prompt)
    seq = list(prompt) + chunks[0]
    tokens, lengths = np.array([seq + [0] * 8], np.int32), np.array([len(seq)], np.int32)
    budgets = np.full(1, 8, np.int64)
    followed, chains = service.follow_and_propose(["a"], tokens, lengths, None, budgets, vocab_size=VOCAB)
    assert followed == [True] and chains is not None  # the request's handles are kept: the next step is steady
    seq += chunks[1]
    tokens[0, :len(seq)], lengths[0] = seq, len(seq)
    with pytest.raises(error, match=re.escape(named)):
        service.follow_and_propose(["a"], *spoil(tokens, lengths, budgets), vocab_size=VOCAB)
    assert service.read_request("a", lambda core, h: core.count(h)) == len(seq) - len(chunks[1])  # nothing followed
    wide = np.zeros((1, 2 * tokens.shape[1]), np.int32)
    wide[0, :tokens.shape[1]] = tokens[0]
    followed, chains = service.follow_and_propose(["a"], wide[:, :tokens.shape[1]], lengths, None, [8],
                                                  vocab_size=VOCAB)
    alone, _ = merged(replica_source, min_score=0.1)
    alone.start_request("b", seq)
    want = alone.propose([("b", 8)], chain=True)
    assert followed == [True] and chains is not None and chains.token_ids == want.chains().token_ids


@pytest.mark.parametrize("fault", ["truncated", "bit-flipped", "deleted"])
def test_a_replica_fault_mid_run_never_changes_an_engine_steps_chains(fault, shared_source, chat_datastore,
                                                                       database_url, tokenizer, eval_prompts,
                                                                       tmp_path):
    """An engine's steady steps (one native call each) while the replica file is cut short, bit-flipped or deleted:
    every step's chains stay what the round trip drafts, bit for bit (a damaged replica sends the step to the round
    trip), and the process lives on."""
    source = DatastoreSource(lambda: SharedDatastore.open(chat_datastore, tokenizer=tokenizer,
                                                          database_url=database_url, replicas=tmp_path / "replicas"))
    client = cast(SharedDatastore, source.client)
    assert client.replicas is not None and client.replicas.wait_ready(60)
    stores = client.stores()
    assert stores is not None
    path = Path(stores.datastore.path)
    local, method = merged(source)
    trip, _ = merged(shared_source)
    seqs = [list(map(int, p.token_ids)) for p in eval_prompts if len(p.token_ids) > 60][:6]
    tokens, lengths = np.zeros((len(seqs), 64), np.int32), np.zeros(len(seqs), np.int32)
    ids = list(range(len(seqs)))
    for i, seq in enumerate(seqs):
        local.start_request(i, seq[:12])
        trip.start_request(i, seq[:12])
    budgets = np.full(len(seqs), 8, np.int64)
    for pos in range(12, 60):
        if pos == 30:
            if fault == "truncated":
                os.truncate(path, path.stat().st_size // 2)
            elif fault == "deleted":
                path.unlink()
            else:
                with open(path, "r+b") as f:
                    for at in range(path.stat().st_size // 3, path.stat().st_size, 4096):  # a page of records each
                        f.seek(at)
                        byte = f.read(1)
                        f.seek(at)
                        f.write(bytes([byte[0] ^ 0x20]))
        for i, seq in enumerate(seqs):
            tokens[i, :pos], lengths[i] = seq[:pos], pos
            if pos > 12:
                trip.add_tokens(i, seq[pos - 1:pos])
        followed, got = local.follow_and_propose(ids, tokens, lengths, None, budgets, vocab_size=VOCAB)
        want = trip.propose([(i, 8) for i in ids], chain=True).chains()
        assert followed == [True] * len(seqs) and got is not None, pos
        assert got.token_ids == want.token_ids and got.scores.tobytes() == want.scores.tobytes(), (fault, pos)
    assert method.stats.damaged <= (0 if fault == "deleted" else 1) and method.stats.replica_steps >= 18
    source.close()


def test_chains_are_the_merged_trees_best_paths(shared_source, eval_prompts):
    tree_service, _ = merged(shared_source, back_off_min_budget=10**9)  # the longest match, as chains use
    chain_service, _ = merged(shared_source, min_score=0.1)
    prompt, chunks = _steps(eval_prompts[-1].token_ids)  # code: long copies from the prompt
    for svc in (tree_service, chain_service):
        svc.start_request("r", prompt)
    longest = exact = steps = 0
    for chunk in chunks:
        tree = tree_service.propose([("r", MAX_BUDGET)])[0]
        for k in (1, 3, 5):
            chain = chain_service.propose([("r", k)], chain=True)[0]
            assert np.array_equal(chain.parents, np.arange(-1, len(chain) - 1))
            assert len(chain) <= k and (chain.scores >= 0.1).all()
            node = 0  # the chain is a root path of the merged tree ...
            for t in chain.token_ids.tolist():
                node = tree.children[node][t] + 1
            best = tree.best_path(k, 0.1).scores.sum()  # ... and, up to the trie's own top-k cut, its best one
            assert chain.scores.sum() <= best + 1e-9
            exact += bool(np.isclose(chain.scores.sum(), best))
            steps += 1
            longest = max(longest, len(chain))
        for svc in (tree_service, chain_service):
            svc.add_tokens("r", chunk)
    assert exact >= 0.9 * steps
    assert longest >= 3  # multi-token chains happen


def test_every_fault_gives_the_drafts_of_no_datastore(eval_prompts, tokenizer, chat_datastore):
    down = DatastoreSource(lambda: SharedDatastore.open(chat_datastore, tokenizer=tokenizer,
                                                        database_url=UNREACHABLE), retry_s=3600)
    assert down.client is None and down.faults and down.stores() is None
    faulty, _ = merged(down)
    without, _ = merged(None)
    prompts = [_steps(p.token_ids)[0] for p in eval_prompts]
    for svc in (faulty, without):
        for i, prompt in enumerate(prompts):
            svc.start_request(i, prompt)
    for chain in (False, True):
        batch = [(i, 5) for i in range(len(prompts))]
        a, b = faulty.propose(batch, chain=chain), without.propose(batch, chain=chain)
        assert all(_same(x, y) for x, y in zip(a, b)) and any(len(x) for x in a)


@pytest.mark.parametrize("path", ["trip", "replica"])
def test_threads_get_the_drafts_of_a_serial_run(path, shared_source, replica_source, eval_prompts):
    source = shared_source if path == "trip" else replica_source
    lives = [_steps(p.token_ids) for p in eval_prompts for _ in range(3)]  # 9 requests, 3 per prompt

    def run(service: DraftingService, ids) -> dict:
        out: dict[int, list[list[int]]] = {}
        for rid in ids:
            prompt, chunks = lives[rid]
            service.start_request(rid, prompt)
            out[rid] = []
            for chunk in chunks:
                d = service.propose([(rid, 4)], chain=True)[0]
                out[rid].append(d.token_ids.tolist())
                service.add_tokens(rid, chunk)
            service.stop_request(rid)
        return out

    # no output index: with one, a request's drafts depend on which requests finished before it
    serial = run(merged(source, outputs_bytes=0)[0], range(len(lives)))
    shared, _ = merged(source, outputs_bytes=0)
    results, errors = {}, []

    def work(ids) -> None:
        try:
            results.update(run(shared, ids))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(range(t, len(lives), 3),)) for t in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and results == serial and not shared.active_requests


def test_a_request_stopped_while_its_lookups_run_gets_an_empty_draft(shared_source, eval_prompts, monkeypatch):
    """The race made certain: request "b" is stopped inside the step's round trip (between the door's check and the
    native call). Its row gets an empty draft, counted in ``stats.stopped_meanwhile``; the other row's draft is what it
    drafts alone."""
    prompt = _steps(eval_prompts[0].token_ids)[0]
    alone, _ = merged(shared_source)
    alone.start_request("a", prompt)
    expected = alone.propose([("a", 8)])[0]
    service, method = merged(shared_source)
    for key in ("a", "b"):
        service.start_request(key, prompt)
    lookups = shared_source.retrieve_batch

    def stopping_b(contexts, back_off):
        service.stop_request("b")
        service.start_request("c", prompt)  # it may take b's place in the core: b's row still drafts nothing
        return lookups(contexts, back_off)

    monkeypatch.setattr(shared_source, "retrieve_batch", stopping_b)
    drafts = service.propose([("a", 8), ("b", 8)])
    assert len(expected) > 0 and _same(drafts[0], expected)
    assert len(drafts[1]) == 0 and method.stats.stopped_meanwhile == 1
    assert service.active_requests == {"a", "c"}


@pytest.mark.parametrize("path", ["trip", "replica"])
def test_requests_stopped_and_restarted_under_drafting_threads_raise_only_what_is_documented(path, shared_source,
                                                                                            replica_source,
                                                                                            eval_prompts):
    """Two threads draft for 8 requests while a third stops, restarts and extends them, for 8 s: a call raises only
    the documented ``KeyError`` (a request not active when the call starts), and a row whose request is stopped while
    its lookups run gets an empty draft. The lifecycle thread leaves each request stopped for 2 ms, so that the drafting
    threads meet the race many times."""
    service, method = merged(shared_source if path == "trip" else replica_source)
    seqs = [list(_steps(p.token_ids)[0]) for p in eval_prompts]
    keys = list(range(8))
    for k in keys:
        service.start_request(k, seqs[k % len(seqs)])
    stop = threading.Event()
    counts = {"drafts": 0, "key_errors": 0, "lifecycle": 0}
    unexpected: list[BaseException] = []
    lock = threading.Lock()

    def drafting(chain: bool) -> None:
        while not stop.is_set():
            try:
                drafts = service.propose([(k, 8) for k in keys], chain=chain)
                with lock:
                    counts["drafts"] += len(drafts)
            except KeyError as exc:
                assert "is not active; start_request it first" in str(exc)
                with lock:
                    counts["key_errors"] += 1
            except BaseException as exc:  # noqa: BLE001 - every other exception is a failure, reported below
                unexpected.append(exc)
                return

    def lifecycle() -> None:
        rng = np.random.default_rng(0)
        while not stop.is_set():
            k = int(rng.integers(len(keys)))
            try:
                service.stop_request(k)
                time.sleep(0.002)
                service.start_request(k, seqs[k % len(seqs)])
                service.add_tokens(k, [int(t) for t in rng.integers(0, 1000, 2)])
            except BaseException as exc:  # noqa: BLE001 - nothing may fail here: one thread owns the starts
                unexpected.append(exc)
                return
            with lock:
                counts["lifecycle"] += 1

    threads = [threading.Thread(target=drafting, args=(c,)) for c in (False, True)]
    threads.append(threading.Thread(target=lifecycle))
    for th in threads:
        th.start()
    time.sleep(8)
    stop.set()
    for th in threads:
        th.join(30)
    assert not unexpected, unexpected[:3]
    assert counts["drafts"] > 100 and counts["lifecycle"] > 100
    assert counts["key_errors"] + method.stats.stopped_meanwhile > 0  # the race was met, and answered as documented


@pytest.fixture
def started(shared_source, eval_prompts):
    service, _ = merged(shared_source)
    prompt = _steps(eval_prompts[0].token_ids)[0]
    service.start_request("a", prompt)
    return service, prompt


ROWS = np.zeros((2, 8), np.int32)


def _row(prompt, new_id: int, dtype=np.int32) -> np.ndarray:
    """One engine row: the request's prompt, then ``new_id``."""
    return np.array([list(prompt) + [new_id]], dtype)


def _lengths(prompt, dtype=np.int32) -> np.ndarray:
    return np.array([len(prompt) + 1], dtype)

BAD: list[tuple[Any, type[BaseException], str]] = [  # (what a caller does, the error, what its message names)
    (lambda s, p: s.start_request("v", [49_152]), ValueError, "prompt_ids holds token id 49152"),
    (lambda s, p: s.start_request("v", [10**9]), ValueError, "outside the tokenizer's vocabulary [0, 49152)"),
    (lambda s, p: s.start_request("v", np.array([1.5])), InvalidContext, "float64"),
    (lambda s, p: s.start_request("v", [-3]), InvalidContext, "-3"),
    (lambda s, p: s.start_request("v", np.array([5, -3])), InvalidContext, "-3"),
    (lambda s, p: s.start_request(cast(Any, None), p), TypeError, "req_id None"),
    (lambda s, p: s.start_request("a", p), ValueError, "'a' is already active"),
    (lambda s, p: s.add_tokens("a", [10**9]), ValueError, "tokens holds token id 1000000000"),
    (lambda s, p: s.add_tokens("a", [2**32]), ValueError, "outside the tokenizer's vocabulary [0, 49152)"),
    (lambda s, p: s.add_tokens("a", np.array([2**32])), ValueError, "outside the tokenizer's vocabulary [0, 49152)"),
    (lambda s, p: s.add_tokens("a", [-1]), ValueError, "tokens holds token id -1, outside the tokenizer's vocabulary"),
    (lambda s, p: s.add_tokens("a", "abc"), InvalidContext, "str"),
    (lambda s, p: s.add_tokens("b", [1]), KeyError, "'b' is not active"),
    (lambda s, p: s.propose([("b", 3)]), KeyError, "'b' is not active"),
    (lambda s, p: s.propose([("a", 2.5)]), TypeError, "batch[0] budget 2.5"),
    (lambda s, p: s.propose([("a", "3")]), TypeError, "batch[0] budget '3'"),
    (lambda s, p: s.propose([("a", True)]), TypeError, "batch[0] budget True"),
    (lambda s, p: s.propose([("a", 2**63)]), ValueError, f"batch[0] budget {2**63} is outside 0..{MAX_BUDGET}"),
    (lambda s, p: s.propose([("a", float("nan"))]), TypeError, "batch[0] budget nan"),
    (lambda s, p: s.propose([("a", -1)]), ValueError, f"outside 0..{MAX_BUDGET}"),
    (lambda s, p: s.propose([("a", 3), ("a", p, 3)]), TypeError, "batch[1]"),
    (lambda s, p: s.propose([("a",)]), TypeError, "batch[0]"),
    (lambda s, p: s.propose(cast(Any, ("a", 3))), TypeError, "batch[0]"),
    (lambda s, p: s.propose([("a", 3)], min_score=-0.1), ValueError, "min_score=-0.1"),
    (lambda s, p: s.propose([("a", 3)], min_score=float("nan")), ValueError, "min_score=nan"),
    (lambda s, p: s.propose([("a", 3)], min_score=cast(Any, "0.1")), TypeError, "min_score '0.1'"),
    (lambda s, p: s.follow_rows(["a"], np.array([1, 2]), np.array([2]), [0]), InvalidContext, "1-D"),
    (lambda s, p: s.follow_rows(["a"], ROWS.astype(float), np.array([2]), [0]), InvalidContext, "float64"),
    (lambda s, p: s.follow_rows(["a"], ROWS, np.array([2]), [0]), InvalidContext, "lengths is a 1-D numpy array of "
                                                                                  "int64"),
    (lambda s, p: s.follow_rows(["a"], ROWS, np.array([9, 1], np.int32), [0]), InvalidContext, "[9] of the rows in "
                                                                                                 "index are outside "
                                                                                                 "0..8"),
    (lambda s, p: s.follow_rows(["a"], ROWS, np.array([-1, 1], np.int32), [0]), InvalidContext, "outside 0..8"),
    (lambda s, p: s.follow_rows(["a"], ROWS, np.array([1, 1], np.int32), [2]), InvalidContext, "index [2]"),
    (lambda s, p: s.follow_rows([True], ROWS, np.array([1, 1], np.int32), [0]), TypeError, "req_ids[0] True is a bool"),
    (lambda s, p: s.follow_rows([1.0], ROWS, np.array([1, 1], np.int32), [0]), TypeError, "req_ids[0] 1.0 is a float"),
    (lambda s, p: s.follow_rows([["a"]], ROWS, np.array([1, 1], np.int32), [0]), TypeError, "req_ids[0] ['a'] is a "
                                                                                              "list"),
    (lambda s, p: s.follow_rows((r for r in ["a"]), ROWS, np.array([1, 1], np.int32), [0]), TypeError,
     "req_ids is a generator; pass a sequence"),
    (lambda s, p: s.follow_rows(["a"], _row(p, -1), _lengths(p), [0]), InvalidContext, "holds token id -1 (outside "
                                                                                        "0..2147483647)"),
    (lambda s, p: s.follow_rows(["a"], _row(p, 2**32 + 7, np.int64), _lengths(p, np.int64), [0]), InvalidContext,
     f"holds token id {2**32 + 7}"),
    (lambda s, p: s.follow_rows(["a"], _row(p, 2**31, np.int64), _lengths(p, np.int64), [0]), InvalidContext,
     f"holds token id {2**31}"),
    (lambda s, p: s.follow_rows(["a"], _row(p, 49_152), _lengths(p), [0], vocab_size=49_152), InvalidContext,
     "holds token id 49152 (outside 0..49151)"),
    (lambda s, p: s.follow_rows(["a"], _row(p, 7), _lengths(p), [0], vocab_size=True), TypeError, "vocab_size=True"),
    (lambda s, p: s.propose([("a", 3)], chain=cast(Any, "yes")), TypeError, "chain='yes' is a str; pass True"),
    (lambda s, p: s.propose([("a", 3)], chain=cast(Any, 1)), TypeError, "chain=1 is a int"),
    (lambda s, p: s.propose([("a", 3)], chain=cast(Any, None)), TypeError, "chain=None"),
    (lambda s, p: s.add_hidden_states("a", np.zeros((1, 4))), TypeError, "the merged drafter reads no hidden states"),
]


@pytest.mark.parametrize("call,error,named", BAD, ids=[f"{e.__name__}: {n}" for _, e, n in BAD])
def test_bad_input_is_refused_at_the_door_and_fails_no_other_row(started, call, error, named):
    service, prompt = started
    with pytest.raises(error, match=re.escape(named)):
        call(service, prompt)
    assert service.active_requests == {"a"}  # nothing half-done, nothing lost
    service.start_request("c", prompt)  # another request, and this one, still draft
    drafts = service.propose([("a", 8), ("c", 8)])
    assert len(drafts[0]) > 0 and _same(drafts[0], drafts[1])


def test_settings_are_checked_where_the_method_is_built(shared_source):
    for kwargs, named in (({"min_score": 2.0}, "min_score=2.0"), ({"back_off_min_budget": -1}, "back_off_min_budget"),
                          ({"outputs_bytes": -1}, "outputs_bytes"), ({"sources": ("ds", "corpus")}, "'corpus'")):
        with pytest.raises((ValueError, TypeError), match=re.escape(named)):
            MergedMethod(shared_source, vocab_size=VOCAB, **kwargs)
    for vocab in (0, 2**32 + 1, 3.5, True):
        with pytest.raises(ValueError, match="vocab_size"):
            DraftingService(MergedMethod(None), vocab_size=cast(Any, vocab))


def test_chain_takes_numpy_bools_and_a_closed_service_refuses_every_call(started):
    """``chain`` is a bool (numpy's too); after ``close()`` (or a ``with`` block) every call raises ClosedError, naming
    the fix, and nothing reopens (a second close does nothing)."""
    service, prompt = started
    assert service.propose([("a", 4)], chain=np.bool_(True))[0].token_ids.tolist() == \
        service.propose([("a", 4)], chain=True)[0].token_ids.tolist()
    with service:
        pass
    service.close()
    calls = [lambda: service.propose([("a", 3)]), lambda: service.start_request("z", prompt),
             lambda: service.add_tokens("a", [1]), lambda: service.stop_request("a"), lambda: service.tokens("a"),
             lambda: service.follow_rows(["a"], _row(prompt, 5), _lengths(prompt), [0])]
    for call in calls:
        with pytest.raises(ClosedError, match="was closed .*open a new one"):
            call()
    assert cast(DatastoreSource, cast(MergedMethod, service.method).lookups).client is None  # nothing reopened


def test_budget_zero_drafts_nothing_and_a_stopped_request_is_forgotten(started):
    service, prompt = started
    assert len(service.propose([("a", 0)])[0]) == 0
    service.stop_request("a")
    service.stop_request("a")  # ignored
    assert not service.active_requests


def test_follow_rows_appends_only_what_a_row_adds(eval_prompts):
    """An engine's rows: a request whose tokens prefix its row takes the rest (and then drafts what a request started
    from the whole row drafts); a row holding another sequence is refused, and nothing changes."""
    ids = [int(t) for t in eval_prompts[-1].token_ids]
    rows = np.zeros((3, len(ids) + 4), np.int32)
    rows[0, :len(ids)] = ids
    rows[1, :len(ids)] = ids[::-1]
    lengths = np.array([len(ids), len(ids), 0], np.int32)
    followed, _ = merged(None)
    whole, _ = merged(None)
    followed.start_request("r", ids[:20])
    whole.start_request("r", ids)
    assert followed.follow_rows(["r", "r", None], rows, lengths, [1, 0, 2]) == [False, True, False]
    assert _same(followed.propose([("r", 8)])[0], whole.propose([("r", 8)])[0])
    assert followed.follow_rows(["r"], rows.astype(np.int64), lengths.astype(np.int64), [0]) == [True]
    rows[0, len(ids):len(ids) + 2] = [7, 8]  # the engine committed two more tokens
    lengths[0] += 2
    assert followed.follow_rows(["r"], rows, lengths, [0]) == [True]
    whole.add_tokens("r", [7, 8])
    assert _same(followed.propose([("r", 8)])[0], whole.propose([("r", 8)])[0])


def test_follow_rows_gives_each_row_one_request_and_each_request_one_row(eval_prompts):
    """Pairs are tried in order: twins (the same tokens) both prefix both rows, yet each row takes the first request
    that fits it and each request the first row; a pair of a request not active, or out of the arrays, is refused."""
    ids = [int(t) for t in eval_prompts[0].token_ids]
    rows = np.zeros((2, len(ids) + 4), np.int64)
    rows[:, :len(ids)] = ids
    rows[0, len(ids)], rows[1, len(ids):len(ids) + 2] = 5, [6, 7]
    lengths = np.array([len(ids) + 1, len(ids) + 2], np.int64)
    service, _ = merged(None)
    for rid in ("a", "b"):
        service.start_request(rid, ids)
    pairs = [("a", 1), ("b", 1), ("a", 0), ("b", 0), ("gone", 0)]
    assert service.follow_rows([r for r, _ in pairs], rows, lengths, [i for _, i in pairs]) == \
        [True, False, False, True, False]
    assert service.tokens("a").tolist() == ids + [6, 7] and service.tokens("b").tolist() == ids + [5]
    with pytest.raises(ValueError, match="2 req_ids for 1 rows"):
        service.follow_rows(["a", "b"], rows, lengths, [0])
    with pytest.raises(InvalidContext, match="pass a sequence of row numbers"):
        service.follow_rows(["a"], rows, lengths, [0.0])  # type: ignore[list-item]


def test_one_round_trip_a_step_with_the_live_layer_on(database_url, tokenizer, live_ds, sharegpt_sample, eval_prompts):
    build_small(database_url, live_ds, sharegpt_sample)
    writer = LiveWriter(live_ds, database_url)
    seqs = [list(p.token_ids) for p in eval_prompts]
    for s in seqs:
        writer.append(s)
    assert writer.flush(30)
    writer.close()
    compact_live(live_ds, top_t=1000, database_url=database_url)
    method = MergedMethod.open(live_ds, tokenizer=tokenizer, database_url=database_url, cache_bytes=0, replicas=False)
    service = DraftingService(method, vocab_size=len(tokenizer))
    try:
        assert method.lookups is not None
        client = cast(SharedDatastore, method.lookups.client)
        assert client is not None and client.live is not None  # the layer is served with the datastore
        for i, s in enumerate(seqs):
            service.start_request(i, s[:10])
        for step in range(10, 40):
            trips = client.round_trips
            drafts = service.propose([(i, 8) for i in range(len(seqs))])
            assert client.round_trips - trips == 1  # the datastore and the live layer: one query
            assert any(len(d) for d in drafts)
            for i, s in enumerate(seqs):
                service.add_tokens(i, s[step:step + 1])
    finally:
        service.close()


def test_service_appends_its_outputs_and_drafts_from_the_layer(database_url, tokenizer, live_ds, sharegpt_sample):
    writer = LiveWriter(live_ds, database_url)
    service, _ = merged(None, live_writer=writer)
    output = [900, 901, 902, 903, 904, 905, 906, 907]
    service.start_request("a", [1, 2, 3])
    service.add_tokens("a", output[:3])
    service.add_tokens("a", output[3:])
    service.stop_request("a")
    assert writer.flush(30)
    writer.close()
    compact_live(live_ds, top_t=1000, database_url=database_url)
    build_small(database_url, live_ds, sharegpt_sample)
    for replicas in (False, True):
        layered = DatastoreSource(functools.partial(SharedDatastore.open, live_ds, tokenizer=tokenizer,
                                                    database_url=database_url, live=live_name(live_ds),
                                                    replicas=replicas))
        plain = DatastoreSource(functools.partial(SharedDatastore.open, live_ds, tokenizer=tokenizer,
                                                  database_url=database_url, replicas=replicas))
        try:
            if replicas:
                for s in (layered, plain):
                    client = cast(SharedDatastore, s.client)
                    assert client.replicas is not None and client.replicas.wait_ready(60)
            with_live, live_method = merged(layered, sources=("live",))  # the live layer's drafts alone
            without, _ = merged(plain, sources=("live",))
            context = [7, 8, 900, 901, 902]
            for svc in (with_live, without):
                svc.start_request("b", context)
            draft = with_live.propose([("b", 4)], chain=True)[0]
            assert draft.token_ids.tolist() == output[3:7]  # the model's earlier output continues the context
            assert len(without.propose([("b", 4)], chain=True)[0]) == 0  # no layer, no draft
            assert (live_method.stats.replica_steps > 0) == replicas
        finally:
            layered.close()
            plain.close()
