"""Losslessness on real prompts for every drafter, the replay simulator against real runs, datastore loss."""

from __future__ import annotations

import logging

import pytest
import torch

from datastore import Datastore
from decoder import (DatastoreDrafter, DatastoreSource, FixedBudget, MergedDrafter, NoDrafter, PromptLookupDrafter,
                     TrieDrafter, greedy_generate, speculative_generate)
from decoder.simulate import replay

MAX_NEW = 40


@pytest.fixture(scope="module")
def source(chat_datastore, database_url, tokenizer):
    src = DatastoreSource(lambda: Datastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url))
    yield src
    src.close()


@pytest.fixture(scope="module")
def references(target, eval_prompts):
    """``model.generate(do_sample=False)`` outputs, the lossless reference."""
    out = {}
    for p in eval_prompts:
        ids = torch.tensor([p.token_ids])
        gen = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=MAX_NEW, pad_token_id=target.tokenizer.eos_token_id)
        out[p.id] = gen[0, len(p.token_ids):].tolist()
    return out


def drafters(source):
    return [NoDrafter(), PromptLookupDrafter(), TrieDrafter(), DatastoreDrafter(source), MergedDrafter(source)]


def test_plain_greedy_loop_equals_generate(target, eval_prompts, references):
    for p in eval_prompts:
        assert greedy_generate(target, p.token_ids, max_new_tokens=MAX_NEW).output_ids == references[p.id]


@pytest.mark.parametrize("budget", [3, 24])
def test_every_drafter_is_lossless(target, eval_prompts, references, source, budget):
    accepted_more = 0
    for p in eval_prompts:
        for d in drafters(source):
            res = speculative_generate(target, p.token_ids, d, max_new_tokens=MAX_NEW, budget=FixedBudget(budget))
            assert res.output_ids == references[p.id], (p.id, d.name)
            assert sum(s.accepted for s in res.steps) + 1 == len(res.output_ids)
            accepted_more += res.accept_length > 1.0
    assert accepted_more >= len(eval_prompts)  # the drafts were actually used, not all rejected


def test_replay_equals_real_runs(target, eval_prompts, references, source):
    for p in eval_prompts:
        for d in (TrieDrafter(), MergedDrafter(source), PromptLookupDrafter()):
            real = speculative_generate(target, p.token_ids, d, max_new_tokens=MAX_NEW, budget=FixedBudget(8))
            sim = replay(d, p.token_ids, references[p.id], FixedBudget(8))
            assert sim.accepted == [s.accepted for s in real.steps], (p.id, d.name)
            assert sim.drafted == [s.drafted for s in real.steps], (p.id, d.name)


class _KillAfter:
    """Wraps a drafter and terminates the datastore's server connection after a few proposals."""

    def __init__(self, inner, source, database_url, after=3):
        self.inner, self.source, self.url, self.after, self.calls = inner, source, database_url, after, 0
        self.name = inner.name

    def begin(self, prompt_ids):
        self.inner.begin(prompt_ids)

    def propose(self, budget):
        self.calls += 1
        if self.calls == self.after:
            import psycopg

            pid = self.source.client._conn.info.backend_pid
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        return self.inner.propose(budget)

    def extend(self, tokens):
        self.inner.extend(tokens)

    def end(self):
        self.inner.end()


def test_datastore_loss_mid_generation(target, eval_prompts, references, chat_datastore, database_url, tokenizer,
                                       caplog):
    src = DatastoreSource(lambda: Datastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url),
                          retry_s=3600.0)
    p = eval_prompts[0]
    with caplog.at_level(logging.WARNING):
        res = speculative_generate(target, p.token_ids, _KillAfter(MergedDrafter(src), src, database_url),
                                   max_new_tokens=MAX_NEW, budget=FixedBudget(8))
    assert res.output_ids == references[p.id]
    assert src.failures == 1 and src.client is None  # lost once, then not retried within retry_s
    assert sum("unreachable" in r.getMessage() for r in caplog.records) == 1  # warned once
    # with retry_s=0 the next lookup reconnects
    src.retry_s = 0.0
    assert src.lookup(list(p.token_ids)) is not None or src.client is not None
    src.close()
