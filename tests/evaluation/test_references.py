"""Saved references record what they were made from (:mod:`evaluation.references`), and a replay of one set's
references reading other prompts fails with an error that names the field and the command that regenerates them."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace

import pytest

from evaluation.prompts import PACKAGED, load_prompts
from evaluation.references import ReferenceMismatch, expected, read_references, write_references


def _write(path, name: str, tokenizer, data_dir=None):
    prompts = load_prompts(name, tokenizer, data_dir=data_dir)
    want = expected(name, tokenizer, data_dir=data_dir)
    write_references(path, replace(want, engine="test"), [(p.id, list(p.token_ids), [1, 2, 3]) for p in prompts])
    return prompts, want


def test_references_round_trip_with_their_provenance(tmp_path, tokenizer):
    prompts, want = _write(tmp_path / "humaneval.jsonl", "humaneval", tokenizer)
    refs = read_references(tmp_path / "humaneval.jsonl", want)
    assert [r.id for r in refs] == [p.id for p in prompts] and refs[0].output == [1, 2, 3]
    assert refs[0].prompt == list(prompts[0].token_ids) and {r.category for r in refs} == {"humaneval"}


def test_another_sets_references_are_refused(tmp_path, tokenizer):
    """Spec-Bench's references saved where HumanEval's belong (same folder, wrong file): refused, not replayed."""
    _write(tmp_path / "humaneval.jsonl", "spec_bench", tokenizer)
    with pytest.raises(ReferenceMismatch, match=re.escape("python -m evaluation references --references")) as exc:
        read_references(tmp_path / "humaneval.jsonl", expected("humaneval", tokenizer))
    assert "other set than this replay reads" in str(exc.value)


def test_references_of_other_prompts_are_refused(tmp_path, tokenizer):
    """References made from the packaged HumanEval, replayed against a folder whose HumanEval differs by one prompt
    (``CREST_EVAL_DATA`` switched with the references left in place): refused, naming the prompts."""
    _write(tmp_path / "humaneval.jsonl", "humaneval", tokenizer)
    other = tmp_path / "eval"
    shutil.copytree(PACKAGED, other)
    problems = other / "humaneval" / "problems.jsonl"
    rows = [json.loads(line) for line in problems.read_text().splitlines() if line.strip()]
    rows[5]["prompt"] += "    # one more line\n"
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ReferenceMismatch, match="made from other prompts than this replay reads"):
        read_references(tmp_path / "humaneval.jsonl", expected("humaneval", tokenizer, data_dir=other))
    with pytest.raises(ReferenceMismatch, match="max_new_tokens"):
        read_references(tmp_path / "humaneval.jsonl", expected("humaneval", tokenizer, max_new_tokens=64))
    (tmp_path / "old.jsonl").write_text(json.dumps({"id": "x", "prompt_ids": [1], "output_ids": [2]}) + "\n")
    with pytest.raises(ReferenceMismatch, match="records no provenance"):
        read_references(tmp_path / "old.jsonl", expected("humaneval", tokenizer))
    with pytest.raises(FileNotFoundError, match="python -m evaluation references --references"):
        read_references(tmp_path / "missing.jsonl", expected("humaneval", tokenizer))
    saved = (tmp_path / "humaneval.jsonl").read_text()
    (tmp_path / "cut.jsonl").write_text(saved[:len(saved) // 2])  # a write cut short mid-line
    with pytest.raises(ReferenceMismatch, match=r"cut.jsonl holds a line that is not a reference.*-m evaluation"):
        read_references(tmp_path / "cut.jsonl", expected("humaneval", tokenizer))
