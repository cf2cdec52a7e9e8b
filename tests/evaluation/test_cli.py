"""``python -m evaluation`` run as a user runs it, on tiny inputs (the session's small ShareGPT datastore, a few saved
references): ``calibrate`` fits and reports, ``choose-k`` prints its table and each set's best, ``references``
generates plain-greedy outputs with vLLM equal to ours. What they compute is tested beside their modules; here, that
each command runs end to end and prints or writes what it says."""

from __future__ import annotations

import pytest

from support import drop_datastores, printed, run_script


@pytest.mark.slow
def test_calibrate(database_url, chat_datastore, references, tmp_path):
    from drafting import Calibration

    try:
        out = run_script("evaluation", "calibrate", "--datastore", chat_datastore, "--code-datastore", chat_datastore,
                         "--references", references, "--out", tmp_path / "calibration.json", "--plot",
                         tmp_path / "calibration.png", "--live-top-t", "1000", url=database_url)
    finally:
        drop_datastores(database_url, "calibfit-a", "calibfit-b")  # the cross-fitted live layers it leaves
    assert printed(out, r"fitted on 4 prompts, [\d,]+ nodes")
    cal = Calibration.load(tmp_path / "calibration.json")
    report = cal.meta["report"]
    assert set(report) == {"spec_bench", "humaneval"} and all(r["prompts"] == 1 and r["nodes"] > 0
                                                               for r in report.values())
    assert (tmp_path / "calibration.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_train_head(database_url, chat_datastore, references, tmp_path):
    """The head trains on the fit halves, a few ShareGPT tokens and two distilled answers (their features in
    bfloat16), its model terms stack on the calibration, its report half is reported, and the file it writes loads and
    fits the target."""
    import json

    from decoder.model import load_target
    from drafting import DraftHead
    from evaluation.features import target_weights

    answers = tmp_path / "distilled.jsonl"
    answers.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant",
                                                                                         "content": a}]}) + "\n"
                               for q, a in (("Name three primary colours.", "Red, yellow and blue are the three."),
                                            ("What is 2 + 2?", "2 + 2 equals 4, a small sum."))))
    out = run_script("evaluation", "train-head", "--datastore", chat_datastore, "--code-datastore", chat_datastore,
                     "--references", references, "--out", tmp_path / "head.npz", "--tokens", "3000", "--minutes",
                     "0.1", "--hidden", "32", "--dtype", "bfloat16", "--work", tmp_path / "work", "--distilled",
                     answers, url=database_url)
    assert printed(out, r"features: [\d,]+ positions") and printed(out, r"wrote .*head.npz")
    assert len(list((tmp_path / "work").glob("distilled-*/features.npy"))) == 1
    head = DraftHead.load(tmp_path / "head.npz")
    report = head.meta["report"]
    assert set(report) == {"spec_bench", "humaneval"}
    assert all(0 <= r["top1_vocabulary"] <= 1 and r["positions"] > 0 for r in report.values())
    assert head.calibration.with_model and head.meta["steps"] > 0 and head.meta["dtype"] == "bfloat16"
    assert head.meta["distilled"] == [str(answers)] and head.meta["distilled_tokens"] > 40
    assert head.fits(target_weights(load_target(None, device="cpu"))[1].float().numpy())


def test_choose_k(database_url, chat_datastore, references):
    out = run_script("evaluation", "choose-k", "--k", "2", "4", "--floors", "0.1", "--concurrency", "1", "8",
                     "--datastore", chat_datastore, "--code-datastore", chat_datastore, "--references", references,
                     url=database_url)
    rows = printed(out, r"(spec_bench|humaneval) +c=(\d+) +k=(\d+) .* x([\d.]+) +\(([\d.]+), ([\d.]+)\)")
    assert len(rows) == 2 * 2 * 2 and all(float(m[5]) >= 1 and float(m[4]) > 0 for m in rows)
    best = printed(out, r"best (spec_bench|humaneval) c=(\d+): k=(\d+), floor=0.1 \(x[\d.]+\)")
    assert {(m[1], m[2]) for m in best} == {(s, c) for s in ("spec_bench", "humaneval") for c in ("1", "8")}


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.xdist_group("engine")  # one engine at a time: tests/conftest.py
def test_references(database_url, target, tokenizer, tmp_path):
    """One engine: the first prompt of each set and its second turn, 8 tokens each, equal to our greedy output; a
    second run keeps what is there (no engine started)."""
    from decoder import greedy_generate
    from evaluation.prompts import load_prompts
    from evaluation.references import expected, read_references

    args = ("references", "--references", tmp_path, "--limit", "1", "--max-new-tokens", "8")
    out = run_script("evaluation", *args, "--max-num-seqs", "2", "--enforce-eager", url=database_url, timeout=900)
    assert len(printed(out, r"(spec_bench|humaneval|spec_bench_turn2): 1 prompts, \d+ tokens in \d+ s")) == 3
    for name in ("spec_bench", "humaneval", "spec_bench_turn2"):
        (ref,) = read_references(tmp_path / f"{name}.jsonl", expected(name, tokenizer, max_new_tokens=8))
        assert 1 <= len(ref.output) <= 8
        if name != "spec_bench_turn2":
            prompt = load_prompts(name, tokenizer)[0]
            assert ref.id == prompt.id and ref.output == greedy_generate(target, prompt.token_ids,
                                                                         max_new_tokens=8).output_ids
    again = run_script("evaluation", *args, url=database_url)
    assert not printed(again, r".*prompts, \d+ tokens in")


def test_every_subcommand_answers_help_under_its_own_name(capsys):
    """Every command ``python -m evaluation`` names exists: its subcommands parse their own ``--help``."""
    from evaluation.cli import build_parser

    for command in ("references", "calibrate", "choose-k", "train-head", "head-pack"):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args([command, "--help"])
        assert exit_.value.code == 0 and f"python -m evaluation {command}" in capsys.readouterr().out


def test_train_head_refuses_distilled_answers_that_hold_an_evaluation_item(tokenizer, tmp_path):
    """A conversation of ``--distilled`` holding a Spec-Bench question is refused before anything is extracted, naming
    the item; the clean one beside it alone passes."""
    import json

    from evaluation.train_head import _distilled
    from ingest.contamination import screened_texts

    item, question = screened_texts()["spec_bench"][3]
    clean = {"messages": [{"role": "user", "content": "Name three primary colours."},
                          {"role": "assistant", "content": "Red, yellow and blue are the three."}]}
    (tmp_path / "clean.jsonl").write_text(json.dumps(clean) + "\n")
    assert len(_distilled(tokenizer, [tmp_path / "clean.jsonl"])) == 1
    leaked = {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": "An answer."}]}
    (tmp_path / "leaked.jsonl").write_text(json.dumps(leaked) + "\n")
    with pytest.raises(ValueError, match=f"1 conversations with an evaluation item \\(spec_bench/{item}"):
        _distilled(tokenizer, [tmp_path / "clean.jsonl", tmp_path / "leaked.jsonl"])
