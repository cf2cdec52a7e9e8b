"""The target's features (:mod:`evaluation.features`): the teacher's top tokens, and a feature set that holds what
the target computes."""

from __future__ import annotations

import numpy as np
import torch

from evaluation.features import TEACHER_TOP, top_tokens


def test_top_tokens_are_the_softmax_top_k():
    gen = torch.Generator().manual_seed(1)
    weight, g = torch.randn(200, 8, generator=gen), torch.randn(130, 8, generator=gen)
    ids, probs = top_tokens(g, weight, 4)
    want = torch.softmax(g @ weight.T, dim=-1).topk(4)
    assert torch.equal(ids, want.indices) and torch.allclose(probs, want.values, atol=1e-6)


def test_feature_set_holds_the_targets_features_and_distribution(target, feature_set):
    from evaluation.features import target_features, target_weights

    span = feature_set.span(2)
    tokens = feature_set.tokens[span]
    want = target_features(target, tokens.tolist())
    assert np.allclose(feature_set.features[span].astype(np.float32), want.numpy(), atol=2e-2, rtol=1e-2)
    top1 = (want @ target_weights(target)[1].T).argmax(-1).numpy()
    assert (feature_set.teacher_ids[span][:, 0] == top1).mean() > 0.99
    assert feature_set.teacher_ids.shape[1] == TEACHER_TOP
    probs = feature_set.teacher_probs[span].astype(np.float32)
    assert np.all(np.diff(probs, axis=1) <= 1e-3) and np.all(probs.sum(1) <= 1.01)
