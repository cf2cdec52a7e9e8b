"""An engine's batch by request id (:class:`drafting.EngineBatch`): stopping, starting, following and drafting in one
native call a step draft what the library's step drafts for the same contexts, through starts, finishes, reordered
rows and preemption (a request absent from the batch, then back); a row that does not extend its request is started
again from it; a row holding an id outside the vocabulary drafts nothing and fails no other row; finished outputs go to
the live layer's writer under their datastore's name; and a request's datastore set (its own and the shared one) drafts
the better of what each datastore alone drafts, by the round trip and the replicas alike. Real datastores, real
tokens."""

from __future__ import annotations

import uuid
from typing import cast

import numpy as np
import pytest

from datastore.shared import SharedDatastore
from drafting import DatastoreCatalog, DatastoreSource, Draft, DraftingService

VOCAB = 49_152


def _same(a: Draft, b: Draft) -> bool:
    return (np.array_equal(a.token_ids, b.token_ids) and np.array_equal(a.parents, b.parents)
            and a.scores.tobytes() == b.scores.tobytes())


class Sink:
    """Where a drafter hands finished outputs (the live layer's writer's protocol): kept, by datastore name."""

    def __init__(self) -> None:
        self.got: list[tuple[str | None, list[int]]] = []

    def append(self, tokens, name=None) -> bool:
        self.got.append((name, list(tokens)))
        return True

    def close(self) -> None:
        pass


def _source(name: str, tokenizer, url: str, replicas: bool) -> DatastoreSource:
    source = DatastoreSource(lambda: SharedDatastore.open(name, tokenizer=tokenizer, database_url=url,
                                                          replicas=replicas))
    client = cast(SharedDatastore, source.client)
    assert not replicas or (client.replicas is not None and client.replicas.wait_ready(120))
    return source


def _rows(seqs: dict[int, list[int]], order: list[str], ids: dict[str, int], width: int):
    tokens, lengths = np.zeros((8, width), np.int32), np.zeros(8, np.int32)
    for r, rid in enumerate(order):
        s = seqs[ids[rid]]
        tokens[r, :len(s)], lengths[r] = s, len(s)
    return tokens, lengths


@pytest.mark.parametrize("chain", [True, False], ids=["chains", "trees"])
def test_the_engine_batch_drafts_what_the_library_drafts(chain, chat_datastore, database_url, tokenizer,
                                                         eval_prompts):
    """Six requests over 12 steps: new ones join (started from their rows), finished ones leave (their outputs handed
    on), the rows are reordered, and one request is preempted (absent for two steps, then back with the tokens it
    had): every row's draft is what the library's step drafts from the same request's tokens, bit for bit."""
    source = _source(chat_datastore, tokenizer, database_url, replicas=False)
    sink = Sink()
    service = DraftingService(source, vocab_size=VOCAB, outputs_bytes=0, live_writer=sink, online_strength=0.0)
    alone = DraftingService(source, vocab_size=VOCAB, outputs_bytes=0, online_strength=0.0)
    engine = service.engine_batch(chain=chain)
    texts = [[int(t) for t in p.token_ids] for p in eval_prompts] * 2
    seqs = {i: t[:24] for i, t in enumerate(texts)}
    ids = {f"req-{i}": i for i in range(len(texts))}
    live = ["req-0", "req-1", "req-2"]
    width = max(map(len, texts)) + 4
    finished: set[str] = set()
    compared = 0
    for step in range(12):
        if step == 3:
            live += ["req-3", "req-4"]  # new requests join the batch
        if step == 5:
            finished.add(live.pop(0))  # req-0 finishes
        if step == 6:
            held = live.pop(1)  # preempted: out of the batch, its state kept
        if step == 8:
            live.append(held)  # back, its tokens as it left them
        if step == 9:
            live = live[::-1]  # the engine reorders its rows
        for rid in live:
            seqs[ids[rid]] = texts[ids[rid]][:24 + step]
        tokens, lengths = _rows(seqs, live, ids, width)
        budgets = np.full(len(live), 8, np.int64)
        made = engine.step(live, tokens, lengths, budgets, finished=finished)
        finished = set()
        for rid, got in zip(live, made.drafts):
            key = f"{rid}@{step}"
            alone.start_request(key, seqs[ids[rid]])
            want = alone.step([key], [8], chain=chain).drafts[0]
            assert _same(got, want), (rid, step)
            compared += len(want) > 0
        assert service.active_requests == set(live) | ({held} if 6 <= step < 8 else set())
    assert compared > 30 and engine.resynced == 0
    # req-0's output (what it generated until it finished: the 4 steps after its prompt), for the writer's own layer
    assert sink.got == [(None, texts[0][24:24 + 4])]
    source.close()


