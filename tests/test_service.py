"""The drafting service (the merged drafter): a batch drafts what each request drafts alone, in one round trip, on
either client; chains that are the trees' most probable paths; drafts without the datastore on every datastore
fault; many threads at once. Real datastore, real tokens (evaluation prompts as the sequences; no model needed to check
drafts)."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from datastore import Datastore
from datastore.shared import SharedDatastore
from decoder import Draft
from decoder.core import default_core
from decoder.draft import ScoreKind
from decoder.drafters import DatastoreSource
from decoder.service import DraftingService

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/none"
BUDGETS = (1, 3, 8, 32)


def _steps(prompt_ids, split: float = 0.5, chunk: int = 2):
    """A request's life from a real token sequence: its first half as the prompt, the rest committed
    ``chunk`` tokens at a time."""
    ids = [int(t) for t in prompt_ids]
    cut = max(4, int(len(ids) * split))
    return ids[:cut], [ids[i:i + chunk] for i in range(cut, len(ids), chunk)]


def _same(a: Draft, b: Draft) -> bool:
    return (np.array_equal(a.token_ids, b.token_ids) and np.array_equal(a.parents, b.parents)
            and np.allclose(a.scores, b.scores))


@pytest.fixture
def shared_source(chat_datastore, database_url, tokenizer):
    source = DatastoreSource(lambda: SharedDatastore.open(chat_datastore, tokenizer=tokenizer,
                                                          database_url=database_url))
    yield source
    source.close()


def test_a_batch_drafts_what_each_request_drafts_alone(shared_source, chat_datastore, database_url, tokenizer,
                                                      eval_prompts):
    """Batched through the shared client (one round trip a step) = one request at a time through the plain client."""
    service = DraftingService(shared_source)
    plain = DatastoreSource(lambda: Datastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url))
    alone = DraftingService(plain)
    lives = []
    for i, p in enumerate(eval_prompts):
        prompt, chunks = _steps(p.token_ids)
        service.start_request(i, prompt)
        alone.start_request(i, prompt)
        lives.append(chunks)
    budgets = itertools.cycle(BUDGETS)
    compared = nonempty = 0
    for step in range(max(map(len, lives))):
        live = [i for i in range(len(lives)) if step < len(lives[i])]
        batch = [(i, next(budgets)) for i in live]
        trips = shared_source.client.round_trips
        drafts = service.propose(batch)
        assert shared_source.client.round_trips - trips <= 1  # one round trip for the whole batch
        for (i, budget), draft in zip(batch, drafts):
            assert len(draft) <= budget and draft.score_kind is ScoreKind.PROBABILITY
            assert _same(draft, alone.propose([(i, budget)])[0])
            compared += 1
            nonempty += len(draft) > 0
            service.add_tokens(i, lives[i][step])
            alone.add_tokens(i, lives[i][step])
    assert compared > 100 and nonempty > compared // 2
    assert service.stats.steps == max(map(len, lives)) and service.stats.lookup_s > 0
    plain.close()


def test_chains_are_the_merged_trees_best_paths(shared_source, eval_prompts):
    tree_service = DraftingService(shared_source, back_off_min_budget=10**9)  # the longest match, as chains use
    chain_service = DraftingService(shared_source, min_score=0.1)
    prompt, chunks = _steps(eval_prompts[-1].token_ids)  # code: long copies from the prompt
    for svc in (tree_service, chain_service):
        svc.start_request("r", prompt)
    longest = exact = steps = 0
    for chunk in chunks:
        tree = tree_service.propose([("r", 10_000)])[0]
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
    assert down.client is None and down.faults
    faulty, without = DraftingService(down), DraftingService(None)
    for svc in (faulty, without):
        for i, p in enumerate(eval_prompts):
            svc.start_request(i, _steps(p.token_ids)[0])
    for chain in (False, True):
        batch = [(i, 5) for i in range(len(eval_prompts))]
        a, b = faulty.propose(batch, chain=chain), without.propose(batch, chain=chain)
        assert all(_same(x, y) for x, y in zip(a, b)) and any(len(x) for x in a)


def test_threads_get_the_drafts_of_a_serial_run(shared_source, eval_prompts):
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
    serial = run(DraftingService(shared_source, core=default_core(outputs_bytes=0)), range(len(lives)))
    shared = DraftingService(shared_source, core=default_core(outputs_bytes=0))
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


def test_lifecycle_errors(shared_source):
    service = DraftingService(shared_source)
    service.start_request("a", [1, 2, 3])
    with pytest.raises(ValueError, match="already active"):
        service.start_request("a", [1, 2, 3])
    with pytest.raises(KeyError, match="start_request"):
        service.propose([("b", 3)])
    with pytest.raises(KeyError, match="start_request"):
        service.add_tokens("b", [4])
    with pytest.raises(ValueError, match="budgets"):
        service.propose([("a", -1)])
    assert len(service.propose([("a", 0)])[0]) == 0
    service.stop_request("a")
    service.stop_request("a")  # ignored
    assert not service.active_requests
    with pytest.raises(ValueError, match="min_score"):
        DraftingService(None, min_score=2.0)
    with pytest.raises(ValueError, match="probability"):
        service.propose([("a", 3)], min_score=-0.1)


def test_background_reopen_never_blocks_a_lookup(chat_datastore, database_url, tokenizer, eval_prompts):
    """While the backend is reopened (here an opener that takes 1.5 s, as a slow server would), every lookup
    answers at once with no draft; once it is open, lookups draft from it."""
    import time

    url = [UNREACHABLE]  # down at first, then up

    def slow_open() -> SharedDatastore:
        if url[0] != UNREACHABLE:
            time.sleep(1.5)
        return SharedDatastore.open(chat_datastore, tokenizer=tokenizer, database_url=url[0])

    source = DatastoreSource(slow_open, retry_s=0.0, reopen_in_background=True)
    context = list(eval_prompts[0].token_ids)
    assert source.client is None and source.lookup(context) is None
    url[0] = database_url
    deadline = time.monotonic() + 20
    found, misses, slowest = None, 0, 0.0
    while found is None and time.monotonic() < deadline:
        t = time.perf_counter()
        found = source.lookup(context)
        if found is None:
            misses += 1
            slowest = max(slowest, time.perf_counter() - t)
        time.sleep(0.01)
    assert found is not None and source.faults["DatabaseUnavailable"] >= 1
    assert misses >= 10 and slowest < 0.5  # a miss never waited for the 1.5 s reopen
    source.close()
