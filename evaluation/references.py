"""Saved greedy references of an evaluation set, and what they were made from.

Replay (:func:`evaluation.simulate.replay`) is exact only against the target's own greedy outputs of the very prompts
replayed. A references file (JSON Lines) therefore starts with its provenance: the set, a content hash of the set's
prompts (ids and token ids), the model, its dtype and ``max_new_tokens`` (and the engine that generated it); then one
row per prompt, ``{"id", "prompt_ids", "output_ids"}``. Every reader states what it replays (:func:`expected`), and
:func:`read_references` refuses a file made from anything else, naming the field and the command that regenerates it.
``python -m evaluation references`` writes them (vLLM fp32, whose greedy output equals ours: :mod:`evaluation.greedy`);
:func:`load_references` reads a set's for replay, and :func:`half` keeps one half of it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.settings import Settings
from toolkit.tokenizer import DEFAULT_MODEL

from .prompts import Prompt, in_half, load_prompts

__all__ = ["REFERENCES", "Provenance", "Reference", "ReferenceMismatch", "expected", "half", "load_references",
           "prompts_digest", "read_references", "write_references"]

REGENERATE = "python -m evaluation references"
"""The command that (re)generates the references of every set."""
REFERENCES = Path("results") / "references"
"""Where the references are saved by default (relative to the working directory)."""
DERIVED = {"spec_bench_turn2": "spec_bench"}
"""Sets whose prompts are derived from another set's (the second turns follow the model's own first answers): their
provenance hashes the source set's prompts."""


class ReferenceMismatch(ValueError):
    """A references file was made from other prompts, another model, dtype or length than the reader replays."""


@dataclass(frozen=True)
class Provenance:
    """What a references file was made from.

    Attributes:
        set: the evaluation set's name. prompts_sha256: :func:`prompts_digest` of its prompts (of the source set's for
        a derived set). model: the model spec. dtype: its dtype's name. max_new_tokens: the output length cap.
        engine: what generated the outputs (recorded; not checked: every engine's greedy output is the model's).
    """

    set: str
    prompts_sha256: str
    model: str
    dtype: str
    max_new_tokens: int
    engine: str = ""


@dataclass(frozen=True)
class Reference:
    """One prompt's plain-greedy output. category: Spec-Bench's, or ``humaneval``."""

    id: str
    category: str
    prompt: list[int]
    output: list[int]


