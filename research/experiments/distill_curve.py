"""The distillation curve (issue 43): accept length on Spec-Bench's report half against how many of the target's own
answer tokens the datastore was built from; alone, beside a human corpus, and against the human corpus alone at the
same number of tokens.

The answers are ``python -m evaluation distill``'s output (OpenAI-messages JSON Lines, each with its answer's token
count): the target's greedy answers to chat prompts that are not the scored ones (the distill screens prompts and
answers against the evaluation sets; each build screens again, and the replay refuses a datastore whose corpus holds
a scored item). For each size S of ``--sizes`` (answer tokens), the first answers, in file order, whose answers add up
to at most S are taken, and three datastores are built from them (``python -m ingest build --source chat``, top-t
``--top-t``):

- ``distilled``: the answers alone (their prompts and answers, as ``--source chat`` reads a chat);
- ``human+distilled``: the human corpus (``--human``) and the answers;
- ``human, equal tokens``: the human corpus's first conversations up to the same number of corpus tokens as
  ``distilled`` (what the answers' tokens are worth against human text).

Then ``human`` alone (the whole ``--human``) once, for reference. Each datastore is replayed, datastore alone (its
calibrated tree, backing off) and merged (with the request's own tokens and the output index), as a chain of
``--chain`` and a tree of ``--tree`` nodes: accept length is tokens per verification step, bonus included. The
datastores are dropped at the end (``--keep`` keeps them).

    .venv/bin/python -m evaluation distill --path CHATS --out results/distill/answers.jsonl.zst --token-budget 60000
    python -m research.experiments.distill_curve --answers results/distill/answers.jsonl.zst \\
        --human results/fleet/yesterday.jsonl.zst --sizes 12500 25000 50000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._harness import RESULTS, parser, references, require_clean
from toolkit.options import int_in  # noqa: E402

OUT = RESULTS / "distill_curve.json"


def _answers(path: Path) -> list[tuple[str, int]]:
    """Each line of the distill's output, with its answer's tokens, in file order.

    Raises:
        SystemExit: when the file is missing or a line is not a distilled chat.
    """
    from ingest.files import open_corpus_file

    if not path.exists():
        raise SystemExit(f"error: --answers {path} does not exist: make it with `python -m evaluation distill`")
    out = []
    with open_corpus_file(path) as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8").rstrip("\n")
                if line.strip():
                    out.append((line, int(json.loads(line)["distilled"]["output_tokens"])))
            except (ValueError, KeyError, TypeError):
                raise SystemExit(f"error: --answers {path} line {n} is not a distilled chat (no "
                                 "distilled.output_tokens): pass `python -m evaluation distill`'s output") from None
    return out


def _write(path: Path, lines: list[str]) -> Path:
    from evaluation.distill import append_chunk

    path.unlink(missing_ok=True)
    append_chunk(path, lines)
    return path


def _build(name: str, paths: list[Path], top_t: str) -> tuple[int, int]:
    """Build ``name`` from chat files; returns its corpus tokens and its bytes on disk."""
    from datastore.admin.catalog import datastore_stats
    from datastore.connection import resolve_database_url

    subprocess.run([sys.executable, "-m", "ingest", "build", "--source", "chat", "--path", *map(str, paths),
                    "--name", name, "--top-t", top_t, "--quiet"], check=True, stdout=subprocess.DEVNULL)
    stats = datastore_stats(resolve_database_url(None), name)
    return int(stats["tokens"]), int(stats["bytes_total"])


def _human_prefix(human: Path, tokens: int, out: Path) -> Path:
    """The human corpus's first conversations up to ``tokens`` corpus tokens (as a chat build counts them)."""
    from collections import Counter

    from evaluation.distill import read_conversations
    from toolkit import load_tokenizer
    from toolkit.tokenizer import render_chat

    tok = load_tokenizer()
    lines: list[str] = []
    total = 0
    for conv in read_conversations([human], Counter()):
        n = len(tok.encode(render_chat(tok, conv), add_special_tokens=False))
        if total + n > tokens and lines:
            break
        lines.append(json.dumps({"messages": conv}, ensure_ascii=False))
        total += n
    return _write(out, lines)


