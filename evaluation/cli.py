"""``python -m evaluation``: what tunes a drafter for a target on the evaluation sets, each set's fit half.

- ``references``: the target's plain-greedy outputs of every set, with vLLM (:mod:`evaluation.greedy`);
- ``calibrate``: the calibrated node scores, fitted on the fit half, reported on the other
(:mod:`evaluation.calibrate`);
- ``choose-k``: the proposer's ``k`` and probability floor, by replay (:mod:`evaluation.choose_k`);
- ``train-head``: the draft head over the target's own state, and its calibration (:mod:`evaluation.train_head`);
- ``head-pack``: what a GPU machine trains the head from at scale (:mod:`evaluation.head_pack`,
  ``evaluation/head_gpu.py``);
- ``distill``: the target's own answers to a prompt set, a datastore's corpus before any traffic
  (:mod:`evaluation.distill`);
- ``fetch-bfcl``: the BFCL function-calling sets' data, from the bfcl-eval wheel (:mod:`evaluation.bfcl`).

Each reads the saved references (``--references``) and refuses a datastore whose corpus holds a prompt it scores.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import bfcl, calibrate, choose_k, greedy, head_pack, train_head
from .references import REFERENCES

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    references = argparse.ArgumentParser(add_help=False)
    references.add_argument("--references", type=Path, default=REFERENCES, metavar="DIR",
                            help="the saved greedy references (default: %(default)s).")
    p = argparse.ArgumentParser(prog="python -m evaluation", description=__doc__.split("\n\n")[0].split("``: ")[1])
    sub = p.add_subparsers(dest="command", required=True)
    for module in (greedy, calibrate, choose_k, train_head, head_pack, bfcl):
        module.add_parser(sub, [references])
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code (0 ok, 2 bad input, 1 failure, 130 interrupted)."""
    from datastore.errors import BadDatabaseUrl, DatastoreError, DatastoreNotFound
    from toolkit.console import EXIT_OK, run
    from toolkit.extras import MissingExtra

    from .contamination import Contaminated, NotScreened
    from .references import ReferenceMismatch

    args = build_parser().parse_args(argv)

    def command() -> int:
        args.run(args)
        return EXIT_OK

    return run(command, usage=(FileNotFoundError, ReferenceMismatch, Contaminated, NotScreened, DatastoreNotFound,
                               BadDatabaseUrl, MissingExtra, ValueError), failures=(DatastoreError,))
