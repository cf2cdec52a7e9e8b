"""The decoder CLI end to end (bench, replay, --budget auto), and loading the model from a local GGUF."""

from __future__ import annotations

import argparse
import ast
import csv
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from rich.console import Console

from support import NO_SUCH, call, check_refusal
from toolkit.tokenizer import cache_dir

HEAVY = ("duckdb", "pyarrow", "matplotlib", "ingest", "study")
_MAIN = ("import sys; from research.hf_bench.cli import main; rc = main(sys.argv[1:]); "
         f"print('HEAVY_MODULES', sorted(m for m in {HEAVY!r} if m in sys.modules)); sys.exit(rc)")


def _run(args, database_url, cwd, cache=None):
    """``python -m research.hf_bench ARGS`` (through ``research.hf_bench.cli.main``, reporting the heavy modules it
    imported)."""
    env = {**os.environ, "DATABASE_URL": database_url}
    if cache is not None:
        env["CREST_CACHE"] = str(cache)
    return subprocess.run([sys.executable, "-c", _MAIN, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)


def _csv(path) -> list[dict]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def calibration_cache(tmp_path_factory):
    """A cache folder with the real converted model (linked) but its own latency curve, budgets and references."""
    cache = tmp_path_factory.mktemp("cache")
    (cache_dir() / "models").mkdir(parents=True, exist_ok=True)  # on a fresh machine no model was converted yet
    (cache / "models").symlink_to(cache_dir() / "models", target_is_directory=True)
    return cache


@pytest.mark.slow
def test_bench_cli_writes_table_and_csv_without_heavy_imports(database_url, chat_datastore, tmp_path):
    out = tmp_path / "bench.csv"
    proc = _run(["bench", "--set", "humaneval", "--limit", "1", "--max-new-tokens", "12", "--drafter", "none",
                 "trie", "merged", "--datastore", chat_datastore, "--budget", "3", "--csv", str(out)],
                database_url, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    # no DuckDB, pyarrow, matplotlib, ingest or study on this path beyond what loading the model itself pulls in
    # (transformers imports scikit-learn where installed, and with it pandas and pyarrow)
    base = subprocess.run([sys.executable, "-c", "import sys; from decoder.model import load_target; load_target(); "
                           f"print('HEAVY_MODULES', sorted(m for m in {HEAVY!r} if m in sys.modules))"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    heavy = {line for line in proc.stdout.splitlines() if line.startswith("HEAVY_MODULES")}
    assert heavy and heavy == {line for line in base.stdout.splitlines() if line.startswith("HEAVY_MODULES")}
    assert not {"duckdb", "matplotlib", "ingest", "study"} & set(ast.literal_eval(heavy.pop().split(" ", 1)[1]))
    rows = _csv(out)
    assert {(r["category"], r["drafter"]) for r in rows} == {
        (c, d) for c in ("humaneval", "all") for d in ("greedy", "none", "trie", "merged")}
    runs = {r["drafter"]: r for r in _csv(tmp_path / "bench_runs.csv")}
    assert len(runs) == 4 and all(int(r["new_tokens"]) == 12 for r in runs.values())
    for r in rows:
        run = runs[r["drafter"]]
        assert r["lossless"] == "1/1"
        assert float(r["accept_length"]) == pytest.approx(11 / int(run["steps"]), abs=1e-3)  # 11 tokens after prefill
        assert float(r["tokens_per_s"]) == pytest.approx(12 / float(run["wall_s"]), rel=1e-2)
    assert int(runs["greedy"]["steps"]) == int(runs["none"]["steps"]) == 11
    assert int(runs["merged"]["steps"]) < 11  # HumanEval's prompt is copied: drafts are accepted
    assert "accept_length" in proc.stdout


@pytest.mark.slow
def test_replay_cli_equals_replaying_in_process(database_url, chat_datastore, tokenizer, tmp_path, calibration_cache,
                                                monkeypatch):
    from datastore import Datastore
    from drafting import DatastoreSource, DraftingService
    from evaluation.prompts import load_prompts
    from evaluation.simulate import replay
    from research.drafters.trie import Trie
    from research.hf_bench.store import reference_store

    proc = _run(["replay", "--set", "humaneval", "--limit", "1", "--max-new-tokens", "16", "--drafter", "trie",
                 "merged", "--datastore", chat_datastore, "--budget", "4"],
                database_url, tmp_path, calibration_cache)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    rows = {(r["category"], r["drafter"]): r for r in _csv(tmp_path / "results" / "replay_humaneval.csv")}
    prompt = load_prompts("humaneval", tokenizer, limit=1, half="report")[0]  # the CLI's default half
    monkeypatch.setenv("CREST_CACHE", str(calibration_cache))
    ref = reference_store("SmolLM2-135M-Instruct", "float32", "humaneval", 16).get(prompt.id, prompt.token_ids)
    assert ref is not None and len(ref) == 16  # the CLI saved the plain-greedy reference
    source = DatastoreSource(lambda: Datastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url))
    vocab = len(tokenizer)
    for drafter in (Trie(vocab_size=vocab), DraftingService(source, vocab_size=vocab)):
        res = replay(drafter, prompt.token_ids, ref, 4)
        row = rows[("all", drafter.name)]
        assert int(row["steps"]) == len(res.steps)
        assert float(row["accept_length"]) == pytest.approx(res.accept_length, abs=1e-3)
    source.close()


@pytest.mark.slow
def test_auto_budget_is_keyed_on_everything_that_changes_it(target, chat_datastore, database_url, tokenizer,
                                                           calibration_cache, monkeypatch):
    from datastore import Datastore
    from drafting import DatastoreSource, DraftingService
    from research.hf_bench.replay import CANDIDATE_BUDGETS, auto_budgets

    monkeypatch.setenv("CREST_CACHE", str(calibration_cache))
    args = argparse.Namespace(prompt_set="humaneval", data_dir=None, max_new_tokens=12)
    console = Console(file=open(os.devnull, "w"))  # noqa: SIM115 - closed at the end of the test
    vocab = len(tokenizer)

    def merged(**settings) -> DraftingService:  # a source of its own: closing a drafter closes its source for good
        source = DatastoreSource(lambda: Datastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url))
        return DraftingService(source, vocab_size=vocab, **settings)

    files = lambda: sorted((calibration_cache / "latency").glob("budget-merged-*.json"))  # noqa: E731
    for left in files():  # another test of this module may have chosen a budget in the shared cache first
        left.unlink()
    first = auto_budgets(args, target, lambda: [merged()], console)
    assert len(files()) == 1 and first["merged"] in CANDIDATE_BUDGETS
    saved = json.loads(files()[0].read_text())
    assert saved["budget"] == first["merged"]
    with Datastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url) as client:
        build = client.info.id
    assert saved["key"]["drafter"]["source"] == {"datastore": chat_datastore, "build": build}
    assert auto_budgets(args, target, lambda: [merged()], console) == first and len(files()) == 1
    auto_budgets(args, target, lambda: [merged(outputs_bytes=1 << 20)], console)
    assert len(files()) == 2  # another output index: chosen again, not read from the first drafter's cache
    auto_budgets(argparse.Namespace(**{**vars(args), "max_new_tokens": 10}), target,
                 lambda: [merged()], console)
    assert len(files()) == 3  # other references
    console.file.close()


@pytest.mark.slow
def test_bench_cli_budget_auto_end_to_end(database_url, chat_datastore, tmp_path, calibration_cache):
    args = ["bench", "--set", "humaneval", "--limit", "1", "--max-new-tokens", "12", "--drafter", "trie", "merged",
            "--datastore", chat_datastore, "--budget", "auto", "--csv", str(tmp_path / "b.csv")]
    first = _run(args, database_url, tmp_path, calibration_cache)
    assert first.returncode == 0, first.stderr[-2000:] + first.stdout[-2000:]
    chosen = next(line for line in first.stdout.splitlines() if line.startswith("budgets: "))
    budgets = dict(item.split("=") for item in chosen[len("budgets: "):].split(", "))
    assert set(budgets) == {"trie", "merged"} and all(int(b) >= 1 for b in budgets.values())
    for r in _csv(tmp_path / "b_runs.csv"):
        if r["drafter"] != "greedy":
            assert float(r["drafted_per_step"]) <= int(budgets[r["drafter"]]) and r["lossless"] == "True"
    again = _run(args, database_url, tmp_path, calibration_cache)
    assert again.returncode == 0 and chosen in again.stdout.splitlines()
    assert "budget for" not in again.stdout  # read from the cache, not calibrated again


@pytest.mark.slow
def test_budget_auto_scores_what_the_same_fixed_budget_scores(database_url, chat_datastore, tmp_path,
                                                             calibration_cache):
    """The choice of ``--budget auto`` is made on the fit half by throw-away drafters, so the scored drafter holds no
    scored prompt's output: with the output index on (the merged drafter's default), ``--budget auto`` and the budget
    it chose, fixed, give the same accept length on the same prompts (replay is exact: no noise to allow)."""
    common = ["--set", "humaneval", "--limit", "3", "--max-new-tokens", "24", "--drafter", "merged", "--datastore",
              chat_datastore]
    auto = _run(["bench", *common, "--budget", "auto", "--csv", str(tmp_path / "auto.csv")], database_url, tmp_path,
                calibration_cache)
    assert auto.returncode == 0, auto.stderr[-2000:] + auto.stdout[-2000:]
    chosen = next(line for line in auto.stdout.splitlines() if line.startswith("budgets: "))
    budget = chosen.split("merged=")[1].split(",")[0]
    fixed = _run(["bench", *common, "--budget", budget, "--csv", str(tmp_path / "fixed.csv")], database_url, tmp_path,
                 calibration_cache)
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    runs = [{(r["prompt_id"], r["drafter"]): r for r in _csv(tmp_path / f"{name}_runs.csv")}
            for name in ("auto", "fixed")]
    assert runs[0].keys() == runs[1].keys() and len(runs[0]) == 6  # 3 prompts, greedy and merged
    for key, row in runs[0].items():
        assert (row["accept_length"], row["steps"]) == (runs[1][key]["accept_length"], runs[1][key]["steps"]), key
    assert any(float(r["accept_length"]) > 1.0 for (_, d), r in runs[0].items() if d == "merged")
    refused = _run(["bench", *common, "--budget", "auto", "--half", "all"], database_url, tmp_path, calibration_cache)
    assert refused.returncode == 2 and "--budget auto chooses each drafter's budget on the fit half" in refused.stderr


@pytest.mark.slow
def test_bench_cli_rest_drafter_is_lossless(database_url, real_stream, tokenizer, tmp_path):
    from benchmarks.rest_index import SuffixIndex

    SuffixIndex.build(real_stream, len(tokenizer)).save(tmp_path / "rest")
    out = tmp_path / "bench.csv"
    proc = _run(["bench", "--set", "spec_bench", "--category", "writing", "--limit", "1", "--max-new-tokens", "12",
                 "--drafter", "rest", "--rest-index", str(tmp_path / "rest"), "--budget", "8", "--csv", str(out)],
                database_url, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    rows = [r for r in _csv(out) if r["drafter"] == "rest"]
    assert rows and all(r["lossless"] == "1/1" for r in rows)
    missing = _run(["bench", "--set", "humaneval", "--limit", "1", "--drafter", "rest", "--rest-index",
                    str(tmp_path / "nowhere"), "--budget", "3"], database_url, tmp_path)
    assert missing.returncode == 2 and "python -m benchmarks.rest_index" in missing.stderr


def test_bench_cli_names_a_missing_datastore(database_url, tmp_path):
    proc = _run(["bench", "--set", "humaneval", "--limit", "1", "--max-new-tokens", "4", "--drafter", "datastore",
                 "--datastore", "no-such-datastore", "--budget", "3"],
                database_url, tmp_path)
    assert proc.returncode == 2
    assert "no-such-datastore" in proc.stderr


def test_bench_cli_names_an_unknown_category(database_url, tmp_path):
    proc = _run(["bench", "--set", "spec_bench", "--category", "poetry", "--drafter", "trie", "--budget", "3"],
                database_url, tmp_path)
    assert proc.returncode == 2
    assert "'poetry'" in proc.stderr and "rag" in proc.stderr


@pytest.mark.slow
def test_local_gguf_loads_and_caches_safetensors(target, tokenizer, tmp_path, monkeypatch):
    from decoder.model import load_target
    from toolkit.tokenizer import resolve_model

    src = resolve_model(None)
    assert src.gguf_file is not None  # the default model is a GGUF file
    gguf = os.path.join(src.path, src.gguf_file)
    monkeypatch.setenv("CREST_CACHE", str(tmp_path / "cache"))
    fresh = load_target(gguf)  # converts the GGUF and writes the safetensors copy
    cached = list((tmp_path / "cache").rglob("model.safetensors"))
    assert len(cached) == 1
    again = load_target(gguf)  # reads the copy
    ids = torch.tensor([tokenizer.encode("def fibonacci(n):", add_special_tokens=False)])
    with torch.inference_mode():
        ref = target.model(input_ids=ids).logits
        torch.testing.assert_close(fresh.model(input_ids=ids).logits, ref)
        torch.testing.assert_close(again.model(input_ids=ids).logits, ref)
    # the copy is a checkpoint any engine loads: architectures named, the tied embedding under its own name
    from safetensors import safe_open

    folder = cached[0].parent
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    with safe_open(str(cached[0]), "pt") as f:
        assert "model.embed_tokens.weight" in set(f.keys())
    assert (folder / "tokenizer.json").exists()


def test_a_hub_id_with_no_network_fails_within_seconds(capsys):
    from research.hf_bench.cli import main

    t0 = time.monotonic()
    got, text = call(main, ["replay", "--model", "HuggingFaceTB/no-such-model-0f3a", "--budget", "3"], capsys)
    assert got == 2 and "no-such-model-0f3a" in text and "HF_HUB_OFFLINE" in text
    assert time.monotonic() - t0 < 5


DECODER = [
    (["bench", "--budget", "99"], 2, ("99", "--budget", "0..63")),
    (["replay", "--budget", "many"], 2, ("'many'", "--budget", "auto")),
    (["bench", "--model", NO_SUCH], 2, (NO_SUCH, "--model")),
    (["bench", "--data-dir", NO_SUCH], 2, (NO_SUCH, "--data-dir")),
    (["bench", "--device", "tpu"], 2, ("'tpu'", "--device")),
    (["bench", "--datastore", "bad name"], 2, ("'bad name'",)),
    (["budget", "--drafter", "oracle"], 2, ("'oracle'", "--drafter")),
    (["bench", "--limit", "0"], 2, ("--limit",)),
    (["bench", "--set", "spec_bench", "--category", "poetry", "--drafter", "trie", "--budget", "3"], 2,
     ("'poetry'", "rag")),
    (["bench", "--drafter", "datastore", "--datastore", "no-such-0f3a", "--budget", "3"], 2, ("no-such-0f3a",)),
    (["replay", "--drafter", "rest", "--rest-index", NO_SUCH], 2, (NO_SUCH, "--rest-index")),
]


@pytest.mark.parametrize("argv,code,names", DECODER, ids=[" ".join(a) for a, _, _ in DECODER])
def test_decoder_bench_replay_budget_refuse_bad_input(argv, code, names, capsys, database_url, monkeypatch):
    from research.hf_bench.cli import main

    monkeypatch.setenv("DATABASE_URL", database_url)
    check_refusal(main, argv, code, names, capsys)
