"""The peer benchmark: accept length of every drafter by replay, at equal budgets, tree and chain, per
category of Spec-Bench and on HumanEval, and ours / the best peer.

Replay (:func:`evaluation.simulate.replay`) against the target's saved greedy outputs
(``python -m evaluation references``) gives exactly the steps of a lossless greedy run, free of engine noise; each row
also carries a digest of every draft it replayed (SHA-256 of each draft's token ids, parents and scores), so two runs
that print the same digests drafted the same, bit for bit.
Reported on the held-out half of each set (odd positions within each category; the calibration was fitted
on the even half), prompts one after another in file order, every drafter on the same prompts. Accept
length: output tokens per verification step, bonus included (the prefill token excluded).

Every corpus-based drafter draws on the same corpus: ShareGPT for Spec-Bench (the ``sharegpt`` datastore,
``python -m ingest build``), this interpreter's standard library for HumanEval (the ``code`` datastore,
``python -m ingest build --name code --source code --path <stdlib>``); neither holds evaluation text.
Drafters (``--methods``):

- ``merged``: ours, :class:`drafting.DraftingService` with its defaults: the calibrated scores, refitted online on
  the verdicts of the steps replayed before (``csrc/online.hpp``: in file order, each step scored with what the
  earlier steps taught), and the back-off lookup: the datastore merged with the request's own suffix automaton and
  the index of the run's finished outputs (as in vLLM); ``merged-frozen``: the same with the shipped calibration as
  it is (``online_strength=0``); ``merged-no-index``: ``merged`` without the index of earlier outputs; ``local``:
  ``merged`` without the datastore; ``datastore``: the datastore alone (calibrated, backing off at every tree
  budget);
- ``suffix``: SuffixDecoding (arctic-inference 0.3.0, vLLM's ``suffix`` defaults: tree depth 24, spec
  factor 1.0, min token prob 0.1): the request's prompt tree plus the global tree of earlier responses in
  the run; ``suffix-warm``: the same with the global tree first fed the whole corpus (every document as
  one response; its RAM is printed);
- ``ngram``: prompt lookup as vLLM's ``ngram`` method (longest suffix of 4..1 tokens found earlier, the
  next ``budget`` tokens; a chain);
- ``rest``: REST (suffix array of the same corpus, ``python -m benchmarks.rest_index [--source code --path
  <stdlib>]``; contexts 16..2,
  <= 5000 occurrences, 10-token continuations) pruned to the budget; its chain is the best path;
- ``sglang-bfs`` / ``sglang-prob``: SGLang 0.5.23's NGRAM drafter, its own C++ (:mod:`benchmarks.sglang_ngram`),
  BFS (recency) or PROB (frequency) mode, server defaults, its trie shared by the run's requests; a tree peer only
  (SGLang verifies trees); ``sglang-bfs-corpus`` / ``sglang-prob-corpus``: the same with the corpus as its
  external suffix automaton (its first 10M tokens, SGLang's default cap: the whole standard library, a third of
  ShareGPT; 6.1 GiB of RAM for the 9.1M-token standard library), given ``--sglang-corpus-share`` of the budget
  (SGLang's ``external_sam_budget``).

A tree's best peer is the best peer draft of either form (a chain is a tree). arctic-inference and SGLang are
optional (``bash scripts/setup-vllm.sh --arctic --sglang``): without them their rows are left out.

    bash scripts/peers.sh                         # one command: installs and builds what is missing, then runs
    python -m benchmarks.peers                    # every drafter, budgets 1 2 3 4 8 16 32 64
    python -m benchmarks.peers --table            # reprint the last run's tables
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from crest_native import MAX_BUDGET
from evaluation.simulate import replay
from toolkit.options import float_in, int_in

from ._harness import finish, parser, references, require_clean
from .peer_drafters import PromptLookup, RetrievalDrafter, SuffixDrafter

CODE_PATH_HINT = " --path <the standard library>"
SGLANG = ("sglang-bfs", "sglang-prob", "sglang-bfs-corpus", "sglang-prob-corpus")
PEERS = ("suffix", "suffix-warm", "ngram", "rest", *SGLANG)
OURS = ("merged", "merged-frozen", "merged-no-index", "local", "datastore")
CHAIN_ONLY = ("ngram",)
TREE_ONLY = SGLANG


def _documents(tokens: np.ndarray, separator: int) -> list[np.ndarray]:
    """A corpus token stream's documents (between separators)."""
    cuts = np.flatnonzero(tokens == separator)
    bounds = zip([0, *(cuts + 1).tolist()], [*cuts.tolist(), len(tokens)])
    return [tokens[s:e] for s, e in bounds if e > s]


