"""Speculative sampling keeps the target's distribution exact (statistical tests on a small vocabulary)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from datastore.tree import TokenTree
from decoder import speculative_generate
from decoder.model import TargetModel
from decoder.verify import accept_sampled
from drafting import Draft, ScoreKind, TokenDrafter

VOCAB = 6


def test_accept_sampled_matches_target_distribution():
    """First two tokens after a 2-level tree: chi-square against the exact target distribution."""
    gen = torch.Generator().manual_seed(0)
    draft = Draft(np.array([2, 0, 4, 1]), np.array([-1, -1, 0, 0], dtype=np.int32), np.ones(4))  # 2 -> {4, 1}; 0
    tokens = draft.token_ids
    probs = torch.softmax(torch.randn(5, VOCAB, generator=gen, dtype=torch.float64) * 1.5, -1)
    # exact joint of (first, second) when the second only matters after token 2 (node 0)
    draws = 30_000
    counts = np.zeros((VOCAB, VOCAB + 1))
    for _ in range(draws):
        path, bonus = accept_sampled(draft, probs, gen)
        seq = [int(tokens[i]) for i in path] + [bonus]
        first = seq[0]
        second = seq[1] if first == 2 and len(seq) > 1 else VOCAB  # VOCAB: "not observed"
        counts[first, second] += 1
    expected = np.zeros_like(counts)
    for a in range(VOCAB):
        if a == 2:
            expected[a, :VOCAB] = probs[0, a].item() * probs[1].numpy()
        else:
            expected[a, VOCAB] = probs[0, a].item()
    mask = expected > 0
    _, pvalue = stats.chisquare(counts[mask], expected[mask] * draws)
    assert pvalue > 1e-3


class _FixedTree(TokenDrafter):
    """A drafter that always proposes the same small tree (a test input, not a stand-in for a real part)."""

    name = "fixed"
    score_kind = ScoreKind.COUNT_RATIO

    def __init__(self, tree):
        super().__init__(vocab_size=VOCAB)
        self.tree = Draft.from_tree(tree).top(16)

    def draft(self, state, tokens, budget, chain) -> Draft:
        return self.tree


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here: the CUDA run of this test needs a GPU"))]


@pytest.fixture(scope="module", params=DEVICES)
def tiny_target(request):
    """A real (randomly initialized) Llama with a 6-token vocabulary, on each device."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # a peaked, far-from-uniform distribution
    model.generation_config.eos_token_id = None
    device = torch.device(request.param)
    return TargetModel(model.to(device), None, "tiny-llama", device, torch.float32)


@pytest.mark.slow
@torch.inference_mode()
def test_sampled_generation_has_the_target_distribution(tiny_target):
    prompt = [1, 3]
    steps = 3
    logits_cache = {}

    def target_probs(seq):
        key = tuple(seq)
        if key not in logits_cache:
            ids = torch.tensor([list(seq)], device=tiny_target.device)
            out = tiny_target.model(input_ids=ids).logits[0, -1].double()
            logits_cache[key] = torch.softmax(out / 0.8, -1).cpu().numpy()
        return logits_cache[key]

    exact = {}
    for seq in itertools.product(range(VOCAB), repeat=steps):
        p = 1.0
        for i in range(steps):
            p *= target_probs(prompt + list(seq[:i]))[seq[i]]
        exact[seq] = p
    tree = TokenTree(np.array([2, 5, 1, 2], np.uint32), np.array([-1, 0, -1, 2], np.int32),
                     np.array([5, 3, 4, 2], np.uint32), 10)
    draws = 6000
    seen: dict[tuple[int, ...], int] = {}
    for i in range(draws):
        res = speculative_generate(tiny_target, prompt, _FixedTree(tree),
                                   max_new_tokens=steps, temperature=0.8,
                                   seed=i, budget=16)
        key = tuple(res.output_ids)
        seen[key] = seen.get(key, 0) + 1
    keys = [k for k, p in exact.items() if p * draws >= 5]
    observed = np.array([seen.get(k, 0) for k in keys] + [draws - sum(seen.get(k, 0) for k in keys)])
    expected = np.array([exact[k] * draws for k in keys] + [draws * (1 - sum(exact[k] for k in keys))])
    _, pvalue = stats.chisquare(observed, expected)
    assert pvalue > 1e-3
