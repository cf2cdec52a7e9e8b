"""``python -m evaluation calibrate``: fit the calibrated node scores (:mod:`drafting.calibration`) on the fit half of
the public prompts and report them on the report half, with the calibration curve as a plot.

Every position of every reference output is visited (the logs depend on no drafter): the datastore's candidate n-grams
(the longest stored suffix; every stored suffix with ``--candidates all``), and for each the native core's node table
(:meth:`drafting.DraftingService.node_tables`): its union with the request's own match, the match in the earlier
requests' outputs (the prompts run in file order) and the live layer's, with every node's features. A node is accepted
when its path is what the target generated next; the conditional model is fitted on the nodes whose parent was accepted,
with a bias per drafted token for the ``--token-terms`` most frequent.

The live layer's features are cross-fitted: the fit half is split in two, each part's outputs compacted into a live
layer the other part's prompts look up (``calibfit-a.live``, ``calibfit-b.live``, left in place), and the fit half is
replayed with that layer and with none, both fitted together (``docs/drafter-quality.md`` section 1).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

from toolkit.options import float_in, int_in
from toolkit.settings import DEFAULTS

from .references import Reference, half, load_references

__all__ = ["add_parser", "collect", "reliability", "stored_suffixes"]

SETS = ("spec_bench", "humaneval")
ATTEMPTS = 5
"""Lookups of one context before the fit stops."""


def stored_suffixes(source, context: list[int]) -> list:
    """Every stored suffix of ``context`` (token ids), longest first (``[]``: none), from ``source`` (a
    :class:`drafting.DatastoreSource`; a short ``retry_s`` keeps the wait short), looked up again after a fault: a
    source drafts without the datastore for ``retry_s`` after one (a lookup that timed out on a fresh build's cold
    pages), which keeps a server's output unchanged but would change what a fit reads.

    Raises:
        datastore.errors.DatastoreError: when the datastore faults :data:`ATTEMPTS` times running.
    """
    from datastore.errors import DatastoreError

    for _ in range(ATTEMPTS):
        faults = sum(source.faults.values())
        got = source.candidates_batch([context])[0]
        if source.client is not None and sum(source.faults.values()) == faults:  # answered, not down
            return got
        time.sleep(source.retry_s * 1.1)  # the source reopens its backend at its first lookup after retry_s
    raise DatastoreError(f"the datastore faulted {ATTEMPTS} times running ({dict(source.faults)}); rerun when the "
                         "server is reachable")


def collect(refs: list[Reference], source, *, calibration, outputs_bytes: int, vocab_size: int, stride: int = 1,
            live=None, desc: str = "replay", candidates: str = "longest", model=None):
    """Replay logs: ``(features, accepted, conditional score, token)`` of nodes whose parent was accepted (for
    fitting; the conditional is the node's score over its parent's), and per node of the first candidate's union
    ``(calibrated score, count-ratio score, accepted)``, from the native core's node tables under ``calibration``.

    Args:
        refs: the references replayed, in order (each request's output joins the output index when it ends).
        source: the datastore's :class:`drafting.DatastoreSource`. calibration: scores the tables (its prior sets the
            features). outputs_bytes / vocab_size: the drafter's. stride: every stride-th position.
        live: ``reference -> DatastoreSource`` of the live layer that request sees (``None``: none).
        desc: the progress bar's label. candidates: ``longest`` (the longest stored suffix's union only) or ``all``.
        model: ``(lm_head, states, head)``: the tables are read with each position's state, ``states(r, pos)``
            (``[d]`` float32), through ``head`` (a :class:`crest_native.Head`, as a step reads a row's state; ``None``:
            the state is the next-state estimate itself), against ``lm_head`` (``[V, d]`` float32), their features
            followed by the model features; ``calibration`` must then weigh them (``None``: plain tables).
    """
    from tqdm import tqdm

    from crest_native import FEATURES
    from drafting import DraftingService
    from drafting.accept import accepted_mask, reference_predictions

    xs, ys, conds, toks, scored = [], [], [], [], []
    plain = replace(calibration, coef=calibration.coef[:len(FEATURES)]) if calibration.with_model else calibration
    drafter = DraftingService(None, vocab_size=vocab_size, calibration=plain, outputs_bytes=outputs_bytes,
                              sources=calibration.sources)
    if model is not None:
        drafter.set_model(model[0], calibration, model[2])
    for r in tqdm(refs, desc=desc, unit="reference", dynamic_ncols=True):
        layer = None if live is None else live(r)
        seq = list(r.prompt) + r.output[:1]
        ref = np.asarray(r.output, dtype=np.int64)
        drafter.start_request(r.id, seq)
        for pos in range(1, len(ref)):
            if pos % stride == 0:
                cands = stored_suffixes(source, seq[-8:])
                cands = cands[:1] if candidates == "longest" else cands
                live_match = None if layer is None else layer.lookup(seq[-8:])
                state = None if model is None else model[1](r, pos)
                for j, table in enumerate(drafter.node_tables(r.id, cands, live_match, state)):
                    ok = accepted_mask(table.tokens, table.parents, table.depths,
                                       reference_predictions(table.depths, ref, pos))
                    parent_ok = np.where(table.parents >= 0, ok[np.maximum(table.parents, 0)], True)
                    xs.append(table.features[parent_ok].astype(np.float32))
                    ys.append(ok[parent_ok])
                    toks.append(table.tokens[parent_ok])
                    up = np.where(table.parents >= 0, table.scores[np.maximum(table.parents, 0)], 1.0)
                    conds.append((table.scores / up)[parent_ok])
                    if j == 0:
                        scored.append(np.column_stack([table.scores, _count_ratio(table), ok]))
            seq.append(int(ref[pos]))
            drafter.step([r.id], [0], tokens=[[int(ref[pos])]])
        drafter.stop_request(r.id)
    drafter.close()
    return (np.concatenate(xs), np.concatenate(ys), np.concatenate(conds), np.concatenate(toks),
            np.concatenate(scored))


def _count_ratio(table) -> np.ndarray:
    """The uncalibrated baseline: per node, the largest over the sources holding it of the product of its count
    ratios along the path (the source's own ranking, :meth:`drafting.Draft.from_tree` with the same prior)."""
    from crest_native import FEATURES
    from drafting.calibration import RETRIEVAL_SOURCES

    column = {name: i for i, name in enumerate(FEATURES)}
    best = np.zeros(len(table.tokens))
    for src in RETRIEVAL_SOURCES:
        p = table.features[:, column[f"{src}_ratio"]] * table.features[:, column[f"{src}_on"]]
        for depth in range(2, int(table.depths.max(initial=1)) + 1):
            level = table.depths == depth
            p[level] *= p[table.parents[level]]
        best = np.maximum(best, p)
    return best


def _cross_fit_layers(fit: list[Reference], top_t: int, tok) -> dict:
    """The live layer each fit prompt sees, cross-fitted: the fit half is split in two (alternate prompts within each
    category), each part's outputs are appended and compacted into a layer the OTHER part's prompts look up, so no
    prompt sees its own output. Returns ``prompt id -> DatastoreSource`` of that layer.

    Raises:
        ValueError: when a part holds no outputs to compact.
    """
    from datastore.connection import connect, resolve_database_url
    from datastore.layers import live_name
    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource
    from live.compaction import compact_live
    from live.store import encode_output

    parts: dict[str, list[Reference]] = {"calibfit-a": [], "calibfit-b": []}
    seen: dict[str, int] = {}
    for r in fit:
        i = seen[r.category] = seen.get(r.category, -1) + 1
        parts["calibfit-a" if i % 2 == 0 else "calibfit-b"].append(r)
    with connect(resolve_database_url(None), autocommit=True) as conn:
        for name, refs in parts.items():
            conn.execute("DELETE FROM live_outputs WHERE name = %s", [name])
            with conn.cursor().copy("COPY live_outputs (name, tokens, num_tokens, origin) FROM STDIN") as cp:
                for r in refs:
                    cp.write_row((name, encode_output(r.output), len(r.output), "python -m evaluation calibrate"))
    layers = {}
    for name in parts:
        res = compact_live(name, top_t=top_t)
        if res.build is None:
            raise ValueError(f"cross-fit live layer {live_name(name)}: no outputs to compact")
        print(f"cross-fit live layer {live_name(name)}: {res.outputs} outputs, {res.tokens:,} tokens, "
              f"{res.build.num_trees:,} n-grams")
        layers[name] = DatastoreSource(partial(SharedDatastore.open, live_name(name), tokenizer=tok))
    return {r.id: layers["calibfit-b" if name == "calibfit-a" else "calibfit-a"]
            for name, refs in parts.items() for r in refs}


def reliability(pred: np.ndarray, obs: np.ndarray, bins: int = 10) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Per bin of predicted probability (equal width): mean predicted, observed rate, count; and the expected
    calibration error (count-weighted mean ``|predicted - observed|``)."""
    edges = np.linspace(0, 1, bins + 1)
    idx = np.clip(np.digitize(pred, edges) - 1, 0, bins - 1)
    mp, ob, n = np.zeros(bins), np.zeros(bins), np.zeros(bins)
    for b in range(bins):
        m = idx == b
        n[b] = m.sum()
        if n[b]:
            mp[b], ob[b] = pred[m].mean(), obs[m].mean()
    ece = float((n * np.abs(mp - ob)).sum() / max(n.sum(), 1))
    return mp, ob, n, ece


def add_parser(sub, parents: list) -> None:
    """The ``calibrate`` subcommand."""
    ap = sub.add_parser("calibrate", parents=parents, description=" ".join(__doc__.split("\n\n")[0].split()),
                        help="fit the calibrated node scores on the fit half, report the other half.")
    ap.add_argument("--datastore", default="sharegpt", help="Spec-Bench's datastore (default: %(default)s).")
    ap.add_argument("--code-datastore", default="code", help="HumanEval's datastore (default: %(default)s).")
    ap.add_argument("--out", type=Path, default=Path("calibration.json"),
                    help="where the fitted parameters go (default: %(default)s; CREST_CALIBRATION names the file a "
                         "proposer reads; the shipped one is drafting/data/calibration.json).")
    ap.add_argument("--plot", type=Path, default=None, help="where the calibration curve's PNG goes (default: none).")
    ap.add_argument("--prior", type=float_in(0), default=1.0,
                    help="additive smoothing of the count ratios the features hold, >= 0 (default: 1.0).")
    ap.add_argument("--stride", type=int_in(1), default=1, help="visit every stride-th position.")
    ap.add_argument("--max-depth", type=int_in(1), default=16,
                    help="the requests' automata's deepest continuation node.")
    ap.add_argument("--outputs-mb", type=float_in(0), default=64.0,
                    help="the output index's bound, MiB (each set's earlier requests' outputs; 0: off).")
    ap.add_argument("--candidates", choices=("longest", "all"), default="longest",
                    help="the candidates whose unions are fitted and reported: the longest stored suffix's (default) "
                         "or every stored suffix's (what the back-off lookup of large trees chooses among).")
    ap.add_argument("--token-terms", type=int_in(0), default=256,
                    help="fit a logit bias for this many of the fitted nodes' most frequent tokens (default: 256; "
                         "0: no token term).")
    ap.add_argument("--live-top-t", type=int_in(1), default=DEFAULTS.live_top_t,
                    help="top-t of the cross-fitted live layers (default: %(default)s).")
    ap.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Fit, report, write the parameters (and the plot)."""
    from datastore.connection import resolve_database_url
    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource
    from toolkit import load_tokenizer

    from .contamination import require_clean

    tok = load_tokenizer()
    stores = {"spec_bench": args.datastore, "humaneval": args.code_datastore}
    sources = {name: DatastoreSource(partial(SharedDatastore.open, d, tokenizer=tok), retry_s=0.5)
               for name, d in stores.items()}
    refs = {name: load_references(name, args.references, tokenizer=tok) for name in SETS}
    for name in SETS:  # the corpora must not hold the prompts fitted on or reported
        require_clean(resolve_database_url(None), stores[name], name, [r.id for r in refs[name]])
    settings = {"outputs_bytes": int(args.outputs_mb * 2**20), "vocab_size": len(tok), "stride": args.stride,
                "candidates": args.candidates}
    cal = _fit(args, tok, refs, sources, stores, settings)
    report, rows = {}, []
    for name in SETS:
        report[name], curves = _report(name, half(refs[name], "report"), sources[name], cal, settings)
        rows.append((name, *curves))
    cal = replace(cal, meta={**cal.meta, "report": report})
    cal.save(args.out)
    print(f"wrote {args.out}")
    if args.plot is not None:
        _plot(rows, args.plot)
        print(f"wrote {args.plot}")
    print(json.dumps({"features": list(cal.to_json()["features"]), "coef": [round(c, 3) for c in cal.coef]}))


def _fit(args, tok, refs, sources, stores, settings):
    """The calibration fitted on the fit half, each prompt replayed with its cross-fitted live layer and without."""
    from crest_native import FEATURES
    from drafting import Calibration
    from drafting.calibration import RETRIEVAL_SOURCES
    from toolkit.tokenizer import tokenizer_fingerprint

    t0 = time.perf_counter()
    fit = [r for name in SETS for r in half(refs[name], "fit")]
    live = _cross_fit_layers(fit, args.live_top_t, tok)
    local = {"kind": "suffix", "max_depth": args.max_depth}
    features_only = Calibration(np.zeros(len(FEATURES)), 0.0, args.prior, {"local": local}, RETRIEVAL_SOURCES)
    parts = [collect(half(refs[name], "fit"), sources[name], calibration=features_only, live=layer,
                     desc=f"fit {name}{label}", **settings)
             for name in SETS for layer, label in ((lambda r: live[r.id], ""), (None, ", no live layer"))]
    x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    meta = {"datastores": stores, "builds": {n: s.identity() for n, s in sources.items()}, "fit_prompts": len(fit),
            "fit_rows": int(len(y)), "sets": list(SETS), "half": "fit (even positions within each category)",
            "fit_live": "each fit prompt replayed twice: with its cross-fitted live layer and with none",
            "candidates": args.candidates, "token_terms": args.token_terms, "local": local,
            "outputs": {"max_bytes": settings["outputs_bytes"], "max_depth": 16}}
    cal = Calibration.fit(x, y, prior=args.prior, sources=RETRIEVAL_SOURCES,
                          tokens=np.concatenate([p[3] for p in parts]), token_terms=args.token_terms,
                          tokenizer=tokenizer_fingerprint(tok), meta=meta)
    print(f"fitted on {len(fit)} prompts, {len(y):,} nodes in {time.perf_counter() - t0:.0f} s")
    return cal


def _report(name: str, held: list[Reference], source, cal, settings) -> tuple[dict, tuple]:
    """The report half's figures under ``cal``, printed; and its calibrated and count-ratio curves."""
    _, yr, q, _, scored = collect(held, source, calibration=cal, desc=f"report {name}", **settings)
    brier = float(((q - yr) ** 2).mean())
    cal_curve = reliability(scored[:, 0], scored[:, 2])
    old_curve = reliability(scored[:, 1], scored[:, 2])
    print(f"{name} (report half, {len(held)} prompts, {len(scored):,} nodes): ECE calibrated {cal_curve[3]:.3f} vs "
          f"count ratios {old_curve[3]:.3f}; conditional Brier {brier:.3f}")
    for lo, mp, ob, n, omp, oob, on in zip(np.linspace(0, 0.9, 10), *cal_curve[:3], *old_curve[:3]):
        print(f"  [{lo:.1f},{lo + 0.1:.1f})  calibrated: predicted {mp:.3f} observed {ob:.3f} ({int(n):>7})"
              f"   count ratio: predicted {omp:.3f} observed {oob:.3f} ({int(on):>7})")
    return ({"prompts": len(held), "nodes": int(len(scored)), "conditional_brier": brier,
             "ece_calibrated": cal_curve[3], "ece_count_ratio": old_curve[3],
             "mean_score_calibrated": float(scored[:, 0].mean()),
             "mean_score_count_ratio": float(scored[:, 1].mean()), "accepted_rate": float(scored[:, 2].mean())},
            (cal_curve, old_curve))


def _plot(rows, path: Path) -> None:
    """The held-out calibration curves (predicted against observed acceptance) as a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 4.4), squeeze=False)
    for ax, (name, cal, old) in zip(axes[0], rows):
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--", label="perfect")
        for (mp, ob, n, ece), label, marker in ((old, "count ratio (uncalibrated)", "s"), (cal, "calibrated", "o")):
            m = n > 0
            ax.plot(mp[m], ob[m], marker=marker, label=f"{label}, ECE {ece:.3f}")
        ax.set_title(f"{name}: held-out half")
        ax.set_xlabel("predicted P(node accepted)")
        ax.set_ylabel("observed acceptance")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