def warm_suffix(cache, tokens: np.ndarray, separator: int) -> int:
    """Feed every document of a token stream to the global tree as one finished response; returns documents."""
    docs = _documents(tokens, separator)
    for i, doc in enumerate(docs):
        cache_id = ("corpus", i)
        cache.start_request(cache_id, np.zeros(0, dtype=np.int32))
        cache.add_active_response(cache_id, doc.astype(np.int32))
        cache.stop_request(cache_id)
    return len(docs)


_STATE: dict = {}  # set in the parent before forking: references, warmed cache, arguments


def corpus_of(name: str, args) -> tuple[str, str]:
    """``(datastore, REST index source)`` a set is drafted from: chat sets from ShareGPT, code from Python code."""
    return (args.code_datastore, "code") if name == "humaneval" else (args.datastore, "sharegpt")


def _make(method: str, name: str):
    """A fresh drafter of ``method`` for set ``name``."""
    from toolkit import load_tokenizer

    args = _STATE["args"]
    datastore, corpus = corpus_of(name, args)
    vocab = len(load_tokenizer())
    if method in OURS:
        return _ours(method, datastore)
    if method == "ngram":
        return PromptLookup(max_ngram=4, max_tokens=10_000, vocab_size=vocab)
    if method == "rest":
        from drafting import DatastoreSource

        index = _STATE["rest"][corpus]
        return RetrievalDrafter(DatastoreSource(lambda: index), vocab_size=vocab)
    if method in SGLANG:
        return _sglang(method, corpus, vocab)
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    cache = _STATE["warm"][corpus] if method == "suffix-warm" else SuffixDecodingCache(max_tree_depth=24)
    return SuffixDrafter(cache, vocab_size=vocab)


def _ours(method: str, datastore: str):
    """Ours, or one of its parts: without the output index, without the datastore, the datastore alone."""
    from datastore.shared import SharedDatastore
    from drafting import Calibration, DatastoreSource, DraftingService
    from toolkit import load_tokenizer

    args = _STATE["args"]
    tok = load_tokenizer()
    source = None if method == "local" else DatastoreSource(  # replay: the replica would give the same drafts
        lambda: SharedDatastore.open(datastore, tokenizer=tok, replicas=False))
    calibration = Calibration.load(args.calibration)
    if method == "datastore":  # the datastore's share of ours: its calibrated tree, backing off at every budget
        return DraftingService(source, vocab_size=len(tok), calibration=calibration, min_score=args.node_cost,
                               sources=("ds",), back_off_min_budget=0, outputs_bytes=0)
    return DraftingService(source, vocab_size=len(tok), calibration=calibration, min_score=args.node_cost,
                           outputs_bytes=0 if method == "merged-no-index" else None,
                           online_strength=0.0 if method == "merged-frozen" else None)


def _sglang(method: str, corpus: str, vocab: int):
    """SGLang's NGRAM drafter in ``method``'s mode, with the corpus as its external automaton for ``-corpus``."""
    from .sglang_ngram import SGLangCorpus, SGLangDrafter

    args = _STATE["args"]
    mode = method.split("-")[1].upper()

    def make(nodes: int) -> SGLangCorpus:
        if not method.endswith("-corpus"):
            return SGLangCorpus(nodes, mode)
        share = max(1, min(nodes, round(args.sglang_corpus_share * nodes)))
        made = SGLangCorpus(nodes, mode, external_sam_budget=share)  # SGLang's default corpus cap: 10M tokens
        index = _STATE["rest"][corpus]
        made.load_corpus(corpus, _documents(np.asarray(index.tokens), index.separator),
                         max_tokens=made.max_corpus_tokens)
        return made

    return SGLangDrafter(make, method, vocab_size=vocab)


