"""``python -m evaluation train-head``: train the draft head (:class:`drafting.DraftHead`) for the default target on
its own features, stack its model features on the calibration over the fit half, report on the report half, and
write it.

1. Features (:mod:`evaluation.features`, cached under ``CREST_CACHE``): the target run teacher-forced over the fit
   halves' prompts with their greedy answers (its own outputs), over ShareGPT's first conversations (``--tokens``)
   and over the target's own answers to other prompts (``--distilled``: ``python -m evaluation distill``'s files), in
   ``--dtype``.
2. The head, trained for ``--minutes`` (:mod:`evaluation.head_training`).
3. Its calibration: ``--calibration`` (default: the shipped one) stacked with the model features
   (:meth:`drafting.Calibration.with_model_terms`), fitted on the fit halves' node tables read with the head's
   estimates, each set over its datastore, no live layer.
   Steps 3 and 4 read the target in float32, as an engine serving it in float32 does.
4. The report halves: the head's top-1 against the target's greedy token over the vocabulary, and among the
   union's depth-1 candidates where the union offers any.

With ``--weights``, steps 1 and 2 are skipped: the head's weights come from a file, such as one the GPU trainer
wrote (``evaluation/head_gpu.py``, on ``python -m evaluation head-pack``'s pack), and steps 3 and 4 run here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
import zipfile
from functools import partial
from pathlib import Path

import numpy as np

from toolkit.options import existing_path, float_in, int_in

from .references import Reference, half, load_references

__all__ = ["add_parser"]

SETS = ("spec_bench", "humaneval")
TRAINING = {"tokens": 200_000, "distilled": None, "minutes": 10.0, "dtype": "float32", "hidden": 1024, "work": None}
"""The options of training here, with their defaults: ``--weights`` takes none of them."""


def add_parser(sub, parents: list) -> None:
    """The ``train-head`` subcommand."""
    ap = sub.add_parser("train-head", parents=parents, description=" ".join(__doc__.split("\n\n")[0].split()),
                        help="train the draft head on the target's own features; stack it on the calibration.")
    ap.add_argument("--datastore", default="sharegpt", help="Spec-Bench's datastore (default: %(default)s).")
    ap.add_argument("--code-datastore", default="code", help="HumanEval's datastore (default: %(default)s).")
    ap.add_argument("--calibration", type=Path, default=None,
                    help="the calibration the model features are stacked on (default: the shipped one).")
    ap.add_argument("--out", type=Path, default=Path("head.npz"),
                    help="where the head goes (default: %(default)s; CREST_HEAD names the file a proposer reads; "
                         "the shipped one is drafting/data/head.npz).")
    ap.add_argument("--tokens", type=int_in(0), default=TRAINING["tokens"],
                    help="ShareGPT tokens the target is run over beside the fit halves (default: %(default)s; about "
                         "300 a second on two CPU cores in fp32).")
    ap.add_argument("--distilled", type=existing_path, nargs="+", default=TRAINING["distilled"],
                    help="the target's own answers to train on beside the rest: `python -m evaluation distill`'s files "
                         "(or any chat file, read as `ingest build --source chat` reads it), each conversation "
                         "rendered with the chat template, its first 1,024 tokens (default: none). No evaluation "
                         "prompt may be among them: `evaluation distill` screens its prompts against the sets.")
    ap.add_argument("--minutes", type=float_in(0.1), default=TRAINING["minutes"],
                    help="training time (default: %(default)s).")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default=TRAINING["dtype"],
                    help="the target's dtype while it computes the training features (default: %(default)s; bfloat16 "
                         "ran 1.8x faster on an AMD EPYC with bf16 units; the features are kept in float16 either "
                         "way). The calibration and the report read it in float32.")
    ap.add_argument("--hidden", type=int_in(1), default=TRAINING["hidden"],
                    help="the head's MLP width (default: %(default)s).")
    ap.add_argument("--weights", type=Path, default=None,
                    help="a trained head's weights (.npz: up, up_bias, down, down_bias, state_gain, token_gain, as "
                         "evaluation/head_gpu.py writes them; its run.json beside it is kept in the head's record): "
                         "no features are extracted and nothing is trained here (the training options are refused).")
    ap.add_argument("--work", type=Path, default=None,
                    help="the feature sets' folder (default: <CREST_CACHE>/heads/<digest of what they hold>).")
    ap.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """Extract and train (or read ``--weights``), stack, report, write.

    Raises:
        ValueError: for ``--weights`` with a training option, or weights that do not fit the target.
        FileNotFoundError: for ``--weights`` that does not exist.
    """
    given = [f"--{k}" for k, v in TRAINING.items() if getattr(args, k) != v]
    if args.weights is not None and given:
        raise ValueError(f"--weights takes a head trained elsewhere, {' '.join(given)} trains one here; drop one")
    if args.weights is not None and not args.weights.is_file():
        raise FileNotFoundError(f"--weights {args.weights} does not exist; pass the head_<width>.npz "
                                "evaluation/head_gpu.py wrote")
    given_head = _weights(args.weights) if args.weights is not None else None  # read before the target loads
    import torch

    from crest_native import MODEL_FEATURES
    from datastore.connection import resolve_database_url
    from decoder.model import load_target
    from drafting import Calibration, DraftHead
    from drafting.head import row_norms, target_rows

    from .contamination import require_clean
    from .features import target_weights

    t0 = time.perf_counter()
    target = load_target(None, device="cpu")
    tok = target.tokenizer
    refs = {name: load_references(name, args.references, tokenizer=tok) for name in SETS}
    for name, store in zip(SETS, (args.datastore, args.code_datastore)):  # no corpus may hold a prompt fitted on
        require_clean(resolve_database_url(None), store, name, [r.id for r in refs[name]])
    embedding_np, lm_np = target_rows(*target_weights(target))  # [vocab, d] float32, one array where tied
    embedding, lm = torch.from_numpy(embedding_np), torch.from_numpy(lm_np)  # the trainer's views of the same memory
    if given_head is not None:
        arrays, trained = given_head
        _fits(arrays, embedding.shape[1], args.weights)
        known: dict = {}
    else:
        arrays, trained, known = _train(args, target, refs, embedding, lm, t0)
    base = Calibration.load() if args.calibration is None else Calibration.load(args.calibration)
    target_info = {"vocab_size": int(lm.shape[0]), "hidden_size": int(lm.shape[1]), "model": target.spec,
                   "row_norms": row_norms(lm_np)}
    unfitted = Calibration(np.concatenate([base.coef, np.zeros(len(MODEL_FEATURES))]), base.intercept, base.prior,
                           sources=base.sources, token_bias=base.token_bias)  # the model features weigh nothing yet
    states = partial(_states, {}, target, known)
    # read as a step reads a row's state: through the native head, over the target's own embedding
    head = DraftHead(**arrays, calibration=unfitted, target=target_info).native(embedding_np)
    x, y, toks = _tables(args, tok, {name: half(refs[name], "fit") for name in SETS}, unfitted, lm_np, states, head)
    cal = base.with_model_terms(x, y, toks, meta={"model_terms": {"fit_rows": int(len(y)), "sets": list(SETS)}})
    report = {name: _report(args, tok, name, half(refs[name], "report"), cal, lm_np, states, head) for name in SETS}
    meta = {**trained, "report": report, "seconds": round(time.perf_counter() - t0)}
    DraftHead(**arrays, calibration=cal, target=target_info, meta=meta).save(args.out)
    print(json.dumps(report, indent=1))
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**20:.1f} MiB)")


def _weights(path: Path) -> tuple[dict, dict]:
    """A trained head's arrays from ``path`` (float32), and what is known of its training (``run.json`` beside it).

    Raises:
        ValueError: when the file is cut off or corrupt, or lacks an array.
    """
    from drafting.head import WEIGHTS

    try:
        with open(path, "rb") as f, np.load(f, allow_pickle=False) as z:  # numpy leaks a file it opens and fails on
            arrays = {k: np.ascontiguousarray(z[k], dtype=np.float32) for k in WEIGHTS if k in z.files}
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:  # a truncated file is no zip
        raise ValueError(f"--weights {path} is cut off or corrupt ({exc}); copy it again from where "
                         "evaluation/head_gpu.py wrote it") from exc
    missing = [k for k in WEIGHTS if k not in arrays]
    if missing:
        raise ValueError(f"--weights {path} lacks {', '.join(missing)}; pass a file evaluation/head_gpu.py wrote")
    run_json = path.parent / "run.json"
    trained = {"weights": path.name, "trained": json.loads(run_json.read_text()) if run_json.exists() else None}
    return arrays, trained


def _fits(arrays: dict, d: int, path: Path) -> None:
    """Raises ValueError when the head's widths are not the target's ``d``."""
    if arrays["up"].shape[0] != 2 * d or arrays["down"].shape[1] != d:
        raise ValueError(f"--weights {path}: up is {arrays['up'].shape} and down {arrays['down'].shape}, not "
                         f"[{2 * d}, hidden] and [hidden, {d}] for this target; train it for this target")


def _train(args, target, refs: dict, embedding, lm, t0: float) -> tuple[dict, dict, dict]:
    """Features, then the head trained on this CPU: its arrays, what is known of its training, and the fit
    halves' float32 features by reference id (where they were extracted in float32)."""
    from tqdm import tqdm

    from decoder.model import load_target
    from toolkit.tokenizer import cache_dir

    from .features import extract
    from .head_training import Pairs, TrainSettings, train_head

    teacher = target if args.dtype == "float32" else load_target(None, device="cpu", dtype=args.dtype)
    tok = target.tokenizer
    fit = [r for name in SETS for r in half(refs[name], "fit")]
    about = {"target": target.spec, "tokens": args.tokens, "fit": [r.id for r in fit], "dtype": args.dtype}
    work = args.work or Path(cache_dir()) / "heads" / hashlib.sha256(json.dumps(about).encode()).hexdigest()[:16]
    parts = {"fit": [_sequence(r) for r in fit], "sharegpt": _sharegpt(tok, args.tokens)}
    abouts = {part: {**about, "part": part} for part in parts}
    folders = {part: work / part for part in parts}
    if args.distilled:  # a folder of its own, named by the files: the other parts' features are kept across choices
        files = [[str(p.resolve()), p.stat().st_size] for p in args.distilled]
        parts["distilled"] = _distilled(tok, args.distilled)
        abouts["distilled"] = {**about, "part": "distilled", "files": files}
        folders["distilled"] = work / f"distilled-{hashlib.sha256(json.dumps(files).encode()).hexdigest()[:16]}"
    with tqdm(total=sum(len(x) for seqs in parts.values() for x in seqs), desc="features", unit="token",
              dynamic_ncols=True) as bar:
        sets = {part: extract(teacher, seqs, folders[part], about=abouts[part], progress=bar.update)
                for part, seqs in parts.items()}
    print(f"features: {sum(len(fs.tokens) for fs in sets.values()):,} positions in {time.perf_counter() - t0:.0f} s")
    own = sets["fit"]
    pairs = Pairs.of(list(sets.values()))
    module, steps = train_head(pairs, lm, embedding, TrainSettings(minutes=args.minutes, hidden=args.hidden),
                               progress=lambda step, spent, loss: print(f"  step {step} ({spent:.0%}): {loss:.3f}"))
    known = {r.id: own.features[own.span(i)] for i, r in enumerate(fit)} if teacher is target else {}
    trained = {"positions": len(pairs), "steps": steps, "minutes": args.minutes, "sharegpt_tokens": args.tokens,
               "distilled": [str(p) for p in args.distilled or []],
               "distilled_tokens": len(sets["distilled"].tokens) if "distilled" in sets else 0,
               "dtype": args.dtype, "fit_prompts": len(fit)}
    return module.arrays(), trained, known


