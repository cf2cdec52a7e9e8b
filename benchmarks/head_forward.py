"""The draft head's forward per step: the native core's (``csrc/head.hpp``, :meth:`drafting.DraftHead.native`, what the
step runs) against the trainer's torch module (:class:`evaluation.head_module.HeadModule`, what the proposer ran
before), at ``--rows`` rows, for the shipped head (or ``--head``) over the default target's embedding. Each call is
timed alone (wall, ms; p50 and p99 of ``--calls``); ``--flush-mb`` reads that many MiB between two calls, as an engine's
forward pass streams the model's weights through the caches, so the head runs on cold caches as it does in a step.

    python -m benchmarks.head_forward [--rows 1 8 32] [--calls 2000] [--flush-mb 540]
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from toolkit.options import existing_path, int_in

from ._harness import finish, parser


def _timed(call, calls: int, flush: np.ndarray | None) -> np.ndarray:
    out = np.empty(calls)
    for i in range(calls):
        if flush is not None:
            flush.sum()
        start = time.perf_counter()
        call()
        out[i] = time.perf_counter() - start
    return out * 1e3


def measure(args) -> dict:
    """Time both forwards at each of ``args.rows``."""
    import torch

    import crest_native
    from decoder.model import load_target
    from drafting import DraftHead
    from drafting.head import DEFAULT_HEAD, target_rows
    from evaluation.features import target_weights
    from evaluation.head_module import HeadModule

    head = DraftHead.load(Path(args.head) if args.head else DEFAULT_HEAD)
    embedding = target_rows(*target_weights(load_target(None, device="cpu")))[0]
    native, module = head.native(embedding), HeadModule.of(head, torch.from_numpy(embedding))
    flush = np.ones(args.flush_mb * 2**18, np.float32) if args.flush_mb else None
    rng = np.random.default_rng(0)
    doc: dict = {"width": head.width, "hidden": int(head.up.shape[1]), "flush_mb": args.flush_mb,
                 "kernel": "AVX2+FMA" if crest_native.Head.avx2 else "portable",
                 "torch_threads": torch.get_num_threads(), "rows": []}
    for rows in args.rows:
        f = (rng.normal(size=(rows, head.width)) * 3).astype(np.float32)
        tokens = rng.integers(0, len(embedding), rows).astype(np.uint32)
        ft, tt = torch.from_numpy(f), torch.from_numpy(tokens.astype(np.int64))

        def run_native(f=f, tokens=tokens) -> None:
            native.estimates(f, tokens)

        def run_torch(ft=ft, tt=tt) -> None:
            with torch.inference_mode():
                module(ft, tt).numpy()

        times = {"native": _timed(run_native, args.calls, flush), "torch": _timed(run_torch, args.calls, flush)}
        figures = {name: {"p50_ms": float(np.median(t)), "p99_ms": float(np.percentile(t, 99))}
                   for name, t in times.items()}
        doc["rows"].append({"rows": rows, **figures})
    return doc


def report(doc: dict) -> None:
    print(f"head {doc['width']} -> {doc['hidden']} -> {doc['width']}; native kernel: {doc['kernel']}; torch threads "
          f"{doc['torch_threads']}; flush {doc['flush_mb']} MiB")
    print(f"{'rows':>5s} {'native p50':>11s} {'p99':>8s} {'/row':>8s} {'torch p50':>10s} {'p99':>8s} {'/row':>8s}")
    for r in doc["rows"]:
        a, b, n = r["native"], r["torch"], r["rows"]
        print(f"{n:5d} {a['p50_ms']:11.3f} {a['p99_ms']:8.3f} {a['p50_ms'] / n:8.4f} "
              f"{b['p50_ms']:10.3f} {b['p99_ms']:8.3f} {b['p50_ms'] / n:8.4f}")


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__, out="head_forward.json", refs=False)
    ap.add_argument("--head", type=existing_path, default=None, help="a head file (default: the shipped one).")
    ap.add_argument("--rows", type=int_in(1), nargs="+", default=[1, 8, 32], help="rows a step (default: 1 8 32).")
    ap.add_argument("--calls", type=int_in(10), default=2000, help="calls timed per figure (default: 2000).")
    ap.add_argument("--flush-mb", type=int_in(0), default=0, help="MiB read between two calls (default: 0).")
    args = ap.parse_args(argv)
    finish(args, lambda: measure(args), report, "rows")


if __name__ == "__main__":
    main()
