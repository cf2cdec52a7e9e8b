"""``python -m ingest`` (:mod:`ingest.cli`): counts parsed, and every bad input refused with the documented exit code
and a one-line message naming it (the real entry point, run as a subprocess where it matters)."""

from __future__ import annotations

import argparse
import gzip
import json

import pytest

from ingest.cli import parse_count
from support import NO_SUCH, REPO, call, check_refusal, run_module


@pytest.mark.parametrize("text,value", [("2M", 2_000_000), ("500K", 500_000), ("2000000", 2_000_000),
                                        ("2_000_000", 2_000_000), ("1.5m", 1_500_000), ("7", 7)])
def test_parse_count(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize("text", ["", "two", "-5", "0", "1.5", "2T"])
def test_parse_count_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_count(text)


def test_bad_flags_name_the_flag(database_url):
    out = run_module("ingest", "build", "--depth", "0", "--database-url", database_url)
    assert out.returncode == 2 and "argument --depth: 0 is outside 1..32" in out.stderr
    out = run_module("ingest", "build", "--source", "code", "--path", "/nonexistent/dir", "--database-url",
                     database_url)
    assert out.returncode == 2 and "argument --path: /nonexistent/dir: no such file or directory" in out.stderr


def test_unreachable_database_is_reported(tmp_path):
    out = run_module("ingest", "build", "--limit", "2", "--database-url", "postgresql://postgres@127.0.0.1:1/none")
    assert out.returncode == 1 and "cannot connect to PostgreSQL" in out.stderr and "DATABASE_URL" in out.stderr


INGEST = [
    (["build", "--path", NO_SUCH], 2, (NO_SUCH, "no such file")),
    (["build", "--name", "bad name!"], 2, ("bad name!", "letters, digits")),
    (["build", "--memory-limit", "banana"], 2, ("banana", "4GB")),
    (["build", "--tokenizer", NO_SUCH], 2, (NO_SUCH, "--tokenizer")),
    (["build", "--tokenizer", "gpt2"], 2, ("gpt2", "HF_HUB_OFFLINE", "--tokenizer")),
    (["build", "--top-t", "0"], 2, ("'0'", "--top-t")),
    (["build", "--top-t", "lots"], 2, ("'lots'", "2M")),
    (["build", "--max-n", "9"], 2, ("9", "--max-n", "1..8")),
    (["build", "--depth", "abc"], 2, ("'abc'", "--depth")),
    (["build", "--workers", "0"], 2, ("--workers",)),
    (["build", "--database-url", "not-a-url"], 2, ("not-a-url", "postgresql://")),
    (["build", "--source", "jsonl"], 2, ("--path",)),
    (["build", "--spark-conf", "driver.memory"], 2, ("driver.memory", "spark.")),
    (["build", "--engine", "spark", "--ranking-dir", "x"], 2, ("--ranking-dir",)),
    (["build", "--workdir", NO_SUCH], 2, (NO_SUCH,)),
    (["build", "--source", "jsonl", "--path", f"{REPO}/ingest/*.py"], 2, ("ingest/*.py", "--source chat only")),
    (["build", "--source", "chat", "--path", f"{REPO}/no-such-*.jsonl"], 2, ("no-such-*.jsonl", "matches")),
    (["build", "--source", "parquet", "--path", str(REPO), str(REPO)], 2, ("reads one --path",)),
]


@pytest.mark.parametrize("argv,code,names", INGEST, ids=[" ".join(a) for a, _, _ in INGEST])
def test_ingest_build_refuses_bad_input(argv, code, names, capsys, database_url, monkeypatch):
    from ingest.cli import main

    monkeypatch.setenv("DATABASE_URL", database_url)
    check_refusal(main, argv, code, names, capsys)


def test_a_sharegpt_directory_and_a_malformed_environment_url(tmp_path, capsys, monkeypatch):
    from ingest.cli import main

    monkeypatch.setenv("DATABASE_URL", "not-a-url")
    check_refusal(main, ["build", "--limit", "1"], 2, ("not-a-url", "DATABASE_URL"), capsys)
    monkeypatch.setenv("DATABASE_URL", "postgresql://crest:hunter2@127.0.0.1:1/none")
    got, text = call(main, ["build", "--limit", "1", "--source", "sharegpt", "--path", str(tmp_path)], capsys)
    assert got == 2 and str(tmp_path) in text and "directory" in text and "Traceback" not in text
    got, text = call(main, ["build", "--limit", "1"], capsys)  # a server that cannot be reached: a failure
    assert got == 1 and "127.0.0.1" in text and "hunter2" not in text and "Traceback" not in text


def test_chat_build_from_a_gzip_log_reports_malformed_by_reason(tmp_path, capsys, database_url, ds_name):
    """A tiny datastore from an OpenAI-format chat log (gzip), through the real entry point."""
    from ingest.cli import main

    chats = [[{"role": "system", "content": "You are terse."}, {"role": "user", "content": f"Count to {i}."},
              {"role": "assistant", "content": " ".join(str(k) for k in range(1, i + 1))}] for i in range(2, 7)]
    lines = [json.dumps({"messages": c, "model": "smol"}) for c in chats]
    lines[1:1] = ["{not json", json.dumps({"id": 1}), json.dumps({"messages": [{"role": "robot", "content": "x"}]}),
                  json.dumps({"messages": [{"role": "tool", "content": "3"}, *chats[0]]})]
    log = tmp_path / "requests.jsonl.gz"
    log.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    got, text = call(main, ["build", "--source", "chat", "--path", str(log), "--name", ds_name, "--top-t", "40",
                            "--max-n", "2", "--workers", "1", "--quiet", "--json", "--database-url", database_url],
                     capsys)
    assert got == 0, text
    out = json.loads(text)
    assert out["documents"] == 5 and out["tokens"] > 0 and out["ngrams"] > 0
    corpus = out["corpus"]
    assert corpus["source"] == "chat" and corpus["path"] == str(log) and corpus["duplicates"] == 1
    assert corpus["malformed"] == {"invalid JSON": 1, "missing field: messages": 1, "unknown role": 1,
                                   "tool turn skipped": 1}
    assert out["config"]["chat_field"] is None and out["config"]["source"] == "chat"
