"""Training the heads: the fused LM-head losses against plain autograd, the loss falling on real features, runs that
are deterministic and resume bit for bit, and heads that save and load bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.nn import functional

from evaluation.features import FeatureSet, extract
from research.s4c.loss import head_losses
from research.s4c.store import load_heads, read_record, save_heads
from research.s4c.train import Batch, TrainConfig, accuracy, losses, train
from support import tiny_heads


def test_fused_losses_equal_autograd_on_whole_logits():
    """lm, teacher, argmax and the gradient of the chunked function equal log-softmax over the whole logits."""
    gen = torch.Generator().manual_seed(0)
    v, d, n = 300, 16, 301  # n spans three chunks, the last one short
    weight = torch.randn(v, d, generator=gen)
    labels = torch.randint(0, v, (n,), generator=gen)
    ids = torch.stack([torch.randperm(v, generator=gen)[:5] for _ in range(n)])
    probs = torch.rand(n, 5, generator=gen) / 5
    wl, wt = torch.rand(n, generator=gen), torch.rand(n, generator=gen)
    g1 = torch.randn(n, d, generator=gen, requires_grad=True)
    g2 = g1.detach().clone().requires_grad_(True)
    lm, teacher, choice = head_losses(g1, weight, labels, ids, probs)
    ((lm * wl).sum() + (teacher * wt).sum()).backward()
    logp = functional.log_softmax(g2 @ weight.T, dim=-1)
    lm2 = -logp.gather(1, labels[:, None])[:, 0]
    teacher2 = -(probs * logp.gather(1, ids)).sum(-1)
    ((lm2 * wl).sum() + (teacher2 * wt).sum()).backward()
    assert torch.allclose(lm, lm2, atol=1e-4) and torch.allclose(teacher, teacher2, atol=1e-4)
    assert torch.equal(choice, (g2 @ weight.T).argmax(-1))
    assert g1.grad is not None and g2.grad is not None and torch.allclose(g1.grad, g2.grad, atol=1e-5)


def stop_after(n: int):
    """A progress callback that interrupts the run after its ``n``-th call (as Ctrl-C would)."""
    calls = []

    def callback(*_args) -> None:
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt

    return callback


def test_extraction_resumes_where_it_stopped_and_refuses_other_sequences(target, tmp_path):
    seqs = [np.arange(5, 25, dtype=np.int32), np.arange(40, 52, dtype=np.int32), np.arange(7, 30, dtype=np.int32)]
    whole = extract(target, seqs, tmp_path / "a", about={"k": 1})
    with pytest.raises(KeyboardInterrupt):
        extract(target, seqs, tmp_path / "b", about={"k": 1}, flush_every=1, progress=stop_after(2))
    assert json.loads((tmp_path / "b" / "features.json").read_text())["done"] == 1
    resumed = extract(target, seqs, tmp_path / "b", about={"k": 1})
    for name in ("tokens", "features", "teacher_ids", "teacher_probs"):
        assert np.array_equal(getattr(whole, name), getattr(resumed, name)), name
    assert np.array_equal(whole.tokens, np.concatenate(seqs)) and len(whole) == 3
    with pytest.raises(ValueError, match="other sequences"):
        extract(target, seqs, tmp_path / "a", about={"k": 2})
    with pytest.raises(FileNotFoundError, match="no complete feature set"):
        FeatureSet.open(tmp_path / "missing")


def test_loss_falls_and_accuracy_rises_on_real_features(target, feature_set, tmp_path):
    heads = tiny_heads(target)
    indices = list(range(len(feature_set)))
    first = losses(heads, Batch.of(feature_set, indices[:4]), header=0)[0].item()
    before = accuracy(heads, feature_set, indices)[0]["top1"]
    log = train(heads, feature_set, indices, TrainConfig(epochs=6, batch_size=2, lr=3e-3), tmp_path / "ck.pt")
    last = losses(heads, Batch.of(feature_set, indices[:4]), header=0)[0].item()
    after = accuracy(heads, feature_set, indices)
    assert last < 0.7 * first, (first, last)
    assert after[0]["top1"] > before + 0.05, (before, after)
    assert len(log) == 6 * 5 and all(len(e["heads"]) == 2 for e in log)


def test_training_is_deterministic_and_resumes_bit_for_bit(target, feature_set, tmp_path):
    cfg = TrainConfig(epochs=2, batch_size=3, lr=2e-3, checkpoint_every=2, seed=3)
    indices = list(range(len(feature_set)))
    straight = tiny_heads(target, seed=3)
    train(straight, feature_set, indices, cfg, tmp_path / "straight.pt")
    again = tiny_heads(target, seed=3)
    train(again, feature_set, indices, cfg, tmp_path / "again.pt")
    with pytest.raises(KeyboardInterrupt):  # stopped after step 3: the checkpoint holds step 2
        train(tiny_heads(target, seed=3), feature_set, indices, cfg, tmp_path / "resumed.pt", on_step=stop_after(3))
    resumed = tiny_heads(target, seed=99)  # its own initialisation is replaced by the checkpoint's
    log = train(resumed, feature_set, indices, cfg, tmp_path / "resumed.pt")
    for a, b, c in zip(straight.state_dict().values(), again.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert [e["step"] for e in log] == list(range(len(log)))
    with pytest.raises(ValueError, match="other settings"):
        train(tiny_heads(target), feature_set, indices, TrainConfig(epochs=3), tmp_path / "resumed.pt")


def test_heads_save_and_load_bit_for_bit(target, feature_set, tmp_path):
    heads = tiny_heads(target)
    train(heads, feature_set, list(range(len(feature_set))), TrainConfig(epochs=1, batch_size=4), tmp_path / "c.pt")
    vocab = torch.tensor([5, 9, 2, 100])
    path = save_heads(heads, tmp_path / "h.safetensors", target=target, record={"note": "test"}, draft_vocab=vocab)
    loaded = load_heads(target, path=path)
    for (k, a), (k2, b) in zip(heads.state_dict().items(), loaded.state_dict().items()):
        assert k == k2 and torch.equal(a.to(torch.float16).float(), b)
    again = load_heads(target, path=path)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), again.state_dict().values()))
    assert loaded.draft_head.ids is not None and torch.equal(loaded.draft_head.ids, vocab)
    assert read_record(path)["record"] == {"note": "test"} and read_record(path)["config"]["num_heads"] == 2


def test_train_config_refuses_bad_settings():
    with pytest.raises(ValueError, match="epochs"):
        TrainConfig(epochs=0)
    with pytest.raises(ValueError, match="lr"):
        TrainConfig(lr=0.0)
