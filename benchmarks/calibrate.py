"""Fit the calibrated node scores (:mod:`drafting.calibration`) on one half of the public prompts and report
them on the other half, with the calibration curve as a plot.

Every position of every reference output is visited (not only a drafter's steps, so the logs do not
depend on any drafter): the datastore's candidate n-grams (the longest stored suffix of the context, what chains and
trees under the back-off budget draft from; every stored suffix with ``--candidates all``), and for each
candidate the native core's node table (:meth:`drafting.MergedMethod.node_tables`): its union with the request's
own match (prompt and output so far), the match in the outputs of the requests before it (this process's output
index: the set's prompts run in file order, as a server would meet them) and the live layer's, with every node's
features. A node is accepted when its path
is what the target generated next. The conditional model is fitted on the nodes whose parent was
accepted (Spec-Bench and HumanEval, even positions within each category); the held-out half (odd
positions) reports predicted vs observed acceptance of every node, for the calibrated scores and for the
sources' own count ratios (each node's largest path product of count ratios over the sources that hold it).

The live layer's features (the model's earlier outputs, :mod:`datastore.live`) are fitted by cross-fitting:
the fit half is split in two, each part's outputs compacted into a live layer that the other part's
prompts look up (datastores ``calibfit-a.live`` and ``calibfit-b.live``, left in place for inspection).
The fit half is replayed twice, with that layer and with none, and both replays are fitted together: a server meets
both (a layer that is empty, not yet compacted or holds nothing for a prompt, and one that holds its kind). Fitted
with the layer alone, the other sources' weights lean on it, and on HumanEval's held-out half a replay without it
accepted 6% less at chain 8 (2.34 against 2.48 for the joint fit; docs/drafter-quality.md section 1).

The fit adds a bias per drafted token for the ``--token-terms`` tokens most frequent among the fitted nodes
(:class:`drafting.calibration.TokenBias`, named by the tokenizer's fingerprint): the token says how predictable
that kind of continuation is for the target, which no count does (docs/drafter-quality.md section 8 measured what the
token adds to a ranker). ``--token-terms 0`` fits none.

With ``--heads`` the S4C heads (:mod:`s4c`) are a fifth source: at every position their candidate tree (from the
target's hidden states over the reference, one forward pass per reference, cached) joins each union, and the fit
weighs their features too; the result is the merged+S4C calibration (``drafting/data/calibration-heads.json``).

    .venv/bin/python benchmarks/calibrate.py [--datastore sharegpt] [--code-datastore code] [--heads]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _lookup import stored_suffixes  # noqa: E402
from _refs import REPO, Reference, half, load_references, references_option, require_clean_datastore  # noqa: E402
from crest_native import FEATURES  # noqa: E402
from datastore.live import LIVE_TOP_T  # noqa: E402
from drafting import Calibration, DraftingService, MergedMethod  # noqa: E402
from drafting.accept import accepted_mask, reference_predictions  # noqa: E402
from drafting.calibration import HEADS_PATH, RETRIEVAL_SOURCES  # noqa: E402
from toolkit.options import float_in, int_in  # noqa: E402

COLUMN = {name: i for i, name in enumerate(FEATURES)}

SETS = ("spec_bench", "humaneval")


class HeadTrees:
    """The S4C heads' candidate tree at every position of a reference (``--heads``): an :class:`s4c.HeadsSource` fed
    the target's hidden states over the reference (one forward pass each, cached on disk)."""

    def __init__(self, name: str | None) -> None:
        from decoder.model import load_target
        from s4c import HeadsSource, load_heads
        from s4c.features import target_fingerprint
        from s4c.store import DEFAULT_HEADS

        self.target = load_target(device="cpu")
        self.source = HeadsSource(load_heads(self.target, name or DEFAULT_HEADS))
        self.fingerprint = target_fingerprint(self.target)

    def start(self, r: Reference) -> None:
        from s4c.features import reference_states

        self.states = reference_states(self.target, list(r.prompt) + list(r.output), fingerprint=self.fingerprint)
        self.tokens = np.asarray(list(r.prompt) + r.output[:1], dtype=np.uint32)
        self.state = self.source.start()
        self.source.add_hidden_states(self.state, self.states[: len(r.prompt)])

    def tree(self, r: Reference):
        return self.source.tree(self.state, len(self.tokens), self.tokens[self.state.done:])

    def add(self, r: Reference, token: int, position: int) -> None:
        """Append the reference token at ``position`` (the previous position's state with it)."""
        self.tokens = np.append(self.tokens, np.uint32(token))
        self.source.add_hidden_states(self.state, self.states[position - 1: position])

    def stop(self, r: Reference) -> None:
        """Nothing kept past a request."""