class Digest:
    """A drafter whose every step's drafts are hashed (their token ids, parents and scores): two replays with the same
    digest drafted the same, bit for bit."""

    def __init__(self, drafter) -> None:
        self.drafter, self.name, self.sha = drafter, drafter.name, hashlib.sha256()

    def start_request(self, req_id, prompt_ids) -> None:
        self.drafter.start_request(req_id, prompt_ids)

    def stop_request(self, req_id) -> None:
        self.drafter.stop_request(req_id)

    def step(self, requests, budgets, **kw):
        made = self.drafter.step(requests, budgets, **kw)
        if any(budgets):
            for d in made.drafts:
                self.sha.update(len(d).to_bytes(4, "little"))
                self.sha.update(d.token_ids.astype(np.int64).tobytes())
                self.sha.update(d.parents.astype(np.int32).tobytes())
                self.sha.update(d.scores.astype(np.float64).tobytes())
        return made

    def config(self) -> dict:
        return self.drafter.config()

    def close(self) -> None:
        self.drafter.close()


def run_task(task: tuple[str, str, str, int]) -> list[dict]:
    """One (set, method, form, budget): a fresh drafter (in a forked child: a warmed tree's additions stay
    there) replayed over the set's held-out half; accept length per category."""
    name, method, form, budget = task
    made = _make(method, name)
    drafter = Digest(made)
    per: dict[str, list[int]] = {}
    t0 = time.perf_counter()
    for r in _STATE["refs"][name]:
        res = replay(drafter, r.prompt, r.output, budget=budget, chain=form == "chain")
        c = per.setdefault(r.category, [0, 0, 0, 0])
        c[0] += len(res.output_ids) - 1  # the prefill token is not a verification step's
        c[1] += len(res.steps)
        c[2] += sum(s.drafted for s in res.steps)
        c[3] += 1
    wall = time.perf_counter() - t0
    made.close()  # its connection pool
    tokens, steps = sum(c[0] for c in per.values()), sum(c[1] for c in per.values())
    rows = [{"set": name, "category": "all", "method": method, "form": form, "budget": budget,
             "prompts": sum(c[3] for c in per.values()), "accept_length": tokens / max(steps, 1),
             "nodes_per_step": sum(c[2] for c in per.values()) / max(steps, 1),
             "ms_per_step": 1e3 * wall / max(steps, 1), "digest": drafter.sha.hexdigest()[:16]}]
    rows += [{"set": name, "category": cat, "method": method, "form": form, "budget": budget, "prompts": c[3],
              "accept_length": c[0] / max(c[1], 1)} for cat, c in per.items()]
    return rows


def _cell(got: dict, m: str) -> str:
    return "     -" if got.get(m) is None else f"{got[m]:>6.2f}"


def print_tables(rows: list[dict], methods: list[str]) -> None:
    """Accept length per set, budget and form for every method, merged / the best peer and, for trees, merged /
    SGLang's best tree (either mode, with its external corpus); then per category (tree form) merged vs the best
    peer."""
    top = [r for r in rows if r["category"] == "all"]
    peers = [m for m in methods if m in PEERS]
    ratios = "merged" in methods and bool(peers)  # the ratio columns of the methods that ran, no column of dashes
    vs_corpus = "merged" in methods and any(m in SGLANG and m.endswith("-corpus") for m in methods)
    print(f"{'set':<11} {'budget':>6}  {'form':<5}  " + "  ".join(f"{m[:15]:>15}" for m in methods)
          + ("  merged/best peer" if ratios else "") + ("  merged/sglang+corpus" if vs_corpus else ""))
    for name in dict.fromkeys(r["set"] for r in top):
        for budget in sorted({r["budget"] for r in top if r["set"] == name}):
            for form in ("tree", "chain"):
                at = [r for r in top if r["set"] == name and r["budget"] == budget]
                got = {r["method"]: r["accept_length"] for r in at if r["form"] == form}
                best = max([r["accept_length"] for r in at
                            if r["method"] in peers and (form == "tree" or r["form"] == form)], default=None)
                sgl = max([r["accept_length"] for r in at if r["method"] in SGLANG and r["method"].endswith("-corpus")],
                          default=None)
                line = f"{name:<11} {budget:>6}  {form:<5}  " + "  ".join(f"{_cell(got, m):>15}" for m in methods)
                if ratios:
                    line += f"  {got['merged'] / best:>16.2f}" if best and "merged" in got else f"  {'-':>16}"
                if vs_corpus:
                    line += f"  {got['merged'] / sgl:>20.2f}" if sgl and form == "tree" and "merged" in got \
                        else f"  {'-':>20}"
                print(line)
    cats = [r for r in rows if r["category"] != "all"]
    trees = any(r["form"] == "tree" for r in cats)
    if trees and ratios:
        _by_category(cats, "merged / best peer", 11, lambda at: _merged_and_best_peer(at, peers))


