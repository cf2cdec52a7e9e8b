"""Each experiment of ``research/experiments/`` run end to end as a researcher reruns it (``python -m
research.experiments.NAME ...``), on tiny inputs: the session's small ShareGPT datastore, a few saved references, a
slice of the ShareGPT sample. Each test checks the exit code and the figures printed or written; the findings
themselves are in docs/drafter-quality.md. The second tier (tests/conftest.py)."""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from pathlib import Path

import pytest

from research.experiments.ranking_headroom import CUTS
from support import printed, run_script


@pytest.mark.vllm
def test_cut_simulation(database_url, chat_datastore, references):
    cuts = ("goodput", "oracle", "0.3")
    out = run_script("research.experiments.cut_simulation", "--concurrency", "2", "--k", "4", "--datastore",
                     chat_datastore, "--references", references, "--cuts", *cuts, url=database_url)
    rows = printed(out, r"(spec_bench|humaneval) +(\S+) +([\d.]+) +(\S+) +([\d.]+) +([\d.]+) +([\d.]+)%$")
    assert [(m[1], m[2]) for m in rows] == [(s, c) for s in ("spec_bench", "humaneval") for c in cuts]
    assert all(float(m[3]) > 0 and float(m[5]) >= 1 for m in rows)
    assert all(float(m[7]) == 100.0 for m in rows if m[2] == "oracle" and float(m[6]) > 0)  # only accepted tokens


def test_ranking_headroom(database_url, chat_datastore, references, tmp_path):
    # a fleet stream as `benchmarks.fleet prepare` leaves it: Spec-Bench's references, the second a repeat of the first
    saved = [json.loads(line) for line in (references / "spec_bench.jsonl").read_text().splitlines()[1:]]
    stream = [{"id": f"r{i}", "kind": kind, "text": "", "prompt_ids": r["prompt_ids"], "output_ids": r["output_ids"]}
              for i, (r, kind) in enumerate(zip([saved[0], *saved], ("new", "repeat", "new", "new")))]
    (tmp_path / "today.json").write_text(json.dumps({"meta": {}, "stream": stream}))
    out = run_script("research.experiments.ranking_headroom", "--datastore", chat_datastore, "--code-datastore",
                     chat_datastore, "--references", references, "--fleet", tmp_path, "--fleet-datastore",
                     chat_datastore, "--out", tmp_path / "headroom.json", url=database_url)
    report = json.loads((tmp_path / "headroom.json").read_text())
    assert list(report["streams"]) == ["spec_bench", "humaneval", "fleet"]
    assert report["streams"]["fleet"]["report_requests"] == 2  # the odd ones: the repeat and the last
    for name, got in report["streams"].items():
        rows = {r: row["accept_length"]["all"] for r, row in got["rows"].items()}
        assert list(rows) == ["union's best", "shipped", "refit", "refit + history", "boosted", "boosted + tokens"]
        assert all(a >= 1 for a in rows.values()) and rows["union's best"] == max(rows.values()), name
        assert len(printed(out, rf"{name} \(datastore {re.escape(chat_datastore)}; fitted on \d+ requests")) == 1
        cut = got["cut"]
        assert list(cut) == [*rows, "perfect cut"], name
        # the shipped chain trimmed to what is accepted: every draft token is accepted, so a step commits its draft
        # tokens and the bonus, except a request's last, whose bonus would fall past the output's end
        perfect = cut["perfect cut"]
        past_end = perfect["steps"] * (perfect["drafted_per_step"] - perfect["accept_length"] + 1)
        assert -1e-9 < past_end < got["report_requests"] + 1e-9, name
        assert all(row["tok_s"] > 0 and 0 < row["cut"] <= 1 for row in cut.values()), name
    first = printed(out, r"first token: the union offers ([\d.]+); the shipped chain's is the target's at ([\d.]+)% "
                         r"of positions, one of them at ([\d.]+)%")
    assert len(first) == 3 and all(float(m[1]) >= 1 and float(m[2]) <= float(m[3]) for m in first)
    repeat = report["streams"]["fleet"]["rows"]["union's best"]["accept_length"]["repeat"]
    assert repeat > report["streams"]["fleet"]["rows"]["union's best"]["accept_length"]["new"]  # its answer is held


