"""A mixed stream whose requests name their datastores: chat requests (Spec-Bench) draft from the ShareGPT datastore,
code requests (HumanEval) from the code one, against ours over one datastore built from both corpora together, and
SuffixDecoding, by replay.

One stream: the report halves of both sets interleaved in a seeded order, each method one drafter across the whole
stream (so its index of finished outputs learns as a server's does: for ours and SuffixDecoding alike), every request
replayed against its saved greedy reference (:func:`evaluation.simulate.replay`; ``python -m evaluation references``).
Printed per method, form and budget: accept length (tokens per verification step, bonus included) over the stream and
over each set's requests, and ours ÷ the others. Methods (``--methods``):

- ``named``: ours (:class:`drafting.DraftingService` over a catalog: the shared ``--datastore``, and
  ``--code-datastore`` on the operator's list); a code request names the code datastore with the shared one off
  (``extra_args`` ``{"crest_datastore": "code", "crest_shared": 0}``), a chat request names none;
- ``named-shared``: the same, the shared datastore on for code requests too (both datastores' candidates compete);
- ``both``: ours over ``--both``, one datastore built from both corpora together;
- ``suffix``: SuffixDecoding as vLLM runs it (arctic-inference 0.3.0: the request's prompt tree and the global tree of
  the stream's earlier outputs).

The combined corpus is every ShareGPT document and every file of the interpreter's standard library, as JSON Lines
(``corpus``), built like any corpus; both its parts are screened against both sets by the build, as each part alone
is:

    python -m benchmarks.mixed_stream corpus --out results/both.jsonl
    python -m ingest build --name both --source jsonl --path results/both.jsonl --top-t 2M
    python -m benchmarks.mixed_stream [--budgets 8 16] [--forms chain tree]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import sysconfig
from pathlib import Path

from crest_native import MAX_BUDGET
from evaluation.references import Reference
from toolkit.options import int_in

from ._harness import finish, parser, references, require_clean

METHODS = ("named", "named-shared", "both", "suffix")
SETS = ("spec_bench", "humaneval")


def write_corpus(out: Path) -> dict:
    """Every ShareGPT document (rendered as its build renders it) and every ``.py`` file of this interpreter's standard
    library (as the ``code`` build reads them), one JSON line ``{"content": text}`` each; returns the counts."""
    from ingest.sources import iter_documents
    from toolkit import load_tokenizer

    tok = load_tokenizer()
    counts = {}
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for source, path in (("sharegpt", None), ("code", Path(sysconfig.get_paths()["stdlib"]))):
            _, batches = iter_documents(source, path, tokenizer=tok)
            n = 0
            for batch in batches:
                for text in batch.column("text").to_pylist():
                    f.write(json.dumps({"content": text}, ensure_ascii=False) + "\n")
                    n += 1
            counts[source] = n
    return counts


class Named:
    """Ours, each request started with the datastores its set names (``{set: (datastore or None, shared on)}``), as
    vLLM hands a request's ``extra_args`` over."""

    def __init__(self, service, choice: dict) -> None:
        self.service, self.choice, self.name = service, choice, service.name
        self.set = ""

    def start_request(self, req_id, prompt_ids) -> None:
        name, shared = self.choice[self.set]
        self.service.start_request(req_id, prompt_ids, datastore=name, shared=shared)

    def step(self, *args, **kwargs):
        return self.service.step(*args, **kwargs)

    def stop_request(self, req_id) -> None:
        self.service.stop_request(req_id)

    def config(self) -> dict:
        return self.service.config()

    def close(self) -> None:
        self.service.close()


def _drafter(method: str, args):
    """A fresh drafter of ``method`` for the whole stream."""
    from toolkit import load_tokenizer

    tok = load_tokenizer()
    if method == "suffix":
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        from .peer_drafters import SuffixDrafter

        return SuffixDrafter(SuffixDecodingCache(max_tree_depth=24), vocab_size=len(tok))
    from datastore.shared import SharedDatastore
    from drafting import DatastoreCatalog, DatastoreSource, DraftingService

    def connect(name: str) -> SharedDatastore:  # replay: the replica would give the same drafts
        return SharedDatastore.open(name, tokenizer=tok, replicas=False)

    shared = args.both if method == "both" else args.datastore
    catalog = DatastoreCatalog(DatastoreSource(lambda: connect(shared)), shared, connect=connect,
                               allowed=[args.code_datastore])
    service = DraftingService(catalog, vocab_size=len(tok))
    code = (None, True) if method == "both" else (args.code_datastore, method == "named-shared")
    named = Named(service, {"spec_bench": (None, True), "humaneval": code})
    if code[0] is not None:  # opened before the stream, as a server's is by its first requests
        catalog.resolve(code[0])
        _wait(catalog, code[0])
    return named


def _wait(catalog, name: str, timeout: float = 300) -> None:
    import time

    deadline = time.monotonic() + timeout
    while catalog.resolve(name) == 0:
        if time.monotonic() > deadline:
            raise SystemExit(f"error: the datastore {name!r} did not open (is it built?)")
        time.sleep(0.05)