def _tree(at: list[dict], method: str) -> float | None:
    return next((r["accept_length"] for r in at if r["method"] == method and r["form"] == "tree"), None)


def _merged_and_best_peer(at: list[dict], peers: list[str]) -> str:
    """Merged's tree against the best peer in either form (a chain-only peer counts)."""
    ours = _tree(at, "merged")
    best = max((r["accept_length"] for r in at if r["method"] in peers), default=None)
    return "-" if ours is None or best is None else f"{ours:.2f}/{best:.2f}"


def _by_category(cats: list[dict], what: str, width: int, cell) -> None:
    """One line per set and category: ``cell(the rows of that set, category and budget)`` at each tree budget."""
    budgets = sorted({r["budget"] for r in cats if r["form"] == "tree"})
    print(f"\nper category (tree form): {what} accept length at budgets {budgets}")
    for name in dict.fromkeys(r["set"] for r in cats):
        for cat in dict.fromkeys(r["category"] for r in cats if r["set"] == name):
            cells = [cell([r for r in cats if r["set"] == name and r["category"] == cat and r["budget"] == b])
                     for b in budgets]
            print(f"{name:<11} {cat:<15} " + "  ".join(f"{c:>{width}}" for c in cells))


def build_parser() -> argparse.ArgumentParser:
    """This benchmark's command line."""
    ap = parser(__doc__, out="peers.json")
    ap.add_argument("--sets", nargs="+", default=["spec_bench", "humaneval"],
                    help="evaluation sets replayed (default: spec_bench humaneval).")
    ap.add_argument("--half", choices=("report", "fit", "all"), default="report",
                    help="which prompts: the odd positions within each category (report), the even ones (fit, where "
                         "settings are chosen) or all (default: report).")
    ap.add_argument("--budgets", nargs="+", type=int_in(1, MAX_BUDGET), default=[1, 2, 3, 4, 8, 16, 32, 64],
                    help="draft nodes (trees) or tokens (chains) per step (default: 1 2 3 4 8 16 32 64).")
    ap.add_argument("--methods", nargs="+", default=[*OURS, *PEERS], choices=[*OURS, *PEERS],
                    help="drafters replayed; peers that are not installed are left out (default: all).")
    ap.add_argument("--datastore", default="sharegpt", help="the chat sets' datastore (ShareGPT).")
    ap.add_argument("--code-datastore", default="code",
                    help="HumanEval's datastore (Python code: python -m ingest build --name code --source code ...).")
    ap.add_argument("--calibration", type=Path, default=None,
                    help="default: the shipped drafting/data/calibration.json.")
    ap.add_argument("--node-cost", type=float_in(0, 1), default=0.0,
                    help="ours: a node's verification cost in accepted tokens; the draft stops where the next "
                         "node's acceptance probability falls below it (0: always fill the budget).")
    ap.add_argument("--sglang-corpus-share", type=float_in(0, 1), default=0.5,
                    help="sglang-*-corpus: the share of the budget SGLang gives its external corpus "
                         "(external_sam_budget; at least 1 node).")
    ap.add_argument("--workers", type=int_in(1), default=2, help="replays run at once (forked processes).")
    return ap


