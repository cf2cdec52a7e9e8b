"""Fit the calibrated node scores (:mod:`decoder.calibration`) on one half of the public prompts and report
them on the other half, with the calibration curve as a plot.

Every position of every reference output is visited (not only a drafter's steps, so the logs do not
depend on any drafter): the datastore's candidate n-grams (all stored suffixes of the context), the
request's own match (prompt and output so far, :mod:`decoder.local`), the match in the outputs of the
requests before it (this process's output index, :mod:`decoder.output_index`: the set's prompts run in file
order, as a server would meet them), and for each candidate the union with the others. A node is accepted when its path
is what the target generated next. The conditional model is fitted on the nodes whose parent was
accepted (Spec-Bench and HumanEval, even positions within each category); the held-out half (odd
positions) reports predicted vs observed acceptance of every node, for the calibrated scores and for the
sources' own count ratios (each node's largest path product of count ratios over the sources that hold it).

The live layer's features (the model's earlier outputs, :mod:`datastore.live`) are fitted by cross-fitting:
the fit half is split in two, each part's outputs compacted into a live layer that the other part's
prompts look up (datastores ``calibfit-a.live`` and ``calibfit-b.live``, left in place for inspection).

    .venv/bin/python benchmarks/calibrate.py [--datastore sharegpt] [--code-datastore code]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _refs import REPO, Reference, half, load_references  # noqa: E402
from decoder.accept import accepted_mask, reference_predictions  # noqa: E402
from decoder.calibration import COLUMN, SOURCES, Calibration, node_table  # noqa: E402
from decoder.core import MATCH_NODES  # noqa: E402
from decoder.local import LocalStrategy, SuffixMatching, TrieMatching  # noqa: E402
from decoder.output_index import OutputIndex  # noqa: E402

SETS = ("spec_bench", "humaneval")


def collect(refs, source, *, prior: float, local: LocalStrategy, outputs_bytes: int, max_depth: int,
            calibration: Calibration | None = None, stride: int = 1, live=None):
    """Replay logs: ``(features, accepted)`` of nodes whose parent was accepted (for fitting), and per
    node of the longest candidate's union ``(calibrated score or nan, count-ratio score, accepted)``.
    ``live``: ``reference -> DatastoreSource`` of the live layer that request sees (``None``: none).
    The requests' outputs go into one output index, each after its request (as a server's finish)."""
    xs, ys, scored = [], [], []
    outputs = OutputIndex(outputs_bytes, max_depth)
    for r in refs:
        layer = None if live is None else live(r)
        seq = list(r.prompt) + r.output[:1]
        ref = np.asarray(r.output, dtype=np.int64)
        own = local.new()
        own.extend(seq)
        for pos in range(1, len(ref)):
            if pos % stride == 0:
                cands = source.candidates_batch([seq[-8:]])[0]
                others = {"local": own.match(MATCH_NODES), "outputs": outputs.match(seq, MATCH_NODES),
                          "live": None if layer is None else layer.lookup(seq[-8:])}
                for j, cand in enumerate(cands or [None]):
                    table = node_table({"ds": cand, **others}, prior)
                    if table is None:
                        continue
                    ok = accepted_mask(table.tokens, table.parents, table.depths,
                                       reference_predictions(table.depths, ref, pos))
                    parent_ok = np.where(table.parents >= 0, ok[np.maximum(table.parents, 0)], True)
                    xs.append(table.features[parent_ok].astype(np.float32))
                    ys.append(ok[parent_ok])
                    if j == 0:
                        cal = calibration.scores(table) if calibration is not None else np.full(len(ok), np.nan)
                        scored.append(np.column_stack([cal, _count_ratio(table), ok]))
            seq.append(int(ref[pos]))
            own.extend([int(ref[pos])])
        outputs.add(r.output)
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(scored)


def _count_ratio(table) -> np.ndarray:
    """The uncalibrated baseline: per node, the largest over the sources holding it of the product of its count
    ratios along the path (the source's own ranking, :meth:`decoder.Draft.from_tree` with the same prior)."""
    best = np.zeros(len(table.tokens))
    for src in SOURCES:
        p = table.features[:, COLUMN[f"{src}_ratio"]] * table.features[:, COLUMN[f"{src}_on"]]
        for depth in range(2, int(table.depths.max(initial=1)) + 1):
            level = table.depths == depth
            p[level] *= p[table.parents[level]]
        best = np.maximum(best, p)
    return best


def _cross_fit_layers(fit, args, tok) -> dict:
    """The live layer each fit prompt sees, cross-fitted: the fit half is split in two (alternate prompts
    within each category), each part's outputs are appended and compacted (``ingest.live.compact_live``)
    into a layer the OTHER part's prompts look up, so no prompt sees its own output. Returns
    ``prompt id -> DatastoreSource`` of that layer."""
    from datastore.connection import connect, resolve_database_url
    from datastore.live import encode_output, live_name
    from datastore.shared import SharedDatastore
    from decoder.drafters import DatastoreSource
    from ingest.live import compact_live

    parts: dict[str, list[Reference]] = {"calibfit-a": [], "calibfit-b": []}
    seen: dict[str, int] = {}
    for r in fit:
        i = seen[r.category] = seen.get(r.category, -1) + 1
        parts["calibfit-a" if i % 2 == 0 else "calibfit-b"].append(r)
    url = resolve_database_url(None)
    with connect(url, autocommit=True) as conn:
        for name, refs in parts.items():
            conn.execute("DELETE FROM live_outputs WHERE name = %s", [name])
            with conn.cursor().copy("COPY live_outputs (name, tokens, num_tokens, origin) FROM STDIN") as cp:
                for r in refs:
                    cp.write_row((name, encode_output(r.output), len(r.output), "benchmarks/calibrate.py"))
    layers = {}
    for name in parts:
        res = compact_live(name, top_t=args.live_top_t)
        if res.build is None:
            raise SystemExit(f"cross-fit live layer {live_name(name)}: no outputs to compact")
        print(f"cross-fit live layer {live_name(name)}: {res.outputs} outputs, {res.tokens:,} tokens, "
              f"{res.build.num_trees:,} n-grams")
        layers[name] = DatastoreSource(partial(SharedDatastore.open, live_name(name), tokenizer=tok))
    return {r.id: layers["calibfit-b" if name == "calibfit-a" else "calibfit-a"]
            for name, refs in parts.items() for r in refs}


def reliability(pred: np.ndarray, obs: np.ndarray, bins: int = 10) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Per bin of predicted probability (equal width): mean predicted, observed rate, count; and the
    expected calibration error (count-weighted mean |predicted - observed|)."""
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datastore", default="sharegpt", help="Spec-Bench's datastore (ShareGPT)")
    ap.add_argument("--code-datastore", default="code", help="HumanEval's datastore (Python code)")
    ap.add_argument("--out", type=Path, default=REPO / "decoder" / "data" / "calibration.json")
    ap.add_argument("--plot", type=Path, default=REPO / "docs" / "img" / "calibration.png")
    ap.add_argument("--prior", type=float, default=1.0)
    ap.add_argument("--stride", type=int, default=1, help="visit every stride-th position")
    ap.add_argument("--local", choices=("suffix", "trie"), default="suffix",
                    help="the requests' own tokens: suffix automata (any context length) or the N-gram trie")
    ap.add_argument("--max-depth", type=int, default=16, help="suffix automata: deepest continuation node")
    ap.add_argument("--window", type=int, default=13, help="trie: its window n (stored with the fit)")
    ap.add_argument("--max-prefix", type=int, default=3, help="trie: its longest context Lp (stored with the fit)")
    ap.add_argument("--outputs-mb", type=float, default=64.0,
                    help="the output index's bound, MiB (each set's earlier requests' outputs; 0: off)")
    ap.add_argument("--live-top-t", type=int, default=200_000, help="top-t of the cross-fitted live layers")
    args = ap.parse_args()
    from datastore import load_tokenizer
    from datastore.shared import SharedDatastore
    from decoder.drafters import DatastoreSource

    tok = load_tokenizer()
    stores = {"spec_bench": args.datastore, "humaneval": args.code_datastore}
    sources = {name: DatastoreSource(partial(SharedDatastore.open, d, tokenizer=tok)) for name, d in stores.items()}
    refs = {name: load_references(name) for name in SETS}
    t0 = time.perf_counter()
    fit = [r for name in SETS for r in half(refs[name], "fit")]
    live = _cross_fit_layers(fit, args, tok)
    local: LocalStrategy = (SuffixMatching(args.max_depth) if args.local == "suffix"
                            else TrieMatching(args.window, args.max_prefix))
    settings = {"local": local, "outputs_bytes": int(args.outputs_mb * 2**20), "max_depth": args.max_depth}
    parts = [collect(half(refs[name], "fit"), sources[name], prior=args.prior, stride=args.stride,
                     live=lambda r: live[r.id], **settings) for name in SETS]
    x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    cal = Calibration.fit(x, y, prior=args.prior, meta={
        "datastores": stores, "builds": {n: s.identity() for n, s in sources.items()}, "fit_prompts": len(fit),
        "fit_rows": int(len(y)),
        "sets": list(SETS), "half": "fit (even positions within each category)",
        "local": local.config(), "outputs": {"max_bytes": settings["outputs_bytes"], "max_depth": args.max_depth}})
    print(f"fitted on {len(fit)} prompts, {len(y):,} nodes in {time.perf_counter() - t0:.0f} s")
    report = {}
    fig_rows = []
    for name in SETS:
        held = half(refs[name], "report")
        xr, yr, scored = collect(held, sources[name], prior=args.prior, calibration=cal, stride=args.stride,
                                 **settings)
        q = cal.conditional(xr.astype(np.float64))
        brier = float(((q - yr) ** 2).mean())
        cal_curve = reliability(scored[:, 0], scored[:, 2])
        old_curve = reliability(scored[:, 1], scored[:, 2])
        report[name] = {"prompts": len(held), "nodes": int(len(scored)), "conditional_brier": brier,
                        "ece_calibrated": cal_curve[3], "ece_count_ratio": old_curve[3],
                        "mean_score_calibrated": float(scored[:, 0].mean()),
                        "mean_score_count_ratio": float(scored[:, 1].mean()),
                        "accepted_rate": float(scored[:, 2].mean())}
        fig_rows.append((name, cal_curve, old_curve))
        print(f"{name} (report half, {len(held)} prompts, {len(scored):,} nodes): ECE calibrated "
              f"{cal_curve[3]:.3f} vs count ratios {old_curve[3]:.3f}; conditional Brier {brier:.3f}")
        for lo, mp, ob, n, omp, oob, on in zip(np.linspace(0, 0.9, 10), *cal_curve[:3], *old_curve[:3]):
            print(f"  [{lo:.1f},{lo + 0.1:.1f})  calibrated: predicted {mp:.3f} observed {ob:.3f} ({int(n):>7})"
                  f"   count ratio: predicted {omp:.3f} observed {oob:.3f} ({int(on):>7})")
    cal = Calibration(cal.coef, cal.intercept, cal.prior, {**cal.meta, "report": report})
    cal.save(args.out)
    print(f"wrote {args.out}")
    _plot(fig_rows, args.plot)
    print(f"wrote {args.plot}")
    print(json.dumps(dict(zip(("features", "coef"),
                              (list(cal.to_json()["features"]), [round(c, 3) for c in cal.coef])))))


def _plot(rows, path: Path) -> None:
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


if __name__ == "__main__":
    main()