def _sequence(r: Reference) -> np.ndarray:
    return np.asarray(list(r.prompt) + list(r.output), dtype=np.int32)


def _sharegpt(tok, tokens: int) -> list[np.ndarray]:
    """The first 512 tokens of ShareGPT's conversations, ``tokens`` in all (the corpus the default datastore holds)."""
    from ingest.sources import iter_documents

    from .features import first_tokens

    if tokens == 0:
        return []
    _, batches = iter_documents("sharegpt", None, tokenizer=tok)
    return first_tokens((text for b in batches for text in b.column(0).to_pylist()), tok, seq_len=512,
                        max_tokens=tokens)


def _distilled(tok, paths: list[Path]) -> list[np.ndarray]:
    """The target's own answers: each conversation of ``paths`` rendered with the chat template, as ``ingest build
    --source chat`` reads it, its first 1,024 tokens.

    Raises:
        ValueError: when one holds an evaluation item (the screen of :func:`ingest.contamination.screen_documents`).
    """
    from ingest.contamination import screen_documents, screen_items
    from ingest.sources import iter_documents

    from .features import first_tokens

    _, batches = iter_documents("chat", tuple(paths), tokenizer=tok)
    out = first_tokens((text for b in batches for text in b.column(0).to_pylist()), tok, seq_len=1024,
                       max_tokens=1 << 62)
    flagged = [f for f in screen_documents(out, screen_items(tok)) if f is not None]
    if flagged:
        raise ValueError(f"--distilled holds {len(flagged)} conversations with an evaluation item ({flagged[0]} the "
                         "first): the head would be reported on what it trained on; leave them out (`python -m "
                         "evaluation distill` screens its prompts)")
    return out