def collect(refs, source, *, calibration: Calibration, outputs_bytes: int, vocab_size: int, stride: int = 1,
            live=None, heads: HeadTrees | None = None, desc: str = "replay", candidates: str = "longest"):
    """Replay logs: ``(features, accepted, conditional score, token)`` of nodes whose parent was accepted (for
    fitting; the conditional is the node's score over its parent's), and per node of the longest candidate's union
    ``(calibrated score, count-ratio score, accepted)``, from the native core's node tables under ``calibration``
    (its prior sets the features; its weights the scores).
    ``live``: ``reference -> DatastoreSource`` of the live layer that request sees (``None``: none).
    ``heads``: the S4C heads' trees, a fifth source (``None``: none).
    The requests' outputs go into the core's output index, each after its request (as a server's finish).
    ``desc`` labels the progress bar (references done, the time left).
    ``candidates``: ``longest`` reads the longest stored suffix's union only (what every draft below the back-off
    budget reads: chains, and trees under ``back_off_min_budget`` nodes), ``all`` every stored suffix's."""
    from tqdm import tqdm

    xs, ys, conds, toks, scored = [], [], [], [], []
    method = MergedMethod(None, vocab_size=vocab_size, calibration=calibration, outputs_bytes=outputs_bytes,
                          sources=calibration.sources)
    core = DraftingService(method, vocab_size=vocab_size)
    for r in tqdm(refs, desc=desc, unit="reference", dynamic_ncols=True):
        layer = None if live is None else live(r)
        seq = list(r.prompt) + r.output[:1]
        ref = np.asarray(r.output, dtype=np.int64)
        core.start_request(r.id, r.prompt)
        core.add_tokens(r.id, r.output[:1])
        if heads is not None:
            heads.start(r)
        for pos in range(1, len(ref)):
            if pos % stride == 0:
                cands = stored_suffixes(source, seq[-8:])
                if candidates == "longest":
                    cands = cands[:1]
                tree = None if heads is None else heads.tree(r)
                live_match = None if layer is None else layer.lookup(seq[-8:])
                for j, table in enumerate(method.node_tables(core, r.id, cands, live_match, tree)):
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
            core.add_tokens(r.id, [int(ref[pos])])
            if heads is not None:
                heads.add(r, int(ref[pos]), len(seq) - 1)
        core.stop_request(r.id)
        if heads is not None:
            heads.stop(r)
    return (np.concatenate(xs), np.concatenate(ys), np.concatenate(conds), np.concatenate(toks),
            np.concatenate(scored))


