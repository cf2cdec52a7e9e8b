"""The serving benchmark's drafters by replay, at equal budgets, tree and chain: drafter quality apart from
engine noise.

References are the greedy outputs vLLM produced without speculation in ``benchmarks/vllm_serving.py``
(``--references``, default its ``results/vllm_serving.json``); fp32 greedy decoding in vLLM equals ours
(``tests/test_vllm.py``), so every step replays exactly (:func:`decoder.simulate.replay`). Prompts run in
the benchmark's order, one after another, so SuffixDecoding's global tree learns from earlier responses
as it does in vLLM. Drafters:

- ``ngram``: prompt lookup (:class:`decoder.drafters.pld.PromptLookupDrafter`: the longest suffix of 4..1
  tokens found earlier in the sequence, the next ``budget`` tokens; chain only), as vLLM's ``ngram``
  method (which the engine run configures with suffixes of 4..2 tokens);
- ``suffix``: SuffixDecoding (arctic-inference 0.3.0, vLLM's ``suffix`` defaults: tree depth 24,
  spec factor 1.0, min token prob 0.1; its prompt tree per request and the global tree of responses);
- ``ours``: :class:`decoder.service.DraftingService` on the datastore (merged with the prompt trie), as
  vLLM runs it: chains cut at ``--min-score``; trees as :class:`decoder.MergedDrafter` builds them.

Prints accept length (tokens per step, bonus included) per set, budget and form, and ours / best peer.

    .venv/bin/python benchmarks/peers.py [--budgets 1 2 3 4 8 16] [--datastore sharegpt]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from decoder import Draft
from decoder.simulate import replay

REPO = Path(__file__).resolve().parents[1]


class ServiceDrafter:
    """One request at a time through a :class:`decoder.service.DraftingService`."""

    def __init__(self, service, chain: bool) -> None:
        self.service, self.chain, self.n = service, chain, 0

    def begin(self, prompt_ids) -> None:
        self.n += 1
        self.service.start_request(self.n, list(prompt_ids))

    def propose(self, budget: int) -> Draft:
        return self.service.propose([(self.n, budget)], chain=self.chain)[0]

    def extend(self, tokens) -> None:
        self.service.add_tokens(self.n, list(tokens))

    def end(self) -> None:
        self.service.stop_request(self.n)


class SuffixDrafter:
    """SuffixDecoding through arctic-inference's ``SuffixDecodingCache`` (one cache for the whole run)."""

    def __init__(self, cache, tree: bool) -> None:
        self.cache, self.tree, self.n, self.seq = cache, tree, 0, []

    def begin(self, prompt_ids) -> None:
        self.n += 1
        self.seq = list(prompt_ids)
        self.cache.start_request(self.n, np.asarray(self.seq[:-1], dtype=np.int32))
        self.cache.add_active_response(self.n, np.asarray(self.seq[-1:], dtype=np.int32))

    def propose(self, budget: int) -> Draft:
        if budget == 0:
            return Draft.empty()
        ctx = np.asarray(self.seq[-self.cache.max_tree_depth:], dtype=np.int32)
        d = self.cache.speculate(self.n, ctx, max_spec_tokens=budget, max_spec_factor=1.0, min_token_prob=0.1,
                                 use_tree_spec=self.tree)
        if not d.token_ids:
            return Draft.empty()
        return Draft(np.asarray(d.token_ids, np.int64), np.asarray(d.parents, np.int32),
                     np.asarray(d.probs, np.float64))

    def extend(self, tokens) -> None:
        self.seq += list(tokens)
        self.cache.add_active_response(self.n, np.asarray(list(tokens), dtype=np.int32))

    def end(self) -> None:
        self.cache.stop_request(self.n)