def _stream(args) -> list[tuple[str, Reference]]:
    """The report halves of both sets, interleaved in a seeded order: ``(set, reference)``."""
    items = [(name, r) for name in SETS for r in references(name, args.references)]
    random.Random(args.seed).shuffle(items)
    return items


def measure(args) -> dict:
    from evaluation.simulate import replay

    methods = list(args.methods)
    if "suffix" in methods:
        try:
            import arctic_inference.suffix_decoding  # noqa: F401
        except ImportError:
            methods.remove("suffix")
            print("arctic-inference is not installed (bash scripts/setup-vllm.sh --arctic): no `suffix` rows")
    stream = _stream(args)
    for name in SETS:  # no datastore drafted from holds what is scored
        ids = [r.id for s, r in stream if s == name]
        for store in ([args.datastore] if name == "spec_bench" else [args.code_datastore, args.datastore]) + \
                ([args.both] if "both" in methods else []):
            require_clean(store, name, ids)
    rows = []
    for method in methods:
        for form in args.forms:
            for budget in args.budgets:
                drafter = _drafter(method, args)
                per = {name: [0, 0] for name in SETS}
                for name, r in stream:
                    if isinstance(drafter, Named):
                        drafter.set = name
                    res = replay(drafter, r.prompt, r.output, budget=budget, chain=form == "chain")
                    per[name][0] += len(res.output_ids) - 1  # the prefill token is no verification step's
                    per[name][1] += len(res.steps)
                drafter.close()
                tokens, steps = sum(c[0] for c in per.values()), sum(c[1] for c in per.values())
                row = {"method": method, "form": form, "budget": budget, "accept_length": tokens / steps,
                       **{name: c[0] / c[1] for name, c in per.items()}}
                rows.append(row)
                print(f"{method:<13} {form:<5} {budget:>3}: {row['accept_length']:.3f} (Spec-Bench "
                      f"{row['spec_bench']:.3f}, HumanEval {row['humaneval']:.3f})", flush=True)
    return {"rows": rows, "methods": methods, "requests": len(stream), "seed": args.seed}


def print_table(doc: dict) -> None:
    rows = doc["rows"]
    print(f"\n{doc['requests']} requests, seed {doc['seed']}: accept length over the stream (Spec-Bench / HumanEval)")
    print(f"{'form':<5} {'budget':>6}  " + "  ".join(f"{m:>22}" for m in doc["methods"])
          + "  named ÷ both  named ÷ suffix")
    for form in dict.fromkeys(r["form"] for r in rows):
        for budget in sorted({r["budget"] for r in rows if r["form"] == form}):
            got = {r["method"]: r for r in rows if r["form"] == form and r["budget"] == budget}
            cells = [f"{got[m]['accept_length']:.3f} ({got[m]['spec_bench']:.2f}/{got[m]['humaneval']:.2f})"
                     if m in got else "-" for m in doc["methods"]]
            ratio = [f"{got['named']['accept_length'] / got[m]['accept_length']:.3f}" if "named" in got and m in got
                     else "-" for m in ("both", "suffix")]
            print(f"{form:<5} {budget:>6}  " + "  ".join(f"{c:>22}" for c in cells) + f"  {ratio[0]:>12}"
                  f"  {ratio[1]:>14}")


def build_parser() -> argparse.ArgumentParser:
    ap = parser(__doc__, out="mixed_stream.json")
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS), help="default: all.")
    ap.add_argument("--forms", nargs="+", choices=("chain", "tree"), default=["chain", "tree"],
                    help="default: chain tree.")
    ap.add_argument("--budgets", nargs="+", type=int_in(1, MAX_BUDGET), default=[8, 16], help="default: 8 16.")
    ap.add_argument("--datastore", default="sharegpt", help="the shared datastore (ShareGPT; default: sharegpt).")
    ap.add_argument("--code-datastore", default="code", help="the datastore code requests name (default: code).")
    ap.add_argument("--both", default="both", help="the datastore built from both corpora together (default: both).")
    ap.add_argument("--seed", type=int_in(0), default=0, help="the stream's order (default: 0).")
    return ap


def main(argv: list[str] | None = None) -> None:
    raw = sys.argv[1:] if argv is None else argv
    if raw[:1] == ["corpus"]:
        corpus = argparse.ArgumentParser(prog="python -m benchmarks.mixed_stream corpus",
                                         description="Write the combined corpus as JSON Lines.")
        corpus.add_argument("--out", type=Path, required=True, help="the JSON Lines file written.")
        out = corpus.parse_args(raw[1:]).out
        print(json.dumps({"out": str(out), "documents": write_corpus(out)}))
        return
    ap = build_parser()
    args = ap.parse_args(raw)
    if args.code_datastore == args.datastore:
        ap.error(f"--code-datastore {args.code_datastore} is the shared --datastore: a request that names the shared "
                 "datastore drafts from it alone; name another (the code build)")
    finish(args, lambda: measure(args), print_table, "rows", "methods")


if __name__ == "__main__":
    main()
