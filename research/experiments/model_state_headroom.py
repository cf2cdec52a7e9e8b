"""What the target's own state buys the chain: the union's depth-1 candidates ranked with a draft head's estimate of
the next state, and with the true next state (the bound of any head).

At every position of every saved greedy answer (as ``ranking_headroom.py``: the datastore's longest stored suffix,
the request's own tokens, the output index of the requests before it; no live layer; nodes to ``--budget`` deep),
each depth-1 node of the union gets the model features the native core computes with a next-state estimate
(``crest_native.MODEL_FEATURES``: scored, log-probability among the depth-1 candidates, their argmax), from:

- ``head``: the draft head ``--head`` (``python -m evaluation train-head``) applied to the target's state at the last
  accepted token and the bonus token; scored with the head's own calibration (the shipped one stacked with the model
  terms on the fit halves), as the drafter scores a row with a state;
- ``head, depth 2``: the same, and the head applied again to its own estimate and the chain's first token, whose
  children get the model features from that second estimate (stacked once more on the fit half);
- ``true state``: the target's actual next state (a head that is never wrong about the state; its terms stacked on the
  shipped calibration over the fit half): what no head can beat at depth 1;
- ``true state, depth 2``: the same, and the first token's children read against the target's actual state after that
  token where it is the target's (else against the head's step from the true state and that token; those children are
  rejected anyway): the bound of a head that also steps to depth 2, such as one trained on its own estimates.

The target's states come from the HF model run teacher-forced over each request's prompt and answer (fp32, the state
vLLM hands the proposer; tests/serving/test_vllm_proposer.py). Reported on the report halves: how often the chain's
first token is the target's, and the accept length of a lossless greedy run stepping through the chains of
``--budget``, beside the shipped scores and the union's best.

Then the same chains under a cut, as ``ranking_headroom.py`` prices them: each ranker's chains cut at the fixed path
score (of its ``CUTS``) that runs fastest on the fit half, and the report half stepped through on the simulated engine
of ``cut_simulation.py`` (``--rows`` rows a step). Beside them ``perfect cut``, the shipped chain trimmed to its
accepted tokens (vLLM's ``oracle-cut``): how much of that bound's lead the head's depth-1 ranking takes, and how much
the true state would.

    python -m research.experiments.model_state_headroom --head head.npz [--sets spec_bench humaneval] [--budget 8]
        [--rows 8]
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

from benchmarks._harness import RESULTS, parser
from crest_native import MAX_BUDGET
from drafting import Calibration
from toolkit.options import existing_path, int_in

from . import ranking_headroom as rh
from .cut_simulation import engine_clock, engine_options

DEPTH2 = "head, depth 2"  # the head applied again to its own estimate, for the first token's children
TRUE2 = "true state, depth 2"  # the target's actual states at depths 1 and 2
RANKERS = ("shipped", "head", DEPTH2, "true state", TRUE2)


def model_columns(p: rh.Position, lm: np.ndarray, state: np.ndarray, nodes: np.ndarray | None = None) -> np.ndarray:
    """``[N, 3]``: the model features of ``p``'s nodes under next-state estimate ``state`` (``csrc/scores.cpp``'s
    rule, in numpy: the research copy; tests/oracle/calibration.py is the oracle), over its depth-1 nodes (or
    ``nodes``: siblings, read against ``state`` as the depth-1 nodes are)."""
    cols = np.zeros((len(p.tokens), 3))
    at = np.flatnonzero(p.depths == 1) if nodes is None else nodes
    first = at[p.tokens[at] < len(lm)]
    if len(first):
        z = lm[p.tokens[first]].astype(np.float64) @ state.astype(np.float64)
        lp = z - z.max() - np.log(np.exp(z - z.max()).sum())
        cols[first] = np.column_stack([np.ones(len(first)), lp, z == z.max()])
    return cols


def parent_accepted(positions: list[rh.Position]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The nodes of ``positions`` whose parent was accepted (what a conditional model is fitted on): their features
    ``[rows, columns]`` float64, whether each was accepted ``[rows]`` and their tokens ``[rows]``."""
    xs, ys, ts = [], [], []
    for p in positions:
        parent_ok = np.where(p.parents >= 0, p.ok[np.maximum(p.parents, 0)], True)
        xs.append(p.x[parent_ok])
        ys.append(p.ok[parent_ok])
        ts.append(p.tokens[parent_ok])
    return np.concatenate(xs).astype(np.float64), np.concatenate(ys), np.concatenate(ts)


