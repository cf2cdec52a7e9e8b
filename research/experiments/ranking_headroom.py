"""How far a chain's ranking is from the best chain its sources hold, and what better rankers of the same union buy.

The merged drafter's chain is the path of largest expected accepted length through the union of its sources' trees
(the datastore's longest stored suffix, the request's own tokens, the output index; docs/drafter.md), each node scored
by the calibrated conditional model (docs/drafter-quality.md section 1). This script replays saved greedy answers and,
at every position, reads that union (:meth:`drafting.DraftingService.node_tables`, nodes to ``--budget`` deep) and which
of its nodes the target accepts. Then, per position, the accepted length (bonus included) of the chain each ranker
chooses, and the accept length of a lossless greedy run that steps through the positions with them:

- ``union's best``: the deepest accepted node's path (a ranker that knew the answer: what the union holds);
- ``shipped``: the shipped calibration (``drafting/data/calibration.json``), what the drafter drafts;
- ``refit``: the same logistic model refitted on this run's fit half (the features' own fit to this data);
- ``refit + history``: the same with each source's recent record in the request as features: per source, the decayed
  share of earlier positions where its most counted first token was the target's (``--decay``), alone and times
  whether the node is in that source (does a request's own past tell which source to trust?);
- ``boosted``: gradient-boosted trees (scikit-learn) on the same features (are the features' interactions missing?);
- ``boosted + tokens``: the same with the node's token and its parent's as categories (the fit half's 254 most
  drafted first tokens, the rest one category): what the drafted token itself says of its chance.

Then the same rankers under a cut, as an engine that verifies chains at a batch size would draft them: each
position's chain is cut to its nodes whose path score clears a fixed probability (the one of :data:`CUTS` that runs
fastest on the fit half), and the report half is stepped through with the cut chains, each step priced on
``cut_simulation.py``'s simulated engine (``--rows`` rows a step, its ``--curve``, ``--step-ms`` and ``--draft-ms``):
simulated tok/s, accept length and draft tokens per row-step. ``perfect cut`` is the shipped chain trimmed to its
accepted tokens: what no cut or calibration of that chain can beat (as ``vllm_serving.py --methods oracle-cut``).
It says how much of the distance between the shipped cut and a perfect one a sharper ranker closes.

The models are fitted on one half and reported on the other: for the evaluation sets, their fit and report halves
(Spec-Bench with ``--datastore``, HumanEval with ``--code-datastore``, :func:`evaluation.half`); for ``--fleet DIR``,
the fleet stream's even and odd requests (``python -m benchmarks.fleet prepare``, datastore ``--fleet-datastore``,
by kind of request). Each stream is replayed in its order, every request's output into the output index after it;
no live layer.

    python -m research.experiments.ranking_headroom [--sets spec_bench humaneval] [--fleet results/fleet] [--budget 8]
        [--rows 8]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from benchmarks._harness import RESULTS, parser, references, require_clean, saved
from crest_native import FEATURES, MAX_BUDGET, SOURCES
from evaluation.calibrate import stored_suffixes
from evaluation.references import half
from toolkit.options import float_in, int_in

from .cut_simulation import EngineClock, engine_clock, engine_options

BLOCK = len(FEATURES) // len(SOURCES)  # the columns of one source's block (csrc/features.hpp)
COUNTED = ("ds", "live", "local", "outputs")  # the sources whose blocks hold counts (column 1: the count ratio)
RANKERS = ("union's best", "shipped", "refit", "refit + history", "boosted", "boosted + tokens")
TOKEN_CATEGORIES = 254  # scikit-learn's boosted trees take at most 255 categories: these tokens and "any other"
CUTS = tuple(round(0.05 * i, 2) for i in range(1, 17))  # the fixed cuts tried on a chain's path scores, 0.05-0.80
PERFECT = "perfect cut"  # the shipped chain trimmed to its accepted tokens: what no cut of it can beat


@dataclass(frozen=True)
class Request:
    """One replayed request: ``prompt`` and ``output`` token ids, its ``group`` (category or kind) and ``fit``: whether
    it is in the half the models are fitted on."""
    id: str
    prompt: list[int]
    output: list[int]
    group: str
    fit: bool


@dataclass(frozen=True)
class Position:
    """One position's union, nodes to the budget's depth: ``tokens`` ``[N]`` int64, ``parents`` ``[N]`` int32 (-1: a
    child of the root; parents first), ``depths`` ``[N]`` int8, ``x`` ``[N, len(FEATURES)]`` float32, ``ok`` ``[N]``
    bool (the target accepts the node), ``shipped`` ``[N]`` float64 (the shipped path scores); ``history``
    ``[len(COUNTED)]`` float64 (each source's record in the request before this position)."""
    request: int
    pos: int
    tokens: np.ndarray
    parents: np.ndarray
    depths: np.ndarray
    x: np.ndarray
    ok: np.ndarray
    shipped: np.ndarray
    history: np.ndarray


def collect(requests: list[Request], source, *, budget: int, decay: float, vocab_size: int,
            desc: str) -> list[Position]:
    """Every position of every request's output (the first excepted: the prefill's token), in order, as
    :class:`Position` rows (``request``: the index in ``requests``)."""
    from tqdm import tqdm

    from drafting import DraftingService
    from drafting.accept import accepted_mask, reference_predictions

    core = DraftingService(None, vocab_size=vocab_size)
    out = []
    for n, r in enumerate(tqdm(requests, desc=desc, unit="request", dynamic_ncols=True)):
        ref = np.asarray(r.output, dtype=np.int64)
        seq = list(r.prompt) + r.output[:1]
        core.start_request(r.id, seq)
        hits, seen = np.zeros(len(COUNTED)), np.zeros(len(COUNTED))
        for pos in range(1, len(ref)):
            history = (hits + 1.0) / (seen + 2.0)  # each source's decayed record, shrunk towards one half
            tables = core.node_tables(r.id, stored_suffixes(source, seq[-8:])[:1], None)
            if tables:
                t = tables[0]
                keep = t.depths <= budget
                renumber = np.cumsum(keep) - 1
                parents = np.where(t.parents >= 0, renumber[np.maximum(t.parents, 0)], -1)[keep].astype(np.int32)
                ok = accepted_mask(t.tokens, t.parents, t.depths, reference_predictions(t.depths, ref, pos))[keep]
                x = t.features[keep]
                out.append(Position(n, pos, t.tokens[keep], parents, t.depths[keep].astype(np.int8),
                                    x.astype(np.float32), ok, t.scores[keep], history))
                first = out[-1].depths == 1
                for k in range(len(COUNTED)):
                    mine = first & (x[:, k * BLOCK] > 0)
                    if mine.any():  # the source's most counted first token: was it the target's?
                        top = np.flatnonzero(mine)[np.argmax(x[mine, k * BLOCK + 1])]
                        hits[k], seen[k] = decay * hits[k] + ok[top], decay * seen[k] + 1.0
            seq.append(int(ref[pos]))
            core.step([r.id], [0], tokens=[[int(ref[pos])]])
        core.stop_request(r.id)
    core.close()
    return out


@dataclass(frozen=True)
class Design:
    """What a model reads of a position beside its features: each source's record (``history``), and the node's and
    its parent's token as categories (``categories``: token id -> category; ``None``: not read)."""
    history: bool = False
    categories: dict[int, int] | None = None

    def rows(self, p: Position) -> np.ndarray:
        """``[N, columns]`` float64: the features, then each counted source's record and that record times whether
        the node is in the source, then the two token categories."""
        x = p.x.astype(np.float64)
        parts = [x]
        if self.history:
            on = x[:, [k * BLOCK for k in range(len(COUNTED))]]
            parts += [np.broadcast_to(p.history, on.shape), on * p.history]
        if self.categories is not None:
            other = len(self.categories)
            token = np.array([self.categories.get(int(t), other) for t in p.tokens], dtype=np.float64)
            parent = np.where(p.parents >= 0, token[np.maximum(p.parents, 0)], other)
            parts += [token[:, None], parent[:, None]]
        return np.hstack(parts)


def token_categories(positions: list[Position]) -> dict[int, int]:
    """The :data:`TOKEN_CATEGORIES` tokens most often drafted first at ``positions``, numbered by frequency."""
    counts = Counter[int]()
    for p in positions:
        counts.update(p.tokens[p.depths == 1].tolist())
    return {t: i for i, (t, _) in enumerate(counts.most_common(TOKEN_CATEGORIES))}


def fit(positions: list[Position], design: Design, boosted: bool) -> Callable[[Position], np.ndarray]:
    """A conditional model (P(node accepted | parent accepted)) fitted on the nodes whose parent was accepted:
    a position's ``[N]`` conditionals."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    xs, ys = [], []
    for p in positions:
        parent_ok = np.where(p.parents >= 0, p.ok[np.maximum(p.parents, 0)], True)
        xs.append(design.rows(p)[parent_ok])
        ys.append(p.ok[parent_ok])
    x, y = np.concatenate(xs), np.concatenate(ys)
    if boosted:
        categorical = np.zeros(x.shape[1], dtype=bool)
        if design.categories is not None:
            categorical[-2:] = True
        model = HistGradientBoostingClassifier(max_iter=300, learning_rate=0.1, categorical_features=categorical,
                                               random_state=0).fit(x, y)
        return lambda p: model.predict_proba(design.rows(p))[:, 1]
    scaler = StandardScaler().fit(x)
    scale = np.where(scaler.scale_ > 0, scaler.scale_, 1.0)
    linear = LogisticRegression(C=1.0, max_iter=3000).fit((x - scaler.mean_) / scale, y)
    return lambda p: linear.predict_proba((design.rows(p) - scaler.mean_) / scale)[:, 1]


def best_chain(p: Position, scores: np.ndarray) -> np.ndarray:
    """The chain of largest expected accepted length under ``scores`` (path scores, ``[N]``), the path whose node
    scores sum the highest: ``[depth]`` int64 node indices, root's child first (empty for an empty union)."""
    if not len(scores):
        return np.zeros(0, dtype=np.int64)
    total = np.empty(len(scores))
    for i, parent in enumerate(p.parents):
        total[i] = scores[i] + (total[parent] if parent >= 0 else 0.0)
    node, path = int(np.argmax(total)), []
    while node >= 0:
        path.append(node)
        node = int(p.parents[node])
    return np.array(path[::-1], dtype=np.int64)


def path_scores(p: Position, conditional: np.ndarray) -> np.ndarray:
    out = np.empty(len(conditional))
    for i, parent in enumerate(p.parents):
        out[i] = conditional[i] * (out[parent] if parent >= 0 else 1.0)
    return out


def chain_table(positions: list[Position], ranker: str, model, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """Each position's chain under ``ranker``: ``([positions, budget] float64 path scores along it, 0 past its end;
    [positions, budget] bool: the target accepts the node)``; uncut, a position's accepted length is one plus its
    row's accepted nodes. ``union's best`` scores its path 1 and :data:`PERFECT` scores the shipped chain's accepted
    nodes 1 and the rest 0, so any cut in (0, 1] keeps exactly their accepted tokens."""
    scores = np.zeros((len(positions), budget))
    ok = np.zeros((len(positions), budget), dtype=bool)
    for j, p in enumerate(positions):
        if ranker == "union's best":  # the path to the deepest accepted node
            chain = best_chain(p, np.where(p.ok, p.depths, 0).astype(np.float64)) if p.ok.any() else p.ok.nonzero()[0]
            path = np.ones(len(chain))
        else:
            shipped = ranker in ("shipped", PERFECT) or not len(p.parents)
            path_all = p.shipped if shipped else path_scores(p, model(p))
            chain = best_chain(p, path_all)
            path = p.ok[chain].astype(np.float64) if ranker == PERFECT else path_all[chain]
        scores[j, :len(chain)] = path
        ok[j, :len(chain)] = p.ok[chain]
    return scores, ok


@dataclass(frozen=True)
class CutRun:
    """A stepped replay of chains cut at one probability: ``tokens`` committed, row-``steps``, draft tokens
    ``drafted`` and the row-steps that drafted any (``drafting``)."""
    tokens: int
    steps: int
    drafted: int
    drafting: int

    def rate(self, clock: EngineClock, rows: int) -> float:
        """Simulated tokens per second with ``rows`` rows a step, each step the mean one: ``rows`` times one plus the
        mean draft tokens verified, priced by ``clock``, a draft step's surcharge paid by the chance that any row
        drafts."""
        per_row = self.drafted / max(self.steps, 1)
        any_draft = 1.0 - (1.0 - self.drafting / max(self.steps, 1)) ** rows
        seconds = self.steps / rows * clock.cost(rows * (1.0 + per_row), any_draft)
        return self.tokens / max(seconds, 1e-12)


def walk(positions: list[Position], accepted: np.ndarray, drafted: np.ndarray, requests: list[Request],
         fit: bool) -> Iterator[tuple[Request, CutRun]]:
    """A lossless greedy run through each of the ``fit`` or report half's requests that drafts at the positions it
    reaches: each step commits ``accepted`` tokens (``[positions]``, bonus included) and verifies ``drafted`` draft
    tokens at its position; a position with no union commits the bonus only. Yields each request and its run."""
    at: dict[int, dict[int, tuple[int, int]]] = {}
    for p, a, d in zip(positions, accepted, drafted):
        at.setdefault(p.request, {})[p.pos] = (int(a), int(d))
    for n, r in enumerate(requests):
        if r.fit != fit:
            continue
        row, pos, steps, total, drafting = at.get(n, {}), 1, 0, 0, 0
        while pos < len(r.output):
            a, d = row.get(pos, (1, 0))
            pos, steps, total, drafting = pos + a, steps + 1, total + d, drafting + (d > 0)
        yield r, CutRun(len(r.output) - 1, steps, total, drafting)


def cut_run(positions: list[Position], table: tuple[np.ndarray, np.ndarray], cut: float,
            requests: list[Request], fit: bool) -> CutRun:
    """The :func:`walk` of the ``fit`` or report half's requests, pooled, every chain in ``table`` cut to its nodes
    whose path score is at least ``cut``."""
    scores, ok = table
    kept = scores >= cut  # path scores fall along a chain: a prefix
    runs = [run for _, run in walk(positions, 1 + (kept & ok).sum(axis=1), kept.sum(axis=1), requests, fit)]
    return CutRun(*(sum(getattr(run, f) for run in runs) for f in ("tokens", "steps", "drafted", "drafting")))


def cut_rows(fitted: list[Position], held: list[Position], tables: dict, models: dict, requests: list[Request],
             args) -> dict:
    """Per ranker, the fixed cut (of :data:`CUTS`) of largest simulated tok/s on the fit half, and on the report half
    (its chains: ``tables``, by ranker, from :func:`chain_table`) at that cut: tok/s, accept length, draft tokens per
    row-step and row-steps. :data:`PERFECT` and ``union's best`` need no cut."""
    clock = engine_clock(args)
    out = {}
    for ranker, table in tables.items():
        best = 1.0
        if ranker not in (PERFECT, "union's best"):
            fit_table = chain_table(fitted, ranker, models.get(ranker), args.budget)
            best = max(CUTS, key=lambda c: cut_run(fitted, fit_table, c, requests, True).rate(clock, args.rows))
        got = cut_run(held, table, best, requests, False)
        out[ranker] = {"cut": best, "tok_s": got.rate(clock, args.rows), "accept_length": got.tokens / got.steps,
                       "drafted_per_step": got.drafted / got.steps, "steps": got.steps}
    return out


def first_tokens(positions: list[Position]) -> dict[str, float]:
    """At the positions with a union: how many first tokens it offers (mean), and how often the shipped chain's first
    token and any of them is the target's."""
    offered = chosen = held = 0.0
    for p in positions:
        first = p.depths == 1
        top = np.flatnonzero(first)[np.argmax(p.shipped[first])]
        offered += first.sum()
        chosen += bool(p.ok[top])
        held += bool(p.ok[first].any())
    n = max(len(positions), 1)
    return {"offered": offered / n, "shipped_right": chosen / n, "any_right": held / n}


def stepped(positions: list[Position], accepted: np.ndarray, requests: list[Request]) -> dict[str, float]:
    """Accept length (tokens per step) of the report half's :func:`walk` with ``accepted`` tokens a step, pooled and
    per group."""
    tokens: dict[str, int] = {}
    steps: dict[str, int] = {}
    for r, run in walk(positions, accepted, np.zeros_like(accepted), requests, fit=False):
        for g in ("all", r.group):
            tokens[g] = tokens.get(g, 0) + run.tokens
            steps[g] = steps.get(g, 0) + run.steps
    return {g: tokens[g] / steps[g] for g in tokens if steps[g]}


def _sets(args) -> list[tuple[str, str, list[Request]]]:
    out = []
    for name, store in zip(args.sets, (args.datastore if s == "spec_bench" else args.code_datastore
                                       for s in args.sets)):
        refs = references(name, args.references, "all")
        require_clean(store, name, [r.id for r in refs])
        fit_ids = {r.id for r in half(refs, "fit")}
        out.append((name, store, [Request(r.id, list(r.prompt), list(r.output), r.category, r.id in fit_ids)
                                  for r in refs]))
    return out


def _fleet(args) -> tuple[str, str, list[Request]]:
    remedy = f"run `python -m benchmarks.fleet prepare --dir {args.fleet}`"
    stream = saved(args.fleet / "today.json", "stream", fix=remedy)["stream"]
    if not stream or "output_ids" not in stream[0]:
        raise SystemExit(f"error: {args.fleet / 'today.json'} holds no answers: {remedy}")
    return "fleet", args.fleet_datastore, [Request(f"fleet-{i}", list(r["prompt_ids"]), list(r["output_ids"]),
                                                   r["kind"], i % 2 == 0) for i, r in enumerate(stream)]


def run(args) -> dict:
    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource
    from toolkit import load_tokenizer

    tok = load_tokenizer()
    streams = _sets(args) if args.sets else []
    if args.fleet is not None:
        streams.append(_fleet(args))
    report: dict = {"budget": args.budget, "decay": args.decay, "streams": {}}
    for name, store, requests in streams:
        requests = requests[:args.limit]
        t0 = time.perf_counter()
        source = DatastoreSource(partial(SharedDatastore.open, store, tokenizer=tok), retry_s=0.5)
        if source.client is None:  # the first open failed (DatastoreSource logged why)
            raise SystemExit(f"error: datastore {store!r} did not open ({dict(source.faults)}): build it, or name a "
                             "built one (`python -m datastore list`)")
        positions = collect(requests, source, budget=args.budget, decay=args.decay, vocab_size=len(tok), desc=name)
        faults = dict(source.faults)
        source.close()
        fitted = [p for p in positions if requests[p.request].fit]
        held = [p for p in positions if not requests[p.request].fit]
        models = {"refit": fit(fitted, Design(), False), "refit + history": fit(fitted, Design(history=True), False),
                  "boosted": fit(fitted, Design(), True),
                  "boosted + tokens": fit(fitted, Design(categories=token_categories(fitted)), True)}
        tables = {ranker: chain_table(held, ranker, models.get(ranker), args.budget) for ranker in (*RANKERS, PERFECT)}
        rows = {}
        for ranker in RANKERS:
            accepted = 1 + tables[ranker][1].sum(axis=1)
            rows[ranker] = {"per_position": float(accepted.mean()),
                            "accept_length": stepped(held, accepted, requests)}
        report["streams"][name] = {"datastore": store, "fit_requests": sum(r.fit for r in requests),
                                   "report_requests": sum(not r.fit for r in requests),
                                   "report_positions": len(held), "first_token": first_tokens(held),
                                   "lookups_retried": faults, "seconds": time.perf_counter() - t0, "rows": rows,
                                   "cut": cut_rows(fitted, held, tables, models, requests, args)}
        print_table(name, report["streams"][name])
        print_cuts(report["streams"][name]["cut"], args)
    return report


def print_table(name: str, got: dict) -> None:
    rows = got["rows"]
    groups = [g for g in rows["shipped"]["accept_length"] if g != "all"]
    print(f"\n{name} (datastore {got['datastore']}; fitted on {got['fit_requests']} requests, reported on "
          f"{got['report_requests']}, {got['report_positions']:,} positions; chain, accept length by stepped replay)")
    print(f"{'ranker':18s} {'all':>7s} {'/shipped':>9s}  " + " ".join(f"{g[:12]:>12s}" for g in groups))
    first = got["first_token"]
    print(f"first token: the union offers {first['offered']:.1f}; the shipped chain's is the target's at "
          f"{first['shipped_right']:.1%} of positions, one of them at {first['any_right']:.1%}")
    base = rows["shipped"]["accept_length"]["all"]
    for ranker, row in rows.items():
        al = row["accept_length"]
        print(f"{ranker:18s} {al['all']:7.3f} {al['all'] / base:8.3f}x  "
              + " ".join(f"{al.get(g, float('nan')):12.3f}" for g in groups))


def print_cuts(rows: dict, args) -> None:
    print(f"cut: {args.rows} rows a step on the simulated engine (cut_simulation.py's curve + {args.step_ms} ms, "
          f"+ {args.draft_ms} ms with drafts); each ranker's fixed cut chosen on the fit half")
    print(f"{'ranker':18s} {'cut':>5s} {'tok/s':>7s} {'/shipped':>9s} {'accept':>7s} {'drafted':>8s}")
    base = rows["shipped"]["tok_s"]
    for ranker, row in rows.items():
        print(f"{ranker:18s} {row['cut']:5.2f} {row['tok_s']:7.1f} {row['tok_s'] / base:8.3f}x "
              f"{row['accept_length']:7.3f} {row['drafted_per_step']:8.2f}")


def build_parser() -> argparse.ArgumentParser:
    ap = parser(__doc__)
    ap.add_argument("--sets", nargs="*", choices=("spec_bench", "humaneval"), default=["spec_bench", "humaneval"],
                    help="evaluation sets, fitted on their fit half and reported on the other (default: both; none: "
                         "the fleet only).")
    ap.add_argument("--datastore", default="sharegpt", help="Spec-Bench's datastore (default: sharegpt).")
    ap.add_argument("--code-datastore", default="code", help="HumanEval's datastore (default: code).")
    ap.add_argument("--fleet", type=Path, default=None, metavar="DIR",
                    help="also the fleet stream prepared in DIR (python -m benchmarks.fleet prepare; "
                         "default: not run).")
    ap.add_argument("--fleet-datastore", default="fleet-both", help="the fleet's datastore (default: fleet-both).")
    ap.add_argument("--budget", type=int_in(1, MAX_BUDGET), default=8, help="chain length in tokens (default: 8).")
    ap.add_argument("--decay", type=float_in(0, 1), default=0.8,
                    help="the history features' decay per position (default: 0.8).")
    ap.add_argument("--limit", type=int_in(1), default=None, help="replay only the first N requests of each stream.")
    ap.add_argument("--rows", type=int_in(1), default=8,
                    help="rows a step in the cut's simulated engine (default: 8; cut_simulation.py's engine options "
                         "price a step).")
    engine_options(ap)
    ap.add_argument("--out", type=Path, default=RESULTS / "ranking_headroom.json",
                    help="the report, JSON (default: results/ranking_headroom.json).")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if not args.sets and args.fleet is None:
        raise SystemExit("error: nothing to replay: name --sets, or --fleet DIR")
    engine_clock(args)  # a malformed --curve is refused before minutes of replay
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