def _states(cache: dict, target, known: dict, r: Reference, pos: int) -> np.ndarray:
    """The target's state that gave output position ``pos - 1`` of ``r`` (its bonus token ``r.output[pos - 1]``), as the
    engine hands it to the proposer: ``[d]`` float32 (``known``: extracted features by reference id; the others are
    computed; the last reference's are cached)."""
    if r.id not in cache:
        from .features import target_features

        cache.clear()
        cache[r.id] = np.ascontiguousarray(known[r.id], dtype=np.float32) if r.id in known else \
            target_features(target, _sequence(r).tolist()).numpy()
    return cache[r.id][len(r.prompt) + pos - 2]


def _source(store: str, tok):
    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource

    return DatastoreSource(partial(SharedDatastore.open, store, tokenizer=tok), retry_s=0.5)


def _tables(args, tok, refs: dict, cal, lm, states, head):
    """``(features, accepted, tokens)`` of the nodes whose parent was accepted, over every set's ``refs``, each node
    table read with the head's estimate (``cal``: a with-model calibration; the scores are not read)."""
    from .calibrate import collect

    parts = []
    for name, store in zip(SETS, (args.datastore, args.code_datastore)):
        source = _source(store, tok)
        parts.append(collect(refs[name], source, calibration=cal, outputs_bytes=64 << 20, vocab_size=len(tok),
                             desc=f"fit {name}", model=(lm, states, head))[:4])
        source.close()
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[3] for p in parts]))


def _report(args, tok, name: str, held: list[Reference], cal, lm, states, head) -> dict:
    """The report half: top-1 among the union's depth-1 candidates (the positions where it offers any), and over the
    vocabulary, against the target's greedy token."""
    from .calibrate import collect

    source = _source(args.datastore if name == "spec_bench" else args.code_datastore, tok)
    x, y = collect(held, source, calibration=cal, outputs_bytes=64 << 20, vocab_size=len(tok), desc=f"report {name}",
                   model=(lm, states, head))[:2]
    source.close()
    top = x[:, -1] == 1  # the head's argmax among a table's depth-1 candidates
    right = total = 0
    for r in held:
        estimates = head.estimates(np.stack([states(r, pos) for pos in range(1, len(r.output))]),
                                   np.asarray(r.output[:-1], dtype=np.uint32))
        right += int((np.argmax(estimates @ lm.T, axis=1) == np.asarray(r.output[1:])).sum())
        total += len(estimates)
    return {"prompts": len(held), "top1_among_candidates": float(y[top].mean()), "tables": int(top.sum()),
            "top1_vocabulary": right / max(total, 1), "positions": total}
