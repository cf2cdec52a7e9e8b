"""Losslessness on real prompts for every drafter, and the replay simulator against real runs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from benchmarks.peer_drafters import PromptLookup, RetrievalDrafter
from datastore import Datastore
from decoder import greedy_generate, speculative_generate
from drafting import DatastoreSource, Draft, Drafter, DraftingService, TokenDrafter
from evaluation.simulate import replay

MAX_NEW = 32


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


VOCAB = 49_152


class NoDraft(TokenDrafter):
    """Drafts nothing: plain decoding through the same loop."""

    name = "none"

    def draft(self, state, tokens, budget, chain) -> Draft:
        return Draft.empty()


def drafters(source, peers: bool = True) -> list[Drafter]:
    """Every kind of drafter: none, ours with and without the datastore, and (``peers``) the peers' (prompt lookup, the
    datastore's tree by its counts)."""
    local = DraftingService(None, vocab_size=VOCAB)
    local.name = "local"
    ours: list[Drafter] = [NoDraft(vocab_size=VOCAB), local, DraftingService(source, vocab_size=VOCAB)]
    if not peers:
        return ours
    return [*ours, PromptLookup(3, 10, "pld", vocab_size=VOCAB),
            RetrievalDrafter(source, name="datastore", vocab_size=VOCAB)]


def test_plain_greedy_loop_equals_generate(target, eval_prompts, references):
    for p in eval_prompts:
        assert greedy_generate(target, p.token_ids, max_new_tokens=MAX_NEW).output_ids == references[p.id]


@pytest.mark.parametrize("budget, peers", [(3, False), pytest.param(24, True, marks=pytest.mark.slow)])
def test_every_drafter_is_lossless(target, eval_prompts, references, source, budget, peers):
    """Ours at budget 3 in the first tier; the peers' drafters too, at 24, in the second (together over 30 s)."""
    saved: dict[str, int] = {}  # per drafter: verification steps saved over all prompts
    for p in eval_prompts:
        for d in drafters(source, peers):
            res = speculative_generate(target, p.token_ids, d, max_new_tokens=MAX_NEW, budget=budget)
            assert res.output_ids == references[p.id], (p.id, d.name)
            assert sum(s.accepted for s in res.steps) + 1 == len(res.output_ids)
            assert all(s.drafted <= budget for s in res.steps)
            saved[d.name] = saved.get(d.name, 0) + len(res.output_ids) - 1 - len(res.steps)
    assert saved["none"] == 0
    assert all(saved[d] > 0 for d in saved if d != "none"), saved  # every drafter's drafts were accepted


@pytest.mark.parametrize("name", ["merged", pytest.param("pld", marks=pytest.mark.slow)])
def test_replay_equals_real_runs(target, eval_prompts, references, source, name):
    makers: dict[str, Callable[[], Drafter]] = {"merged": lambda: DraftingService(source, vocab_size=VOCAB),
                                                "pld": lambda: PromptLookup(3, 10, "pld", vocab_size=VOCAB)}
    real_drafter, sim_drafter = makers[name](), makers[name]()  # each sees the same earlier outputs, in order
    for p in eval_prompts:
        real = speculative_generate(target, p.token_ids, real_drafter, max_new_tokens=MAX_NEW, budget=8)
        sim = replay(sim_drafter, p.token_ids, references[p.id], 8)
        assert [s.accepted for s in sim.steps] == [s.accepted for s in real.steps], p.id
        assert [s.drafted for s in sim.steps] == [s.drafted for s in real.steps], p.id
        assert sim.output_ids == real.output_ids


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here: the CUDA lossless run needs a GPU")
def test_lossless_on_cuda(eval_prompts, references, source):
    """fp32 on the GPU: every drafter's output equals the CPU's plain greedy output."""
    from decoder import load_target

    gpu = load_target(device="cuda")
    for p in eval_prompts:
        assert greedy_generate(gpu, p.token_ids, max_new_tokens=MAX_NEW).output_ids == references[p.id]
        for d in drafters(source):
            res = speculative_generate(gpu, p.token_ids, d, max_new_tokens=MAX_NEW, budget=8)
            assert res.output_ids == references[p.id], (p.id, d.name)