def test_a_row_that_does_not_extend_its_request_is_started_again_and_a_bad_id_fails_no_other_row(
        chat_datastore, database_url, tokenizer, eval_prompts, caplog):
    source = _source(chat_datastore, tokenizer, database_url, replicas=False)
    service = DraftingService(source, vocab_size=VOCAB, outputs_bytes=0, online_strength=0.0)
    alone = DraftingService(source, vocab_size=VOCAB, outputs_bytes=0, online_strength=0.0)
    engine = service.engine_batch()
    a, b = ([int(t) for t in p.token_ids] for p in eval_prompts[:2])
    tokens, lengths = np.zeros((2, 512), np.int32), np.array([30, 30], np.int32)
    tokens[0, :30], tokens[1, :30] = a[:30], b[:30]
    engine.step(["a", "b"], tokens, lengths, np.full(2, 8, np.int64))
    tokens[0, :30] = b[:30]  # row 0 now holds another sequence under the same id: started again from it
    tokens[1, 30], lengths[1] = VOCAB + 5, 31  # row 1 holds an id outside the vocabulary
    made = engine.step(["a", "b"], tokens, lengths, np.full(2, 8, np.int64))
    assert engine.resynced == 1 and engine.bad_rows == 1 and made.followed == [True, False]
    assert len(made.drafts[1]) == 0 and service.tokens("b").tolist() == b[:30]  # nothing followed
    alone.start_request("x", b[:30])
    assert _same(made.drafts[0], alone.step(["x"], [8], chain=True).drafts[0])
    assert caplog.text.count("outside the vocabulary") == 1
    engine.step(["a", "b"], tokens, lengths, np.full(2, 8, np.int64))  # told once
    assert caplog.text.count("outside the vocabulary") == 1
    source.close()


@pytest.fixture(scope="module")
def code_store(database_url, code_sample):
    """A small datastore of real Python source (a slice of the standard library)."""
    from datastore.admin.catalog import drop_datastore
    from ingest.build import BuildConfig, build_datastore

    name = f"test-code-{uuid.uuid4().hex[:8]}"
    build_datastore(BuildConfig(name=name, path=code_sample, source="code", top_t=20_000, database_url=database_url),
                    progress=False)
    yield name
    drop_datastore(database_url, name)


def _gain(d: Draft) -> float:
    return float(d.scores.sum())


@pytest.mark.parametrize("replicas", [False, True], ids=["round trip", "replica"])
def test_a_request_drafts_the_better_of_its_datastores(replicas, chat_datastore, code_store, database_url, tokenizer,
                                                       eval_prompts):
    """A request naming the code datastore with the shared chat one on drafts, row by row, the better (by expected
    accepted length) of what each datastore alone drafts where both hold a suffix of its context (their candidates
    compete in one draft; ties go to its own), else what the one that holds one drafts; one with the shared one off
    drafts what the code datastore alone drafts, and one naming nothing drafts what the shared one drafts; by the round
    trip and the replicas, bit for bit alike."""

    def connect(name: str) -> SharedDatastore:
        return SharedDatastore.open(name, tokenizer=tokenizer, database_url=database_url, replicas=replicas)

    chat = _source(chat_datastore, tokenizer, database_url, replicas)
    catalog = DatastoreCatalog(chat, chat_datastore, connect=connect, allowed=[code_store])
    service = DraftingService(catalog, vocab_size=VOCAB, outputs_bytes=0)
    code_only = DraftingService(_source(code_store, tokenizer, database_url, replicas), vocab_size=VOCAB,
                                outputs_bytes=0)
    chat_only = DraftingService(chat, vocab_size=VOCAB, outputs_bytes=0)
    service.start_request("warm", [1, 2], datastore=code_store)  # the first naming opens it, in the background
    _wait_open(catalog, code_store, replicas)
    compared = chose_code = chose_chat = 0
    code_client, chat_client = (SharedDatastore.open(n, tokenizer=tokenizer, database_url=database_url, replicas=False)
                                for n in (code_store, chat_datastore))
    for i, p in enumerate(eval_prompts):
        ids = [int(t) for t in p.token_ids]
        for cut in range(20, len(ids), 7):
            context = ids[:cut]
            keys = [f"{i}.{cut}.{k}" for k in ("both", "code", "chat")]
            service.start_request(keys[0], context, datastore=code_store)
            service.start_request(keys[1], context, datastore=code_store, shared=False)
            service.start_request(keys[2], context)
            for budget, chain in ((8, True), (48, False)):
                got = service.step(keys, [budget] * 3, chain=chain).drafts
                code_only.start_request("c", context)
                chat_only.start_request("s", context)
                c = code_only.step(["c"], [budget], chain=chain).drafts[0]
                s = chat_only.step(["s"], [budget], chain=chain).drafts[0]
                code_only.stop_request("c")
                chat_only.stop_request("s")
                has_c, has_s = (bool(client.retrieve_batch([context[-32:]], [not chain])[0].candidates)
                                for client in (code_client, chat_client))
                want = c if has_c and (not has_s or _gain(c) >= _gain(s)) else s
                assert _same(got[0], want), (i, cut, budget)
                assert _same(got[1], c) and _same(got[2], s), (i, cut, budget)
                compared += 1
                chose_code += has_c and has_s and _gain(c) > _gain(s)
                chose_chat += has_c and has_s and _gain(c) < _gain(s)
    assert compared > 20 and chose_code and chose_chat  # each datastore won some rows
    service.close()
    code_only.close()
    code_client.close()
    chat_client.close()


def _wait_open(catalog: DatastoreCatalog, name: str, replicas: bool, timeout: float = 120) -> None:
    import time

    deadline = time.monotonic() + timeout
    while catalog.resolve(name) == 0 or (replicas and catalog.stores() is None):
        assert time.monotonic() < deadline, f"{name} did not open"
        time.sleep(0.05)
