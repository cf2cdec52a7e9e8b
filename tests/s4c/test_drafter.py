"""Drafting with the heads: the incremental heads (each head's cache of committed positions) compute what the parallel
training pass computes; the continuous verification tree's shape; S4C and merged+S4C lossless in the HF loop, and
replayed exactly as they run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from decoder import greedy_generate, speculative_generate
from drafting import DraftingService, MergedMethod
from drafting.calibration import Calibration
from drafting.heads import HeadTree
from drafting.method import Step
from evaluation.simulate import replay
from s4c import HeadsSource, S4CMethod, TreeShape, load_heads, merged_s4c, s4c_drafter
from s4c.features import reference_states, target_features
from s4c.state import HeadState, add_features, advance, top
from s4c.tree import candidate_tree
from support import tiny_heads

MAX_NEW = 24


@torch.no_grad()
def test_heads_advanced_step_by_step_equal_the_parallel_pass(target, eval_prompts):
    """Advancing over committed positions a few at a time (each head's keys and values cached) gives, at the last
    position, the features and logits the training pass computes for all positions at once."""
    heads = tiny_heads(target, num_heads=3)
    tokens = list(eval_prompts[0].token_ids)[:40]
    feats = target_features(target, tokens)
    outs: list = []

    def keep(k: int, g: torch.Tensor) -> torch.Tensor:
        outs.append(g[0])
        return (g @ heads.lm_head.T).argmax(-1)

    heads(torch.tensor([tokens]), feats[None], keep)
    state = HeadState()
    ids = np.asarray(tokens, np.uint32)
    for end in (7, 8, 20, 40):  # commit tokens up to `end`, features of all but the last
        add_features(state, feats[state.num_features: end - 1])
        advance(heads, state, ids[state.done:end], end)
        assert state.done == end - 1
        for k, (g, logits) in enumerate(state.last):
            assert torch.allclose(g, outs[k][end - 2], atol=1e-4), (end, k)
            assert torch.allclose(logits, outs[k][end - 2] @ heads.lm_head.T, atol=1e-3)


def test_the_tree_continues_the_top_branches_through_every_head(target, eval_prompts):
    heads = tiny_heads(target, num_heads=3)
    tokens = list(eval_prompts[0].token_ids)[:30]
    state = HeadState()
    add_features(state, target_features(target, tokens)[:-1])
    shape = TreeShape(widths=(5, 3, 2), branches=2)
    advance(heads, state, np.asarray(tokens, np.uint32), len(tokens), shape.branches)
    tree = candidate_tree(heads, state, shape)
    depths = np.ones(len(tree), int)
    for i, p in enumerate(tree.parents.tolist()):
        depths[i] = 1 if p < 0 else depths[p] + 1
    assert len(tree) == shape.nodes == 5 + 2 * (3 + 2)
    assert (depths == 1).sum() == 5 and (depths == 2).sum() == 6 and (depths == 3).sum() == 4
    assert set(tree.parents[depths == 2].tolist()) == {0, 1}  # head 1's top-2 continue
    first = torch.softmax(state.last[0][1].double(), -1).topk(5)
    assert tree.token_ids[:5].tolist() == first.indices.tolist()
    assert np.allclose(tree.probs[:5], first.values.numpy())
    with pytest.raises(ValueError, match="branches"):
        TreeShape(widths=(2, 2), branches=3)


@torch.no_grad()
def test_the_other_branches_are_the_heads_run_on_other_tokens(target, eval_prompts):
    """Each other branch, computed in the same pass as the committed positions, equals its head run alone on that
    branch's input after the cached positions before it."""
    heads = tiny_heads(target, num_heads=3)
    tokens = list(eval_prompts[1].token_ids)[:33]
    feats = target_features(target, tokens)
    state = HeadState()
    ids = np.asarray(tokens, np.uint32)
    add_features(state, feats[:19])
    advance(heads, state, ids[:20], 20, 3)
    add_features(state, feats[19:32])
    advance(heads, state, ids[state.done:], len(tokens), 3)
    t = len(tokens) - 2
    _, firsts = top(state.last[0][1], 3, heads.draft_head)
    for b, token in enumerate(firsts[1:]):
        e, f = heads.embed(torch.tensor([token])), state.last[0][0][None]
        for k in (1, 2):
            head = heads.blocks[k]
            g, _, _ = head.layer.step(head.inputs(e, f)[None], torch.tensor([[t]]), state.caches[k], t)
            want = heads.draft_head.logits(g[0])[0]
            got_g, got = state.others[k][b]
            assert torch.allclose(got_g, g[0, 0], atol=1e-4) and torch.allclose(got, want, atol=1e-3), (b, k)
            e, f = heads.embed(heads.draft_head.tokens(want.argmax()[None])), g[0]


@pytest.fixture(scope="module")
def shipped(target):
    return load_heads(target)


def test_s4c_is_lossless_and_its_replay_is_its_run(target, eval_prompts, shipped):
    drafter = s4c_drafter(shipped, vocab_size=len(target.tokenizer))
    accepted = 0
    for p in eval_prompts[:4]:
        base = greedy_generate(target, p.token_ids, max_new_tokens=MAX_NEW).output_ids
        for budget, chain in ((8, False), (3, True)):
            run = speculative_generate(target, p.token_ids, drafter, max_new_tokens=MAX_NEW, budget=budget,
                                       chain=chain)
            assert run.output_ids == base, (p.id, budget)
            states = reference_states(target, list(p.token_ids) + base)
            sim = replay(drafter, p.token_ids, base, budget, chain=chain, hidden=states)
            assert [s.accepted for s in sim.steps] == [s.accepted for s in run.steps], (p.id, budget)
            accepted += sum(s.accepted - 1 for s in run.steps)
    assert accepted > 0 and drafter.active_requests == frozenset()


def test_s4c_samples_and_drafts_nothing_without_hidden_states(target, eval_prompts, shipped):
    source = HeadsSource(shipped)
    drafter = DraftingService(S4CMethod(source), vocab_size=len(target.tokenizer))
    p = eval_prompts[0]
    run = speculative_generate(target, p.token_ids, drafter, max_new_tokens=8, budget=6, temperature=0.8, seed=3)
    assert len(run.output_ids) == 8
    drafter.start_request("r", list(p.token_ids))
    assert len(drafter.propose([("r", 8)])[0]) == 0 and source.stats.unready == 1
    with pytest.raises(ValueError, match=r"\[n, 576\] float hidden states"):
        drafter.add_hidden_states("r", torch.zeros(3, 7))
    with pytest.raises(TypeError, match="torch.Tensor or numpy array"):
        drafter.add_hidden_states("r", [[0.0] * 576])
    with pytest.raises(KeyError, match="not active"):
        drafter.add_hidden_states("other", torch.zeros(1, 576))
    with pytest.raises(ValueError, match="reads the target's hidden states"):
        replay(drafter, p.token_ids, [1, 2, 3], 4)


def test_merged_s4c_is_lossless_and_takes_the_heads_trees(target, eval_prompts, shipped):
    def fresh() -> DraftingService:
        return merged_s4c(None, shipped, vocab_size=len(target.tokenizer))

    # one drafter decodes, another replays: each has indexed the same earlier outputs (never the prompt's own)
    merged, replayed = fresh(), fresh()
    for p in eval_prompts[:3]:
        base = greedy_generate(target, p.token_ids, max_new_tokens=MAX_NEW).output_ids
        run = speculative_generate(target, p.token_ids, merged, max_new_tokens=MAX_NEW, budget=8)
        assert run.output_ids == base
        sim = replay(replayed, p.token_ids, base, 8, hidden=reference_states(target, list(p.token_ids) + base))
        assert [s.accepted for s in sim.steps] == [s.accepted for s in run.steps]
    assert merged.name == "merged+s4c" and merged.hidden_states and merged.step_seconds()["heads"] > 0


class _FixedHeads:
    """A draft model's source that gives every row the same tree (a test input, not a stand-in for the heads)."""

    name = "fixed"

    def __init__(self, tree: HeadTree) -> None:
        self.tree = tree

    def start(self) -> None:
        return None

    def add_hidden_states(self, state, hidden) -> None:
        """Nothing read."""

    def trees(self, step: Step) -> list[HeadTree | None]:
        return [self.tree if b > 0 else None for b in step.budgets.tolist()]

    def config(self) -> dict:
        return {"name": self.name}

    def step_seconds(self) -> dict[str, float]:
        return {}


def test_the_heads_are_one_more_source_of_the_merged_drafter(tokenizer):
    tree = HeadTree(np.array([3, 4]), np.array([-1, 0]), np.array([0.5, 0.25]))
    with pytest.raises(ValueError, match="not weighed by the calibration"):
        MergedMethod(None, sources=("ds", "heads"))
    with pytest.raises(ValueError, match="not weighed by the calibration"):
        MergedMethod(None, calibration=Calibration.load(), heads=_FixedHeads(tree))  # a calibration without them
    cal = Calibration(np.zeros(32), 0.0, sources=("ds", "live", "local", "outputs", "heads"))
    both = DraftingService(MergedMethod(None, calibration=cal, heads=_FixedHeads(tree)), vocab_size=len(tokenizer))
    assert both.name == "merged+fixed" and both.hidden_states
    both.start_request(1, [5, 6, 7])
    drafted = both.propose([(1, 4)])[0]
    assert drafted.token_ids.tolist() == [3, 4]  # the heads' tree alone: the only source with nodes
    assert len(both.propose([(1, 0)])[0]) == 0
    with pytest.raises(ValueError, match="parents are out of order"):
        HeadTree(np.array([3, 4]), np.array([1, -1]), np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match=r"probs must lie in \[0, 1\]"):
        HeadTree(np.array([3]), np.array([-1]), np.array([1.5]))


def test_s4c_is_thread_safe(target, eval_prompts, shipped):
    """Requests replayed on three threads at once by one drafter draft exactly what each drafts alone."""
    import threading

    drafter = s4c_drafter(shipped, vocab_size=len(target.tokenizer))
    cases = []
    for p in eval_prompts[:3]:
        base = greedy_generate(target, p.token_ids, max_new_tokens=MAX_NEW).output_ids
        cases.append((p, base, reference_states(target, list(p.token_ids) + base)))
    alone = [[s.accepted for s in replay(drafter, p.token_ids, base, 6, hidden=h).steps] for p, base, h in cases]
    together: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            p, base, h = cases[i]
            for _ in range(3):
                together[i] = [s.accepted for s in replay(drafter, p.token_ids, base, 6, hidden=h).steps]
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and [together[i] for i in range(len(cases))] == alone
    assert drafter.active_requests == frozenset()
