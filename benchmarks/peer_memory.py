"""What the in-process peers would need to hold each corpus size of the corpus-size study, and what they accept.

For every size tokenized by ``python -m study corpus-size`` (its cached streams; run the study first):

- **SuffixDecoding** (arctic-inference, vLLM's ``suffix`` defaults): its global tree fed the whole corpus (every
  document as one finished response), then the report half of the size's evaluation set replayed, trees and chains;
- **SGLang NGRAM** (SGLang 0.5.23's own C++, ``benchmarks/sglang_ngram.py``): the corpus as its external suffix
  automaton, with no token cap (SGLang's default refuses corpora over 10M tokens), given ``--sglang-corpus-share`` of
  each tree's budget, BFS and PROB modes; trees only (SGLang verifies trees).

Memory is the resident-set growth of a fresh child process while it loads the corpus (psutil; for SGLang, which
builds its automaton in each replay's child, the smallest growth over those children, load and replay). A size whose
predicted memory (the largest measured bytes per corpus token times its tokens) is above ``--max-gib`` is not
loaded: its row gives the prediction, labelled ``extrapolated``. Each replay runs in a forked child of the loaded
process, so every replay starts from the same loaded state.

    python benchmarks/peer_memory.py [--workdir DIR] [--max-gib 18] [--out results/peer_memory.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from pathlib import Path

import numpy as np
import psutil

from evaluation.prompts import load_prompts
from evaluation.replay import reference_store
from evaluation.simulate import replay
from ingest.tokens import SEPARATOR, open_stream
from peers import SuffixMethod, _documents, warm_suffix
from toolkit import load_tokenizer
from toolkit.options import float_in, int_in, positive_float
from toolkit.tokenizer import DEFAULT_MODEL, cache_dir

EVAL = {"code": "humaneval", "sharegpt": "spec_bench"}
SHAPES = (("tree", 8), ("tree", 16), ("chain", 4), ("chain", 8))
ORDER = {"1x": 0, "3x": 1, "all": 2, "10pct": 0, "33pct": 1, "100pct": 2}


def _sizes(workdir: Path) -> list[tuple[str, str, Path, dict]]:
    """``(corpus, size, stream, meta)`` of every tokenized size, smallest first per corpus."""
    out = []
    for folder in sorted(workdir.glob("*-s0-*")):
        corpus, size = folder.name.split("-")[:2]
        if (folder / "corpus.json").exists() and corpus in EVAL and size in ORDER:
            out.append((corpus, size, folder / "tokens.u32", json.loads((folder / "corpus.json").read_text())))
    return sorted(out, key=lambda s: (s[0], ORDER[s[1]]))


def _replay_all(make, eval_set: str, shapes, grown: list[int] | None = None, limit: int | None = None) -> dict:
    """Accept length per shape, each in a forked child of this (loaded) process, over the report half (at most
    ``limit`` prompts per category); with ``grown``, each child's resident-set growth over its replay is appended to it
    (what ``make`` loaded, for a peer that loads per replay)."""
    tok = load_tokenizer()
    prompts = load_prompts(eval_set, tok, half="report", limit=limit)
    store = reference_store(DEFAULT_MODEL, "float32", eval_set, 128)
    saved = [store.get(p.id, p.token_ids) for p in prompts]
    refs = [r for r in saved if r is not None]
    if len(refs) < len(saved):
        raise SystemExit(f"missing references for {eval_set}: run `python -m study corpus-size` first")

    def one(shape: str, budget: int, out) -> None:
        from drafting import DraftingService

        rss0 = psutil.Process().memory_info().rss
        drafter = DraftingService(make(budget), vocab_size=len(tok))
        accepted = steps = 0
        for p, ref in zip(prompts, refs):
            for s in replay(drafter, p.token_ids, ref, budget, chain=shape == "chain").steps:
                accepted += s.accepted
                steps += 1
        out.send((accepted / max(steps, 1), psutil.Process().memory_info().rss - rss0))

    got = {}
    ctx = mp.get_context("fork")
    for shape, budget in shapes:
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=one, args=(shape, budget, send))
        proc.start()
        accept, growth = recv.recv()
        got[f"{shape} {budget}"] = round(accept, 4)
        if grown is not None:
            grown.append(growth)
        proc.join()
    return got


def _suffix(stream: Path, eval_set: str, limit: int | None, out) -> None:
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    rss0, t0 = psutil.Process().memory_info().rss, time.perf_counter()
    cache = SuffixDecodingCache(max_tree_depth=24)
    warm_suffix(cache, np.asarray(open_stream(stream)), int(SEPARATOR))
    grown, seconds = psutil.Process().memory_info().rss - rss0, time.perf_counter() - t0
    out.send({"bytes": grown, "load_s": round(seconds, 1),
              "accept": _replay_all(lambda budget: SuffixMethod(cache), eval_set, SHAPES, limit=limit)})


def _sglang(stream: Path, tokens: int, eval_set: str, share: float, limit: int | None, out) -> None:
    from sglang_ngram import SGLangCorpus, SGLangMethod

    docs = _documents(np.asarray(open_stream(stream)), int(SEPARATOR))
    cap = tokens + len(docs) + 1
    t0 = time.perf_counter()
    grown: list[int] = []  # each replay's child loads the corpus afresh: its growth is the automaton's memory
    accept = {}
    for mode in ("BFS", "PROB"):
        def make(nodes: int, mode: str = mode) -> SGLangCorpus:
            made = SGLangCorpus(nodes, mode, external_sam_budget=max(1, min(nodes, round(share * nodes))),
                                external_corpus_max_tokens=cap)
            made.load_corpus("corpus", docs, max_tokens=cap)
            return made

        def method(budget: int, make=make, mode: str = mode) -> SGLangMethod:
            return SGLangMethod(make, f"sglang-{mode}")

        for key, value in _replay_all(method, eval_set, [s for s in SHAPES if s[0] == "tree"], grown,
                                      limit).items():
            accept[f"{key} {mode.lower()}"] = value
    out.send({"bytes": min(grown), "load_s": round((time.perf_counter() - t0) / len(grown), 1), "accept": accept})


def _in_child(target, *args) -> dict:
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(*args, send))
    proc.start()
    got = recv.recv()
    proc.join()
    return got


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workdir", type=Path, default=Path(cache_dir()) / "study" / "sizes",
                   help="the corpus-size study's tokenized sizes (default: <cache>/study/sizes).")
    p.add_argument("--max-gib", type=positive_float, default=18.0,
                   help="load a corpus only when its predicted memory is at most this (default: 18 GiB of 24).")
    p.add_argument("--peers", nargs="+", choices=("suffix", "sglang"), default=["suffix", "sglang"],
                   help="peers measured (default: both; sglang needs `bash scripts/setup-vllm.sh --sglang`).")
    p.add_argument("--corpus", nargs="+", choices=tuple(EVAL), default=list(EVAL),
                   help="corpora measured (default: code sharegpt).")
    p.add_argument("--sglang-corpus-share", type=float_in(0.0, 1.0), default=0.5,
                   help="share of the budget given to SGLang's external corpus (default: 0.5, as benchmarks/peers.py).")
    p.add_argument("--out", type=Path, default=Path("results/peer_memory.json"),
                   help="the rows, JSON (default: %(default)s).")
    p.add_argument("--limit", type=int_in(1), default=None,
                   help="report-half prompts replayed per category of each set (default: all).")
    return p


def main() -> None:
    args = build_parser().parse_args()
    sizes = [s for s in _sizes(args.workdir) if s[0] in args.corpus]
    if not sizes:
        raise SystemExit(f"no tokenized sizes under {args.workdir}: run `python -m study corpus-size` first")
    rows = []
    for peer in args.peers:
        per_token = 0.0  # the largest bytes per corpus token measured so far (the extrapolation's rate)
        for corpus, size, stream, meta in sizes:
            tokens = int(meta["num_tokens"])
            row = {"peer": peer, "corpus": corpus, "size": size, "tokens": tokens}
            predicted = per_token * tokens
            if predicted / 2**30 > args.max_gib:
                row |= {"bytes": round(predicted), "extrapolated": True}
            else:
                got = (_in_child(_suffix, stream, EVAL[corpus], args.limit) if peer == "suffix" else
                       _in_child(_sglang, stream, tokens, EVAL[corpus], args.sglang_corpus_share, args.limit))
                row |= got | {"extrapolated": False}
                per_token = max(per_token, got["bytes"] / tokens)
            rows.append(row)
            label = "extrapolated" if row["extrapolated"] else f"loaded in {row['load_s']:.0f} s"
            print(f"{peer:>7} {corpus:>8} {size:>6}: {tokens:>12,} tokens, {row['bytes'] / 2**30:6.2f} GiB "
                  f"({row['bytes'] / tokens:.0f} B/token, {label}) {row.get('accept', '')}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
