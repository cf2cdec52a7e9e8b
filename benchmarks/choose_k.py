"""Choose the vLLM proposer's ``k`` (``num_speculative_tokens``) and its probability floor (``CREST_MIN_SCORE``) on
the fit half, by replay and the engine's own cost model.

For each ``k`` and floor, every fit-half prompt of both sets is replayed with the merged drafter's chains
(:func:`evaluation.simulate.replay`, exact for greedy decoding), cut where the proposer cuts them: below
``max(floor, break-even)``, the break-even score of the batch size (:mod:`serving.cost`) under a step cost
``T(N) = a + b N`` for ``N`` verified tokens. With the replayed accept length ``L`` (tokens per step and row)
and drafted tokens ``d`` per row and step, a batch of ``B`` rows makes ``B L`` tokens in ``a + b B (1 + d)``
seconds; the script prints that throughput relative to no speculation (``B / (a + b B)``) for each concurrency,
and the best ``(k, floor)`` per concurrency. ``a`` and ``b`` default to what the proposer fitted inside vLLM on
this machine (``--step-cost``; ``benchmarks/vllm_serving.py`` prints them).

    .venv/bin/python benchmarks/choose_k.py [--k 4 8 12 16] [--floors 0.02 0.05 0.1 0.2] [--concurrency 1 8 32]
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _refs import half, load_references, references_option, require_clean_datastore  # noqa: E402
from toolkit.options import float_in, int_in  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """This script's command line."""
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--k", nargs="+", type=int_in(1), default=[4, 8, 12, 16],
                    help="num_speculative_tokens values tried (default: 4 8 12 16).")
    ap.add_argument("--floors", nargs="+", type=float_in(0, 1), default=[0.02, 0.05, 0.1, 0.2],
                    help="CREST_MIN_SCORE values tried, probabilities (default: 0.02 0.05 0.1 0.2).")
    ap.add_argument("--concurrency", nargs="+", type=int_in(1), default=[1, 8, 32],
                    help="rows per step whose break-even cut is modelled (default: 1 8 32).")
    ap.add_argument("--step-cost", nargs=2, type=float_in(0), default=[0.042, 0.0027], metavar=("A", "B"),
                    help="seconds per step and per verified token (default: the proposer's fit in vLLM here).")
    ap.add_argument("--datastore", default="sharegpt", help="Spec-Bench's datastore (default: sharegpt).")
    ap.add_argument("--code-datastore", default="code", help="HumanEval's datastore (default: code).")
    references_option(ap)
    return ap


def main() -> None:
    args = build_parser().parse_args()
    from tqdm import tqdm

    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource, DraftingService, MergedMethod
    from evaluation.simulate import replay
    from toolkit import load_tokenizer

    a, b = args.step_cost
    tok = load_tokenizer()
    sets = {"spec_bench": args.datastore, "humaneval": args.code_datastore}
    refs = {name: half(load_references(name, args.references), "fit") for name in sets}
    for name, datastore in sets.items():
        require_clean_datastore(datastore, name, [r.id for r in refs[name]])
    print(f"step cost a = {1e3 * a:.1f} ms, b = {1e3 * b:.2f} ms per verified token; fit half; "
          "throughput x no speculation (accept length, drafted per row and step)")
    best: dict[tuple[str, int], tuple[float, int, float]] = {}
    for name, ds in sets.items():
        source = DatastoreSource(functools.partial(SharedDatastore.open, ds, tokenizer=tok, replicas=False))
        replayed: dict[tuple[int, float], tuple[float, float]] = {}  # (k, cut) -> (accept length, drafted per step)
        for c in args.concurrency:
            break_even = b * c / (a + b * c)
            for k in args.k:
                for floor in args.floors:
                    cut = round(max(floor, break_even), 6)
                    if (k, cut) not in replayed:
                        service = DraftingService(MergedMethod(source, vocab_size=len(tok), min_score=cut),
                                                  vocab_size=len(tok))
                        tokens = steps = drafted = 0
                        for r in tqdm(refs[name], desc=f"{name} k={k} cut={cut:g}", unit="reference", leave=False):
                            res = replay(service, r.prompt, r.output, k, chain=True)
                            tokens += len(res.output_ids) - 1
                            steps += len(res.steps)
                            drafted += sum(s.drafted for s in res.steps)
                        replayed[(k, cut)] = (tokens / steps, drafted / steps)
                    accept, per_row = replayed[(k, cut)]
                    speed = (c * accept / (a + b * c * (1 + per_row))) / (c / (a + b * c))
                    print(f"{name:<11} c={c:<3} k={k:<3} floor={floor:<5} cut={cut:.3f}  x{speed:.3f}  "
                          f"({accept:.3f}, {per_row:.2f})", flush=True)
                    if speed > best.get((name, c), (0.0, 0, 0.0))[0]:
                        best[(name, c)] = (speed, k, floor)
        source.close()
    for (name, c), (speed, k, floor) in sorted(best.items()):
        print(f"best {name} c={c}: k={k}, floor={floor} (x{speed:.3f})")


if __name__ == "__main__":
    main()