def prompts_digest(prompts: Sequence[Prompt]) -> str:
    """SHA-256 of the prompts' ids and token ids, in order."""
    payload = json.dumps([[p.id, [int(t) for t in p.token_ids]] for p in prompts], separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def expected(name: str, tokenizer, *, data_dir: str | os.PathLike | None = None, max_new_tokens: int = 128,
             model: str = DEFAULT_MODEL, dtype: str = "float32") -> Provenance:
    """The provenance a reader replaying set ``name`` needs: its prompts as :func:`evaluation.prompts.load_prompts`
    reads them now (``data_dir``: default ``CREST_EVAL_DATA`` or the packaged sets), the model, dtype and length.

    Raises:
        ValueError / FileNotFoundError: as :func:`evaluation.prompts.load_prompts`.
    """
    source = DERIVED.get(name, name)
    return Provenance(name, prompts_digest(load_prompts(source, tokenizer, data_dir=data_dir)), model, dtype,
                      max_new_tokens)


def write_references(path: str | os.PathLike, provenance: Provenance, rows: Sequence[tuple[str, list[int], list[int]]]
                     ) -> None:
    """Write ``(id, prompt_ids, output_ids)`` rows under their provenance, atomically (never a half-written set)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        f.write(json.dumps({"provenance": asdict(provenance)}) + "\n")
        for pid, prompt, output in rows:
            f.write(json.dumps({"id": pid, "prompt_ids": [int(t) for t in prompt],
                                "output_ids": [int(t) for t in output]}) + "\n")
    tmp.replace(path)


def _regenerate(path: Path, want: Provenance) -> str:
    data = Settings.from_env().eval_data
    env = f"CREST_EVAL_DATA={data} " if data is not None else ""
    other = "" if want.model == DEFAULT_MODEL else f" (for {want.model}, generate them with that model)"
    return f"regenerate them with `{env}{REGENERATE} --references {path.parent}`{other}"


def read_references(path: str | os.PathLike, want: Provenance) -> list[Reference]:
    """The references in ``path``, checked against what the reader replays.

    Raises:
        FileNotFoundError: when the file is missing (the message gives the command that makes it).
        ReferenceMismatch: when the file records no provenance, or another set, prompts, model, dtype or
            ``max_new_tokens`` than ``want`` (the message names the field and the command that regenerates it); when
            a line is not a reference (a write cut short: the message names the file and the command).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: generate the references first ({REGENERATE} --references "
                                f"{path.parent})")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    try:
        return _parsed(path, lines, want)
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise ReferenceMismatch(f"{path} holds a line that is not a reference ({type(e).__name__}: {e}; cut short?); "
                                f"{_regenerate(path, want)}") from e


def _parsed(path: Path, lines: list[str], want: Provenance) -> list[Reference]:
    """:func:`read_references` of the file's non-blank ``lines``."""
    head = json.loads(lines[0]) if lines else {}
    if "provenance" not in head:
        raise ReferenceMismatch(f"{path} records no provenance (written by an older version); "
                                f"{_regenerate(path, want)}")
    got = Provenance(**head["provenance"])
    for field in ("set", "prompts_sha256", "model", "dtype", "max_new_tokens"):
        if getattr(got, field) != getattr(want, field):
            what = "prompts" if field == "prompts_sha256" else field
            raise ReferenceMismatch(f"{path} was made from other {what} than this replay reads ({field} "
                                    f"{getattr(got, field)!r}, replayed: {getattr(want, field)!r}); "
                                    f"{_regenerate(path, want)}")
    out = []
    for line in lines[1:]:
        r = json.loads(line)
        category = "humaneval" if want.set == "humaneval" else r["id"].split("/")[0].rsplit("-", 1)[0]
        out.append(Reference(r["id"], category, r["prompt_ids"], r["output_ids"]))
    return out


def load_references(name: str, folder: str | os.PathLike = REFERENCES, max_new_tokens: int = 128,
                    tokenizer=None) -> list[Reference]:
    """A set's references in file order, checked against the set's prompts as this install reads them
    (``CREST_EVAL_DATA`` or the packaged sets), the default model in fp32 and ``max_new_tokens``.

    Args:
        name: ``spec_bench``, ``spec_bench_turn2``, ``humaneval``, ``bfcl`` or ``bfcl_heldout``. folder: where they
            were saved.
        tokenizer: the default target's (default: :func:`toolkit.load_tokenizer`).

    Raises:
        FileNotFoundError / ReferenceMismatch: as :func:`read_references` (each message gives the command that makes
            the file).
    """
    if tokenizer is None:
        from toolkit import load_tokenizer

        tokenizer = load_tokenizer()
    return read_references(Path(folder) / f"{name}.jsonl", expected(name, tokenizer, max_new_tokens=max_new_tokens))


def half(refs: Sequence[Reference], which: str) -> list[Reference]:
    """The references of one half (:func:`evaluation.prompts.in_half`: ``fit``, ``report`` or ``all``), file order
    kept; a conversation's turns (ids ``<entry>/t<n>``, a BFCL multi-turn entry's) share their entry's position."""
    seen: dict[str, int] = {}
    entries: dict[str, int] = {}
    out = []
    for r in refs:
        entry = r.id.split("/t")[0]
        if entry not in entries:
            entries[entry] = seen[r.category] = seen.get(r.category, -1) + 1
        if in_half(entries[entry], which):
            out.append(r)
    return out