def stacked(cal, positions: list[rh.Position]):
    """``cal`` stacked with the model terms, fitted on ``positions`` (nodes whose parent was accepted)."""
    return cal.with_model_terms(*parent_accepted(positions))


def conditional(cal, p: rh.Position) -> np.ndarray:
    """``[N]``: each node's probability of acceptance given its parent's, under ``cal``."""
    return 1.0 / (1.0 + np.exp(-cal.logits(p.x.astype(np.float64), p.tokens)))


def halves(positions: list[rh.Position], requests: list[rh.Request]) -> tuple[list[rh.Position], list[rh.Position]]:
    """``positions`` split by their request's half: ``(fit, report)``."""
    return ([p for p in positions if requests[p.request].fit], [p for p in positions if not requests[p.request].fit])


@dataclass(frozen=True)
class SecondDepth:
    """A with-model calibration stacked once more: its logit (over all but the last 3 columns) and the depth-2 model
    features (the last 3), weighed by a logistic model fitted on the fit half's nodes whose parent was accepted."""
    base: Calibration
    weights: np.ndarray  # [4]: the base logit's, then the three features'
    intercept: float

    @classmethod
    def fit(cls, base, positions: list[rh.Position]) -> SecondDepth:
        from sklearn.linear_model import LogisticRegression

        x, accepted, tokens = parent_accepted(positions)
        logit = base.logits(x[:, :-3], tokens)
        model = LogisticRegression(C=1.0, max_iter=2000).fit(np.column_stack([logit, x[:, -3:]]), accepted)
        return cls(base, model.coef_[0].copy(), float(model.intercept_[0]))

    def logits(self, x: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        return self.intercept + np.column_stack([self.base.logits(x[:, :-3], tokens), x[:, -3:]]) @ self.weights


def second_depth(with_model: list[rh.Position], estimates: list[np.ndarray], cal, step, lm: np.ndarray
                 ) -> list[rh.Position]:
    """Each position with the depth-2 model features: the state after the chain's first token under ``cal``
    (``step(i, estimate, token) -> state`` for position ``i``, from its depth-1 ``estimate``), read against that
    token's children."""
    out = []
    for i, (p, estimate) in enumerate(zip(with_model, estimates)):
        cols = np.zeros((len(p.tokens), 3))
        if len(p.parents):
            first = int(rh.best_chain(p, rh.path_scores(p, conditional(cal, p)))[0])
            kids = np.flatnonzero(p.parents == first)
            if len(kids):
                cols = model_columns(p, lm, step(i, estimate, int(p.tokens[first])), kids)
        out.append(replace(p, x=np.hstack([p.x, cols])))
    return out


def stepped_truly(truths: list[tuple[int, np.ndarray | None]], step, i: int, estimate: np.ndarray, token: int
                  ) -> np.ndarray:
    """The state after ``token`` at position ``i``: the target's own (``truths[i]``: the target's token there and its
    state after it) where ``token`` is the target's, else the head's ``step`` from ``estimate``."""
    right, state = truths[i]
    return state if token == right and state is not None else step(estimate, token)


def ranked(fitted: list[rh.Position], held: list[rh.Position], requests: list[rh.Request], cal, args) -> dict:
    """The report half's chains under ``cal`` (on each position's features, model features included): the first
    token's hit rate, accept length per position and by stepped replay; and under the cut chosen on the fit half
    (:func:`under_cut`)."""
    scores = partial(conditional, cal)
    table = rh.chain_table(held, "refit", scores, args.budget)
    accepted = 1 + table[1].sum(axis=1)
    return {"first_right": float(table[1][:, 0].mean()), "per_position": float(accepted.mean()),
            "accept_length": rh.stepped(held, accepted, requests)["all"],
            "cut": under_cut(rh.chain_table(fitted, "refit", scores, args.budget), table, fitted, held, requests,
                             args)}


def under_cut(fit_table, table, fitted: list[rh.Position], held: list[rh.Position], requests: list[rh.Request],
              args) -> dict:
    """Chains (``rh.chain_table``'s, of the fit half and of the report half) cut at the fixed path score of
    ``rh.CUTS`` that runs fastest on the fit half (``None`` for ``fit_table``: no cut, the perfect cut's), the report
    half stepped through on the simulated engine: its cut, tok/s, accept length and draft tokens per row-step."""
    clock = engine_clock(args)
    best = 1.0 if fit_table is None else \
        max(rh.CUTS, key=lambda c: rh.cut_run(fitted, fit_table, c, requests, True).rate(clock, args.rows))
    got = rh.cut_run(held, table, best, requests, False)
    return {"cut": best, "tok_s": got.rate(clock, args.rows), "accept_length": got.tokens / got.steps,
            "drafted_per_step": got.drafted / got.steps}


def run(args) -> dict:
    import torch

    from datastore.shared import SharedDatastore
    from decoder.model import load_target
    from drafting import Calibration, DatastoreSource, DraftHead
    from drafting.head import target_rows
    from evaluation.features import target_features, target_weights
    from evaluation.head_module import HeadModule

    target = load_target(None, device="cpu")
    tok = target.tokenizer
    embedding, lm = target_rows(*target_weights(target))
    head = DraftHead.load(args.head)
    forward = HeadModule.of(head, torch.from_numpy(embedding))
    shipped = Calibration.load()
    report: dict = {"budget": args.budget, "head": str(args.head), "head_meta": head.meta, "streams": {}}

    def step(state: np.ndarray, token: int) -> np.ndarray:
        """The head's next-state estimate from ``state`` ``[d]`` and ``token``."""
        return forward(torch.from_numpy(state[None]), torch.tensor([token])).detach().numpy()[0]

    for name, store, requests in rh._sets(args):
        requests = requests[:args.limit]
        t0 = time.perf_counter()
        source = DatastoreSource(partial(SharedDatastore.open, store, tokenizer=tok), retry_s=0.5)
        positions = rh.collect(requests, source, budget=args.budget, decay=0.8, vocab_size=len(lm), desc=name)
        source.close()
        states = {}  # request -> [len, d] the target's states over its prompt and answer
        for n, r in enumerate(requests):
            states[n] = target_features(target, r.prompt + r.output).numpy()
        out: dict = {"union": rh.first_tokens(halves(positions, requests)[1])}
        for which in ("head", "true state"):
            with_model, estimates = [], []
            for p in positions:
                r, f = requests[p.request], states[p.request]
                t = len(r.prompt) + p.pos - 2  # the state that gave the bonus token r.output[p.pos - 1]
                estimate = f[t + 1] if which == "true state" else step(f[t], r.output[p.pos - 1])
                estimates.append(estimate)
                with_model.append(replace(p, x=np.hstack([p.x, model_columns(p, lm, estimate)])))
            fitted, held = halves(with_model, requests)
            cal = head.calibration if which == "head" else stacked(shipped, fitted)
            out[which] = ranked(fitted, held, requests, cal, args)
            first = [(p.ok[p.depths == 1], p.x[p.depths == 1, -2]) for p in held if (p.depths == 1).any()]
            out[which]["argmax_right"] = sum(bool(ok[np.argmax(lp)]) for ok, lp in first) / len(held)
            if which == "head":  # the head once more, on its own estimate: the depth-2 nodes of the first token
                again = second_depth(with_model, estimates, cal, lambda i, e, token: step(e, token), lm)
                fit2, held2 = halves(again, requests)
                out[DEPTH2] = ranked(fit2, held2, requests, SecondDepth.fit(cal, fit2), args)
            else:  # the target's state after the first token, where that token is the target's
                truths = [(r.output[p.pos], states[p.request][len(r.prompt) + p.pos])  # the state after that token
                          if p.pos < len(r.output) else (-1, None)
                          for p, r in ((p, requests[p.request]) for p in positions)]
                true_step = partial(stepped_truly, truths, step)
                fit2, held2 = halves(second_depth(with_model, estimates, cal, true_step, lm), requests)
                out[TRUE2] = ranked(fit2, held2, requests, SecondDepth.fit(cal, fit2), args)
        fitted, held = halves([replace(p, x=np.hstack([p.x, np.zeros((len(p.x), 3))])) for p in positions], requests)
        out["shipped"] = ranked(fitted, held, requests,
                                replace(shipped, coef=np.concatenate([shipped.coef, np.zeros(3)])), args)
        perfect = rh.chain_table(held, rh.PERFECT, None, args.budget)
        out[rh.PERFECT] = {"cut": under_cut(None, perfect, fitted, held, requests, args)}
        best = rh.chain_table(held, "union's best", None, args.budget)[1]
        out["union's best"] = {"accept_length": rh.stepped(held, 1 + best.sum(axis=1), requests)["all"]}
        out["seconds"] = time.perf_counter() - t0
        report["streams"][name] = out
        print_table(name, out)
    return report


def print_table(name: str, out: dict) -> None:
    union, best = out["union"], out["union's best"]["accept_length"]
    print(f"\n{name}: the union offers {union['offered']:.1f} first tokens; one is the target's at "
          f"{union['any_right']:.1%} of positions. Union's best chain: {best:.3f}")
    base = out["shipped"]["accept_length"]
    print(f"{'ranker':20s} {'first token':>12s} {'argmax':>8s} {'accept':>8s} {'/shipped':>9s}")
    for ranker in RANKERS:
        row = out[ranker]
        print(f"{ranker:20s} {row['first_right']:12.1%} {row.get('argmax_right', float('nan')):8.1%} "
              f"{row['accept_length']:8.3f} {row['accept_length'] / base:8.3f}x")
    cut = out["shipped"]["cut"]["tok_s"]
    print("under a cut (the simulated engine; each ranker's cut chosen on the fit half)")
    print(f"{'ranker':20s} {'cut':>5s} {'tok/s':>7s} {'/shipped':>9s} {'accept':>7s} {'drafted':>8s}")
    for ranker in (*RANKERS, rh.PERFECT):
        row = out[ranker]["cut"]
        print(f"{ranker:20s} {row['cut']:5.2f} {row['tok_s']:7.1f} {row['tok_s'] / cut:8.3f}x "
              f"{row['accept_length']:7.3f} {row['drafted_per_step']:8.2f}")


def build_parser():
    ap = parser(__doc__)
    ap.add_argument("--head", type=existing_path, required=True,
                    help="the draft head (python -m evaluation train-head).")
    ap.add_argument("--sets", nargs="*", choices=("spec_bench", "humaneval"), default=["spec_bench", "humaneval"],
                    help="evaluation sets (default: both).")
    ap.add_argument("--datastore", default="sharegpt", help="Spec-Bench's datastore (default: sharegpt).")
    ap.add_argument("--code-datastore", default="code", help="HumanEval's datastore (default: code).")
    ap.add_argument("--budget", type=int_in(1, MAX_BUDGET), default=8, help="chain length in tokens (default: 8).")
    ap.add_argument("--limit", type=int_in(1), default=None, help="replay only the first N requests of each set.")
    ap.add_argument("--rows", type=int_in(1), default=8,
                    help="rows a step in the cut's simulated engine (default: 8; cut_simulation.py's engine options "
                         "price a step).")
    engine_options(ap)
    ap.add_argument("--out", type=Path, default=RESULTS / "model_state_headroom.json",
                    help="the report, JSON (default: results/model_state_headroom.json).")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