def test_distill_curve(database_url, sharegpt_sample, references, tokenizer, tmp_path):
    """Two sizes of answers in the distill's format (the sample's own first answers, their tokens counted as the
    distill counts them) beside the sample as the human corpus: every datastore built, replayed and dropped."""
    from evaluation.distill import append_chunk, opening, read_conversations

    lines = []
    for conv in read_conversations([Path(sharegpt_sample)], Counter()):
        first = opening(conv)
        if first is not None and len(conv) > len(first) and conv[len(first)]["role"] == "assistant":
            answer = conv[len(first)]
            lines.append(json.dumps({"messages": [*first, answer], "distilled": {
                "output_tokens": len(tokenizer.encode(answer["content"], add_special_tokens=False))}}))
    answers = tmp_path / "answers.jsonl.zst"
    append_chunk(answers, lines[:12])
    out = run_script("research.experiments.distill_curve", "--answers", answers, "--human", sharegpt_sample,
                     "--sizes", "300", "900", "--top-t", "2K", "--chain", "4", "--tree", "8", "--references",
                     references, "--name", f"test-dcurve-{uuid.uuid4().hex[:8]}", "--out", tmp_path / "curve.json",
                     url=database_url)
    rows = json.loads((tmp_path / "curve.json").read_text())["rows"]
    assert [r["corpus"] for r in rows] == ["human"] + ["distilled", "human+distilled", "human, equal tokens"] * 2
    assert all(0 < r["answer_tokens"] <= size for r, size in zip(rows[1::3], (300, 900)))
    assert all(r["corpus_tokens"] > 0 and r["bytes"] > 0 and r["merged chain 4"] >= 1 and r["datastore tree 8"] >= 1
               for r in rows)
    assert rows[2]["corpus_tokens"] > rows[0]["corpus_tokens"]  # the human corpus and the answers
    assert len(printed(out, r"(human|distilled)")) >= 7


def test_model_state_headroom(database_url, chat_datastore, references, tmp_path):
    """The shipped head and the true next state rank the report halves' unions: the true state's argmax among the
    first tokens is the target's wherever the union holds it, the true states at depth 2 move the first token's hit
    rate little (they reach it only through the chain's path scores), and no ranker beats the union's best chain.
    Under a cut, each ranker's cut is one of those tried, and the perfect cut keeps exactly the shipped chain's
    accepted tokens."""
    out = run_script("research.experiments.model_state_headroom", "--head", "drafting/data/head.npz", "--datastore",
                     chat_datastore, "--code-datastore", chat_datastore, "--references", references, "--out",
                     tmp_path / "state.json", url=database_url)
    report = json.loads((tmp_path / "state.json").read_text())
    assert list(report["streams"]) == ["spec_bench", "humaneval"]
    for name, got in report["streams"].items():
        best = got["union's best"]["accept_length"]
        rankers = ("shipped", "head", "head, depth 2", "true state", "true state, depth 2")
        assert all(1 <= got[r]["accept_length"] <= best + 1e-9 for r in rankers), name
        assert got["true state"]["argmax_right"] == pytest.approx(got["union"]["any_right"], abs=0.02), name
        assert got["true state, depth 2"]["first_right"] == pytest.approx(got["true state"]["first_right"], abs=0.02)
        assert all(got[r]["cut"]["cut"] in CUTS and got[r]["cut"]["tok_s"] > 0 for r in rankers), name
        perfect = got["perfect cut"]["cut"]
        assert perfect["accept_length"] == pytest.approx(got["shipped"]["accept_length"], rel=0.01), name
    assert len(printed(out, r"^(spec_bench|humaneval): the union offers [\d.]+ first tokens")) == 2


def test_head_context(database_url, references, tmp_path):
    out = run_script("research.experiments.head_context", "--references", references, "--minutes", "0.1", "--windows",
                     "1", "2", "--tokens", "600", "--segment", "16", "--work", tmp_path / "work", "--out",
                     tmp_path / "hc.json", url=database_url)
    assert printed(out, r"features: [\d,]+ positions")
    heads = json.loads((tmp_path / "hc.json").read_text())["heads"]
    assert list(heads) == ["mlp (shipped form)", "context W=1", "context W=2"]
    sets = ("spec_bench", "humaneval")
    assert all(0 <= row[s] <= 1 and row["steps"] > 0 for row in heads.values() for s in sets)
    assert all(0 <= heads[h][f"{s} decode only"] <= 1 for h in ("context W=1", "context W=2") for s in sets)