def _references(path: Path) -> dict[str, list[tuple[list[int], list[int]]]]:
    """Per set, ``(prompt ids, greedy output)`` from the serving benchmark's no-speculation runs (the run
    with the most prompts)."""
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    from vllm_serving import _prompts

    runs = [r for r in json.loads(path.read_text())["runs"] if r["method"] == "none"]
    if not runs:
        raise SystemExit(f"{path} holds no no-speculation run: run benchmarks/vllm_serving.py first")
    out = {}
    for name in runs[0]["sets"]:
        best = max(runs, key=lambda r: len(r["sets"][name]["prompts"]))
        run = best["sets"][name]
        by_id = {p.id: p for p in _prompts(name, "all", 10_000)}
        out[name] = [(list(map(int, by_id[i].token_ids)), o) for i, o in zip(run["prompts"], run["outputs"])]
    return out


def _table(rows: list[dict]) -> None:
    """Prints accept length per set, budget and form, and ours / the best peer; a tree's best peer is the
    best peer draft of either form (a chain is a tree)."""
    print(f"{'set':<11} {'budget':>6}  {'form':<5}  " + "  ".join(f"{m:>6}" for m in ("ours", "ngram", "suffix"))
          + "  ours/best peer")
    for name in dict.fromkeys(r["set"] for r in rows):
        for budget in sorted({r["budget"] for r in rows if r["set"] == name}):
            at = [r for r in rows if r["set"] == name and r["budget"] == budget]
            for form in ("chain", "tree"):
                got = {r["method"]: r["accept_length"] for r in at if r["form"] == form}
                peers = [r["accept_length"] for r in at if r["method"] != "ours" and (form == "tree" or r["form"] == form)]
                cells = "  ".join("     -" if got.get(m) is None else f"{got[m]:>6.2f}" for m in ("ours", "ngram", "suffix"))
                ratio = f"{got['ours'] / max(peers):.2f}" if peers and "ours" in got else "-"
                print(f"{name:<11} {budget:>6}  {form:<5}  {cells}  {ratio:>6}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--references", type=Path, default=REPO / "results" / "vllm_serving.json")
    ap.add_argument("--budgets", nargs="+", type=int, default=[1, 2, 3, 4, 8, 16])
    ap.add_argument("--datastore", default="sharegpt")
    ap.add_argument("--min-score", type=float, default=0.2, help="our chains' cut (the proposer's default)")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "peers.json")
    ap.add_argument("--table", action="store_true", help="only print the table of an earlier run's --out")
    args = ap.parse_args()
    if args.table:
        return _table(json.loads(args.out.read_text()))
    from datastore import load_tokenizer
    from datastore.shared import SharedDatastore
    from decoder.drafters import DatastoreSource
    from decoder.drafters.pld import PromptLookupDrafter
    from decoder.service import DraftingService

    refs = _references(args.references)
    tok = load_tokenizer()
    source = DatastoreSource(lambda: SharedDatastore.open(args.datastore, tokenizer=tok))
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except ImportError:
        SuffixDecodingCache = None
        print("arctic-inference is not installed (bash scripts/setup-vllm.sh --arctic): no `suffix` rows")
    drafters = {("ours", "chain"): lambda: ServiceDrafter(DraftingService(source, min_score=args.min_score), True),
                ("ours", "tree"): lambda: ServiceDrafter(DraftingService(source), False),
                ("ngram", "chain"): lambda: PromptLookupDrafter(max_ngram=4, max_tokens=10_000)}
    if SuffixDecodingCache is not None:
        drafters[("suffix", "chain")] = lambda: SuffixDrafter(SuffixDecodingCache(max_tree_depth=24), False)
        drafters[("suffix", "tree")] = lambda: SuffixDrafter(SuffixDecodingCache(max_tree_depth=24), True)
    rows = []
    for name, pairs in refs.items():
        for budget in args.budgets:
            for (method, form), make in drafters.items():
                drafter = make()  # fresh state (and, for suffix, a fresh global tree) per budget
                tokens = steps = 0
                for prompt, output in pairs:
                    res = replay(drafter, prompt, output, budget=budget)
                    tokens += len(res.output_ids) - 1  # the prefill token is not a verification step's
                    steps += len(res.steps)
                rows.append({"set": name, "budget": budget, "method": method, "form": form,
                             "prompts": len(pairs), "accept_length": tokens / max(steps, 1)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    _table(rows)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