def _installed(methods: list[str]) -> list[str]:
    """``methods`` but the peers whose package is not installed (each named once)."""
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except ImportError:
        methods = [m for m in methods if not m.startswith("suffix")]
        print("arctic-inference is not installed (bash scripts/setup-vllm.sh --arctic): no `suffix` rows")
    from .sglang_ngram import available

    missing = available()
    if missing and any(m in SGLANG for m in methods):
        methods = [m for m in methods if m not in SGLANG]
        print(f"{missing}: no `sglang` rows")
    return methods


def _corpora(args, methods: list[str], info: dict) -> None:
    """REST's indexes of the corpora (rest, suffix-warm, the sglang corpora) and the warmed suffix trees, loaded before
    the workers fork."""
    if not {"rest", "suffix-warm", "sglang-bfs-corpus", "sglang-prob-corpus"} & set(methods):
        return
    from benchmarks.rest_index import SuffixIndex, default_index_dir
    from toolkit import load_tokenizer

    _STATE["rest"] = {}
    for name in args.sets:
        corpus = corpus_of(name, args)[1]
        index_dir = default_index_dir(load_tokenizer(), corpus)
        if not index_dir.exists():
            raise SystemExit(
                f"{index_dir} not found: build REST's index first "
                f"(python -m benchmarks.rest_index --source {corpus}{CODE_PATH_HINT if corpus == 'code' else ''})")
        _STATE["rest"][corpus] = SuffixIndex.load(index_dir)
    if "suffix-warm" not in methods:
        return
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    _STATE["warm"], info["suffix_warm"] = {}, {}
    for corpus, index in _STATE["rest"].items():
        rss0, t0 = psutil.Process().memory_info().rss, time.perf_counter()
        cache = _STATE["warm"][corpus] = SuffixDecodingCache(max_tree_depth=24)
        docs = warm_suffix(cache, np.asarray(index.tokens), index.separator)
        info["suffix_warm"][corpus] = w = {"documents": docs, "tokens": int(index.num_tokens),
                                           "seconds": time.perf_counter() - t0,
                                           "rss_gib": (psutil.Process().memory_info().rss - rss0) / 2**30}
        print(f"suffix-warm ({corpus}): global tree fed {docs:,} corpus documents ({w['tokens']:,} tokens) in "
              f"{w['seconds']:.0f} s, +{w['rss_gib']:.2f} GiB RAM", flush=True)


def measure(args) -> dict:
    """Every (set, method, form, budget) replayed, two at a time in forked workers."""
    if args.calibration is None:
        from drafting.calibration import DEFAULT_PATH

        args.calibration = DEFAULT_PATH
    methods = _installed(list(args.methods))
    _STATE["args"] = args
    _STATE["refs"] = {name: references(name, args.references, args.half) for name in args.sets}
    if set(OURS) & set(methods):
        for name, refs in _STATE["refs"].items():  # its corpus must not hold what is scored
            require_clean(corpus_of(name, args)[0], name, [r.id for r in refs])
    info: dict[str, Any] = {"prompts": {n: len(v) for n, v in _STATE["refs"].items()}}
    _corpora(args, methods, info)
    tasks = [(name, m, form, b) for name in args.sets for b in args.budgets for m in methods
             for form in (("chain",) if m in CHAIN_ONLY else ("tree",) if m in TREE_ONLY else ("tree", "chain"))]
    rows: list[dict] = []
    t0 = time.perf_counter()
    with mp.get_context("fork").Pool(args.workers, maxtasksperchild=1) as pool:
        for i, got in enumerate(pool.imap_unordered(run_task, tasks), 1):
            rows += got
            r = got[0]
            spent = time.perf_counter() - t0
            print(f"[{i}/{len(tasks)} {spent:.0f}s, ~{spent / i * (len(tasks) - i):.0f}s left] {r['set']} "
                  f"{r['method']} {r['form']} budget {r['budget']}: {r['accept_length']:.3f} "
                  f"({r['ms_per_step']:.2f} ms/step, digest {r['digest']})", flush=True)
    order = {m: i for i, m in enumerate(methods)}
    rows.sort(key=lambda r: (args.sets.index(r["set"]), r["budget"], order[r["method"]], r["form"], r["category"]))
    return {"methods": methods, "info": info, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    finish(args, lambda: measure(args), lambda doc: print_tables(doc["rows"], doc["methods"]), "rows", "methods")


if __name__ == "__main__":
    main()