def _count_ratio(table) -> np.ndarray:
    """The uncalibrated baseline: per node, the largest over the sources holding it of the product of its count
    ratios along the path (the source's own ranking, :meth:`drafting.Draft.from_tree` with the same prior)."""
    best = np.zeros(len(table.tokens))
    for src in RETRIEVAL_SOURCES:
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
    from drafting import DatastoreSource
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


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--datastore", default="sharegpt", help="Spec-Bench's datastore (ShareGPT).")
    ap.add_argument("--code-datastore", default="code", help="HumanEval's datastore (Python code).")
    ap.add_argument("--heads", nargs="?", const="", default=None, metavar="NAME",
                    help="fit with the S4C heads as a fifth source: the heads NAME (default: the target's shipped "
                         "heads); the parameters go to drafting/data/calibration-heads.json.")
    ap.add_argument("--out", type=Path, default=None,
                    help="where the fitted parameters go (default: the shipped drafting/data/calibration.json, or "
                         "calibration-heads.json with --heads).")
    ap.add_argument("--plot", type=Path, default=None,
                    help="where the calibration curve's PNG goes (default: docs/img/calibration.png, or "
                         "calibration-heads.png with --heads).")
    ap.add_argument("--prior", type=float_in(0), default=1.0,
                    help="additive smoothing of the count ratios the features hold, >= 0 (default: 1.0).")
    ap.add_argument("--stride", type=int_in(1), default=1, help="visit every stride-th position.")
    ap.add_argument("--max-depth", type=int_in(1), default=16,
                    help="the requests' automata's deepest continuation node.")
    ap.add_argument("--outputs-mb", type=float_in(0), default=64.0,
                    help="the output index's bound, MiB (each set's earlier requests' outputs; 0: off).")
    ap.add_argument("--candidates", choices=("longest", "all"), default="longest",
                    help="the datastore candidates whose unions are fitted and reported: the longest stored suffix's "
                         "(default; what chains and trees under the back-off budget draft from) or every stored "
                         "suffix's (what the back-off lookup of large trees chooses among).")
    ap.add_argument("--token-terms", type=int_in(0), default=256,
                    help="fit a logit bias for this many of the fitted nodes' most frequent tokens (default: 256; "
                         "0: no token term).")
    ap.add_argument("--live-top-t", type=int_in(1), default=LIVE_TOP_T, help="top-t of the cross-fitted live layers.")
    references_option(ap)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource
    from toolkit import load_tokenizer
    from toolkit.tokenizer import tokenizer_fingerprint

    tok = load_tokenizer()
    heads = HeadTrees(args.heads or None) if args.heads is not None else None
    weighed = (*RETRIEVAL_SOURCES, "heads") if heads is not None else RETRIEVAL_SOURCES
    out = args.out or (HEADS_PATH if heads is not None else REPO / "drafting" / "data" / "calibration.json")
    plot = args.plot or REPO / "docs" / "img" / ("calibration-heads.png" if heads is not None else "calibration.png")
    stores = {"spec_bench": args.datastore, "humaneval": args.code_datastore}
    sources = {name: DatastoreSource(partial(SharedDatastore.open, d, tokenizer=tok), retry_s=0.5)
               for name, d in stores.items()}
    refs = {name: load_references(name, args.references) for name in SETS}
    for name in SETS:  # the corpora must not hold the prompts fitted on or reported
        require_clean_datastore(stores[name], name, [r.id for r in refs[name]])
    t0 = time.perf_counter()
    fit = [r for name in SETS for r in half(refs[name], "fit")]
    live = _cross_fit_layers(fit, args, tok)
    local = {"kind": "suffix", "max_depth": args.max_depth}
    features_only = Calibration(np.zeros(len(FEATURES)), 0.0, args.prior, {"local": local}, weighed)  # the features
    settings = {"outputs_bytes": int(args.outputs_mb * 2**20), "vocab_size": len(tok), "stride": args.stride,
                "heads": heads, "candidates": args.candidates}
    parts = [collect(half(refs[name], "fit"), sources[name], calibration=features_only, live=layer,
                     desc=f"fit {name}{label}", **settings)
             for name in SETS for layer, label in ((lambda r: live[r.id], ""), (None, ", no live layer"))]
    x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    tokens = np.concatenate([p[3] for p in parts])
    cal = Calibration.fit(x, y, prior=args.prior, sources=weighed, tokens=tokens, token_terms=args.token_terms,
                          tokenizer=tokenizer_fingerprint(tok), meta={
        "datastores": stores, "builds": {n: s.identity() for n, s in sources.items()}, "fit_prompts": len(fit),
        "fit_rows": int(len(y)),
        "sets": list(SETS), "half": "fit (even positions within each category)",
        "fit_live": "each fit prompt replayed twice: with its cross-fitted live layer and with none",
        "candidates": args.candidates, "token_terms": args.token_terms,
        "local": local, "outputs": {"max_bytes": settings["outputs_bytes"], "max_depth": 16},
        **({"heads": heads.source.config()} if heads is not None else {})})
    print(f"fitted on {len(fit)} prompts, {len(y):,} nodes in {time.perf_counter() - t0:.0f} s")
    report = {}
    fig_rows = []
    for name in SETS:
        held = half(refs[name], "report")
        _, yr, q, _, scored = collect(held, sources[name], calibration=cal, desc=f"report {name}", **settings)
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
    cal = replace(cal, meta={**cal.meta, "report": report})
    cal.save(out)
    print(f"wrote {out}")
    _plot(fig_rows, plot)
    print(f"wrote {plot}")
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
