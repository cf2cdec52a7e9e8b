"""``python -m evaluation choose-k``: choose the vLLM proposer's ``k`` (``num_speculative_tokens``) and its probability
floor (``CREST_MIN_SCORE``) on the fit half, by replay and the engine's own cost model.

For each ``k`` and floor, every fit-half prompt of both sets is replayed with the merged drafter's chains
(:func:`evaluation.simulate.replay`, exact for greedy decoding), cut where the proposer cuts them: below
``max(floor, break-even)``, the break-even score of the batch size under a step cost ``T(N) = a + b N`` for ``N``
verified tokens. With the replayed accept length ``L`` (tokens per step and row) and drafted tokens ``d`` per row and
step, a batch of ``B`` rows makes ``B L`` tokens in ``a + b B (1 + d)`` seconds; printed: that throughput relative to no
speculation (``B / (a + b B)``) for each concurrency, and the best ``(k, floor)`` per concurrency. ``a`` and ``b``
default to what the proposer fitted inside vLLM on a 2-core EPYC (``--step-cost``; ``python -m
benchmarks.vllm_serving --accounting`` prints them for yours).
"""

from __future__ import annotations

import argparse
import functools

from toolkit.options import float_in, int_in

from .references import half, load_references

__all__ = ["add_parser"]


def add_parser(sub, parents: list) -> None:
    """The ``choose-k`` subcommand."""
    ap = sub.add_parser("choose-k", parents=parents, description=" ".join(__doc__.split("\n\n")[0].split()),
                        help="choose k and CREST_MIN_SCORE on the fit half, by replay.")
    ap.add_argument("--k", nargs="+", type=int_in(1), default=[4, 8, 12, 16],
                    help="num_speculative_tokens values tried (default: 4 8 12 16).")
    ap.add_argument("--floors", nargs="+", type=float_in(0, 1), default=[0.02, 0.05, 0.1, 0.2],
                    help="CREST_MIN_SCORE values tried, probabilities (default: 0.02 0.05 0.1 0.2).")
    ap.add_argument("--concurrency", nargs="+", type=int_in(1), default=[1, 8, 32],
                    help="rows per step whose break-even cut is modelled (default: 1 8 32).")
    ap.add_argument("--step-cost", nargs=2, type=float_in(0), default=[0.042, 0.0027], metavar=("A", "B"),
                    help="seconds per step and per verified token, the proposer's fit in vLLM-CPU "
                         "(default: 0.042 0.0027).")
    ap.add_argument("--datastore", default="sharegpt", help="Spec-Bench's datastore (default: %(default)s).")
    ap.add_argument("--code-datastore", default="code", help="HumanEval's datastore (default: %(default)s).")
    ap.set_defaults(run=run)


def _replayed(source, refs, k: int, cut: float, vocab_size: int) -> tuple[float, float]:
    """(accept length, drafted tokens per step) of chains of ``k`` cut below ``cut``, over ``refs``."""
    from tqdm import tqdm

    from drafting import DraftingService

    from .simulate import replay

    service = DraftingService(source, vocab_size=vocab_size, min_score=cut)
    tokens = steps = drafted = 0
    for r in tqdm(refs, desc=f"k={k} cut={cut:g}", unit="reference", leave=False):
        res = replay(service, r.prompt, r.output, k, chain=True)
        tokens += len(res.output_ids) - 1
        steps += len(res.steps)
        drafted += sum(s.drafted for s in res.steps)
    return tokens / steps, drafted / steps


def run(args: argparse.Namespace) -> None:
    """Replay every (k, cut) the concurrencies need; print each one's throughput and the best per concurrency."""
    from datastore.connection import resolve_database_url
    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource
    from toolkit import load_tokenizer

    from .contamination import require_clean

    a, b = args.step_cost
    tok = load_tokenizer()
    sets = {"spec_bench": args.datastore, "humaneval": args.code_datastore}
    refs = {name: half(load_references(name, args.references, tokenizer=tok), "fit") for name in sets}
    for name, datastore in sets.items():
        require_clean(resolve_database_url(None), datastore, name, [r.id for r in refs[name]])
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
                        replayed[(k, cut)] = _replayed(source, refs[name], k, cut, len(tok))
                    accept, per_row = replayed[(k, cut)]
                    speed = (c * accept / (a + b * c * (1 + per_row))) / (c / (a + b * c))
                    print(f"{name:<11} c={c:<3} k={k:<3} floor={floor:<5} cut={cut:.3f}  x{speed:.3f}  "
                          f"({accept:.3f}, {per_row:.2f})", flush=True)
                    if speed > best.get((name, c), (0.0, 0, 0.0))[0]:
                        best[(name, c)] = (speed, k, floor)
        source.close()
    for (name, c), (speed, k, floor) in sorted(best.items()):
        print(f"best {name} c={c}: k={k}, floor={floor} (x{speed:.3f})")
