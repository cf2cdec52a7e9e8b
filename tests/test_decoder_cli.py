"""The decoder CLI end to end, and loading the model from a local GGUF with a fresh cache."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import torch

from conftest import SHARED_DATA


def _run(args, database_url, tmp_path):
    env = {**os.environ, "DATABASE_URL": database_url}
    return subprocess.run([sys.executable, "-m", "decoder", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=900)


def test_bench_cli_writes_table_and_csv(database_url, chat_datastore, tmp_path):
    out = tmp_path / "bench.csv"
    proc = _run(["bench", "--set", "humaneval", "--limit", "1", "--max-new-tokens", "12", "--drafter", "none",
                 "trie", "merged", "--datastore", chat_datastore, "--budget", "3", "--csv", str(out),
                 "--data-dir", str(SHARED_DATA)], database_url, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    rows = list(csv.DictReader(out.open()))
    assert {(r["category"], r["drafter"]) for r in rows} == {
        (c, d) for c in ("humaneval", "all") for d in ("greedy", "none", "trie", "merged")}
    for r in rows:
        assert r["lossless"] == "1/1"
        assert float(r["accept_length"]) >= 1.0 and float(r["tokens_per_s"]) > 0
    runs = list(csv.DictReader((tmp_path / "bench_runs.csv").open()))
    assert len(runs) == 4 and all(int(r["new_tokens"]) == 12 for r in runs)
    assert "accept_length" in proc.stdout


def test_bench_cli_rest_drafter_is_lossless(database_url, real_stream, tokenizer, tmp_path):
    from decoder.suffix_index import SuffixIndex

    SuffixIndex.build(real_stream, len(tokenizer)).save(tmp_path / "rest")
    out = tmp_path / "bench.csv"
    proc = _run(["bench", "--set", "spec_bench", "--category", "writing", "--limit", "1", "--max-new-tokens", "12",
                 "--drafter", "rest", "--rest-index", str(tmp_path / "rest"), "--budget", "8", "--csv", str(out),
                 "--data-dir", str(SHARED_DATA)], database_url, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    rows = [r for r in csv.DictReader(out.open()) if r["drafter"] == "rest"]
    assert rows and all(r["lossless"] == "1/1" for r in rows)
    missing = _run(["bench", "--set", "humaneval", "--limit", "1", "--drafter", "rest", "--rest-index",
                    str(tmp_path / "nowhere"), "--budget", "3", "--data-dir", str(SHARED_DATA)], database_url, tmp_path)
    assert missing.returncode == 2 and "no suffix index" in missing.stdout


def test_bench_cli_names_a_missing_datastore(database_url, tmp_path):
    proc = _run(["bench", "--set", "humaneval", "--limit", "1", "--max-new-tokens", "4", "--drafter", "datastore",
                 "--datastore", "no-such-datastore", "--budget", "3", "--data-dir", str(SHARED_DATA)],
                database_url, tmp_path)
    assert proc.returncode == 2
    assert "no-such-datastore" in proc.stdout


def test_bench_cli_names_an_unknown_category(database_url, tmp_path):
    proc = _run(["bench", "--set", "spec_bench", "--category", "poetry", "--drafter", "trie", "--budget", "3",
                 "--data-dir", str(SHARED_DATA)], database_url, tmp_path)
    assert proc.returncode == 2
    assert "'poetry'" in proc.stdout and "rag" in proc.stdout


def test_local_gguf_loads_and_caches_safetensors(target, tokenizer, tmp_path, monkeypatch):
    from datastore.tokenizer import resolve_model
    from decoder.model import load_target

    src = resolve_model(None)
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