def _replay(name: str, refs, chain: int, tree: int) -> dict[str, float]:
    """Accept length of ``name`` on ``refs``: datastore alone and merged, chain and tree."""
    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource, DraftingService
    from evaluation.simulate import replay
    from toolkit import load_tokenizer

    tok = load_tokenizer()
    out = {}
    for method in ("datastore", "merged"):
        for form, budget in (("chain", chain), ("tree", tree)):
            source = DatastoreSource(lambda: SharedDatastore.open(name, tokenizer=tok, replicas=False))
            service = (DraftingService(source, vocab_size=len(tok), sources=("ds",), back_off_min_budget=0,
                                       outputs_bytes=0)
                       if method == "datastore" else DraftingService(source, vocab_size=len(tok)))
            accepted = steps = 0
            try:
                for r in refs:
                    res = replay(service, r.prompt, r.output, budget, chain=form == "chain")
                    accepted += len(res.output_ids) - 1
                    steps += len(res.steps)
            finally:
                service.close()
            out[f"{method} {form} {budget}"] = accepted / max(steps, 1)
    return out


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = parser(__doc__)
    ap.add_argument("--answers", type=Path, required=True, help="python -m evaluation distill's output.")
    ap.add_argument("--human", type=Path, required=True, help="the human chat corpus the answers are set beside.")
    ap.add_argument("--sizes", nargs="+", type=int_in(1), required=True, help="answer tokens per point.")
    ap.add_argument("--top-t", default="2M", help="n-grams per n kept by every build (default: 2M).")
    ap.add_argument("--chain", type=int_in(1), default=8, help="chain budget (default: 8).")
    ap.add_argument("--tree", type=int_in(1), default=16, help="tree budget (default: 16).")
    ap.add_argument("--name", default="dcurve", help="prefix of the datastores built (default: dcurve).")
    ap.add_argument("--keep", action="store_true", help="keep the datastores built.")
    ap.add_argument("--out", type=Path, default=OUT, help="the results (default: results/distill_curve.json).")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if not args.human.exists():
        raise SystemExit(f"error: --human {args.human} does not exist: pass a chat corpus (e.g. "
                         "python -m benchmarks.fleet prepare's results/fleet/yesterday.jsonl.zst)")
    answers = _answers(args.answers)
    have = sum(t for _, t in answers)
    if max(args.sizes) > have:
        raise SystemExit(f"error: --answers {args.answers} holds {have} answer tokens, fewer than --sizes "
                         f"{max(args.sizes)}: distill more (a rerun of the distill resumes) or lower --sizes")
    refs = references("spec_bench", args.references)
    work = args.out.parent / "distill_curve"
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    built: list[str] = []
    try:
        def point(label: str, size: int, paths: list[Path]) -> int:
            name = f"{args.name}-{len(rows)}"
            built.append(name)
            t0 = time.perf_counter()
            tokens, nbytes = _build(name, paths, args.top_t)
            require_clean(name, "spec_bench", [r.id for r in refs])
            rows.append({"corpus": label, "answer_tokens": size, "corpus_tokens": tokens, "bytes": nbytes,
                         **_replay(name, refs, args.chain, args.tree), "seconds": time.perf_counter() - t0})
            print(json.dumps(rows[-1]), flush=True)
            return tokens

        point("human", 0, [args.human])
        for size in sorted(args.sizes):
            lines, total = [], 0
            for line, t in answers:
                if total + t > size:
                    break
                lines.append(line)
                total += t
            subset = _write(work / f"answers-{size}.jsonl.zst", lines)
            tokens = point("distilled", total, [subset])
            point("human+distilled", total, [args.human, subset])
            point("human, equal tokens", 0, [_human_prefix(args.human, tokens, work / f"human-{size}.jsonl.zst")])
    finally:
        if not args.keep and built:
            from datastore.admin.catalog import drop_datastore
            from datastore.connection import resolve_database_url

            for name in built:
                drop_datastore(resolve_database_url(None), name)
    args.out.write_text(json.dumps({"references": "spec_bench report half", "top_t": args.top_t, "rows": rows}))
    keys = [k for k in rows[0] if k.startswith(("datastore", "merged"))]
    print(f"\n{'corpus':<22} {'answer tok':>10} {'corpus tok':>11} {'MB':>7} " + " ".join(f"{k:>18}" for k in keys))
    for r in rows:
        print(f"{r['corpus']:<22} {r['answer_tokens']:>10,} {r['corpus_tokens']:>11,} {r['bytes'] / 1e6:>7.1f} "
              + " ".join(f"{r[k]:>18.3f}" for k in keys))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
