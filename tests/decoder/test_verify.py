"""Tree attention against per-path causal forwards, and KV compaction, on the real model (fp32)."""

from __future__ import annotations

import numpy as np
import torch
from transformers import DynamicCache

from decoder.verify import keep_accepted_kv, tree_attention_inputs
from drafting.accept import accept_greedy, accepted_mask, reference_predictions
from drafting.draft import Draft

# a tree with two branches of different depths and a shared first token: root -> a -> {b -> c, d}; root -> e
TOKENS = np.array([504, 3365, 28, 1524, 253], dtype=np.int64)
PARENTS = np.array([-1, 0, 1, 0, -1], dtype=np.int32)
DRAFT = Draft(TOKENS, PARENTS, np.array([0.9, 0.8, 0.7, 0.6, 0.5]))


def _path(i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(i)
        i = int(PARENTS[i])
    return out[::-1]


def _tree_pass(target, ids: list[int]):
    """The prompt ``ids`` but its last token prefilled, then one verification pass of the last token and
    :data:`DRAFT`'s nodes: ``(cache, past, mask, pos, logits [1 + nodes, vocab])``."""
    model = target.model
    cache = DynamicCache(config=model.config)
    model(input_ids=torch.tensor([ids[:-1]]), past_key_values=cache)
    past = len(ids) - 1
    mask, pos = tree_attention_inputs(DRAFT, past, dtype=torch.float32, device=target.device)
    query = torch.tensor([[ids[-1]] + TOKENS.tolist()])
    logits = model(input_ids=query, attention_mask=mask, position_ids=pos, past_key_values=cache).logits[0]
    return cache, past, mask, pos, logits


@torch.inference_mode()
def test_tree_logits_equal_per_path_causal_forwards(target, tokenizer):
    model = target.model
    ids = tokenizer.encode("The capital of France is Paris. The capital of Italy is", add_special_tokens=False)
    _, past, mask, pos, tree_logits = _tree_pass(target, ids)
    assert mask.shape == (1, 1, 1 + len(TOKENS), past + 1 + len(TOKENS))
    assert pos.tolist() == [[past, past + 1, past + 2, past + 3, past + 2, past + 1]]
    ref_root = model(input_ids=torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(tree_logits[0], ref_root, atol=2e-4, rtol=1e-4)
    for node in range(len(TOKENS)):
        seq = ids + [int(TOKENS[j]) for j in _path(node)]
        ref = model(input_ids=torch.tensor([seq])).logits[0, -1]
        torch.testing.assert_close(tree_logits[1 + node], ref, atol=2e-4, rtol=1e-4)


@torch.inference_mode()
def test_kv_keeps_only_the_accepted_path(target, tokenizer):
    """After accepting a path that skips nodes, the next pass sees exactly prompt + path + bonus."""
    model = target.model
    ids = tokenizer.encode("def add(a, b):\n    return", add_special_tokens=False)
    cache, past, *_ = _tree_pass(target, ids)
    path = [0, 3]  # root -> a -> d: not contiguous in node order
    keep_accepted_kv(cache, past, path)
    assert cache.get_seq_length() == past + 1 + len(path)
    nxt = 11
    after = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache).logits[0, -1]
    full = ids + [int(TOKENS[i]) for i in path] + [nxt]
    ref = model(input_ids=torch.tensor([full])).logits[0, -1]
    torch.testing.assert_close(after, ref, atol=2e-4, rtol=1e-4)


def test_accept_greedy_walks_the_matching_branch():
    # predictions: after last token -> 504 (node 0), after node 0 -> 1524 (node 3), after node 3 -> 7 (bonus)
    preds = [504, 1524, 0, 0, 7, 0]
    assert accept_greedy(DRAFT, preds) == ([0, 3], 7)
    assert accept_greedy(DRAFT, [99, 0, 0, 0, 0, 0]) == ([], 99)
    assert accept_greedy(Draft.empty(), [5]) == ([], 5)
    assert DRAFT.depths.tolist() == [1, 2, 3, 2, 1]
    assert DRAFT.children[0] == {504: 0, 253: 4} and DRAFT.children[1] == {3365: 1, 1524: 3}


def test_the_accept_rule_is_one_rule_for_verification_and_replay():
    """The node-table form (every node's acceptance) agrees with the walk (the accepted path) on random trees and
    references, and a node is accepted exactly when its whole path is what the reference holds next."""
    rng = np.random.default_rng(4)
    for _ in range(300):
        n = int(rng.integers(0, 14))
        parents, tokens, seen = [], [], set()
        for i in range(n):
            p, t = int(rng.integers(-1, i)) if i else -1, int(rng.integers(0, 3))
            while (p, t) in seen:  # siblings differ
                t += 1
            seen.add((p, t))
            parents.append(p)
            tokens.append(t)
        draft = Draft(np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int32), np.ones(n))
        ref = rng.integers(0, 4, size=int(rng.integers(1, 8)))
        pos = int(rng.integers(0, len(ref)))
        pred = reference_predictions(draft.depths, ref, pos)
        mask = accepted_mask(draft.token_ids, draft.parents, draft.depths, pred)
        path, bonus = accept_greedy(draft, pred)
        assert np.flatnonzero(mask).tolist() == path
        paths: list[tuple[int, ...]] = []
        for t, p in zip(tokens, parents):
            paths.append((paths[p] if p >= 0 else ()) + (t,))
        assert mask.tolist() == [tuple(ref[pos:pos + len(q)].tolist()) == q for q in paths]
        assert bonus == (ref[pos + len(path)] if pos + len(path) < len(ref) else -1)
