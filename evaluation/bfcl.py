"""``python -m evaluation fetch-bfcl``: the BFCL function-calling sets' data, from the ``bfcl-eval`` wheel on PyPI
(Apache 2.0, version :data:`toolkit.eval_sets.BFCL_VERSION`): the wheel is downloaded without its dependencies (pip
from this interpreter; nothing is installed) and its ``bfcl_eval/data`` folder extracted to
:func:`toolkit.eval_sets.bfcl_dir`, with the licence, once. The sets it makes (:mod:`toolkit.eval_sets`) are read
from there; the data is not shipped with this package.

Also here: the BFCL references' turns (:func:`turn_prompts`): a multi-turn entry's later turns carry the model's own
earlier answers, so ``python -m evaluation references`` generates them turn by turn.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from toolkit.eval_sets import BFCL_VERSION, bfcl_dir, read_rows

__all__ = ["add_parser", "fetch", "turn_prompts"]


def fetch(into: Path | None = None) -> Path:
    """Download the bfcl-eval wheel (no dependencies) and extract its data into ``into`` (default
    :func:`toolkit.eval_sets.bfcl_dir`); returns the folder. Nothing is done when the folder holds the data already.

    Raises:
        RuntimeError: when pip cannot download the wheel (its last line of error).
    """
    into = into or bfcl_dir()
    if (into / "BFCL_v4_simple_python.json").exists():
        return into
    with tempfile.TemporaryDirectory() as tmp:
        got = subprocess.run([sys.executable, "-m", "pip", "download", f"bfcl-eval=={BFCL_VERSION}", "--no-deps",
                              "--quiet", "-d", tmp], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("bfcl_eval-*.whl"))
        if got.returncode != 0 or not wheels:
            said = got.stderr.strip().splitlines()
            raise RuntimeError(f"pip could not download bfcl-eval {BFCL_VERSION}: {said[-1] if said else 'no wheel'}")
        partial = into.with_name(into.name + ".partial")
        with zipfile.ZipFile(wheels[0]) as wheel:
            for member in wheel.namelist():
                if member.startswith("bfcl_eval/data/") and not member.endswith("/"):
                    target = partial / member[len("bfcl_eval/data/"):]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(wheel.read(member))
        (partial / "SOURCE").write_text(f"bfcl-eval {BFCL_VERSION} (PyPI), bfcl_eval/data; licence: Apache 2.0\n")
        partial.rename(into)
    return into


def turn_prompts(tokenizer, name: str, answers: dict[str, list[str]], turn: int) -> list:
    """The prompts of turn ``turn`` (>= 1) of set ``name``'s multi-turn rows that have one and whose earlier turns
    were all answered (``answers``: each row's answers so far, by row id)."""
    from .prompts import bfcl_turn

    return [bfcl_turn(tokenizer, row, answers[row["id"]], turn) for row in read_rows(name)
            if len(row["turns"]) > turn and len(answers.get(row["id"], ())) == turn]


def add_parser(sub, parents: list) -> None:
    """The ``fetch-bfcl`` subcommand."""
    ap = sub.add_parser("fetch-bfcl", description=" ".join(__doc__.split("\n\n")[0].split()),
                        help="download the BFCL function-calling sets' data (the bfcl-eval wheel's, no dependencies).")
    ap.set_defaults(run=_run)


def _run(args: argparse.Namespace, say: Callable[[str], None] = print) -> None:
    say(f"BFCL data in {fetch()}")
