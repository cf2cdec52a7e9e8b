"""CLI parsing and error messages (the real entry points, run as subprocesses where it matters)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from ingest.cli import parse_count


@pytest.mark.parametrize("text,value", [("2M", 2_000_000), ("500K", 500_000), ("2000000", 2_000_000),
                                        ("2_000_000", 2_000_000), ("1.5m", 1_500_000), ("7", 7)])
def test_parse_count(text, value):
    assert parse_count(text) == value


@pytest.mark.parametrize("text", ["", "two", "-5", "0", "1.5", "2T"])
def test_parse_count_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_count(text)


def _run(*args, env=None):
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)


def test_bad_flags_name_the_flag(database_url):
    out = _run("ingest", "build", "--depth", "0", "--database-url", database_url)
    assert out.returncode == 2 and "argument --depth: 0 is outside 1..32" in out.stderr
    out = _run("ingest", "build", "--source", "code", "--path", "/nonexistent/dir", "--database-url", database_url)
    assert out.returncode == 2 and "argument --path: /nonexistent/dir: no such file or directory" in out.stderr


def test_unreachable_database_is_reported(tmp_path):
    out = _run("ingest", "build", "--limit", "2", "--database-url", "postgresql://postgres@127.0.0.1:1/none")
    assert out.returncode == 1 and "cannot connect to PostgreSQL" in out.stderr and "DATABASE_URL" in out.stderr


def test_datastore_cli_stats_and_missing_name(database_url, sharegpt_sample, ds_name):
    out = _run("ingest", "build", "--name", ds_name, "--path", str(sharegpt_sample), "--limit", "5", "--top-t", "50",
               "--max-n", "2", "--quiet", "--database-url", database_url)
    assert out.returncode == 0, out.stderr
    assert "bytes per n-gram" in out.stdout
    stats = _run("datastore", "stats", "--name", ds_name, "--json", "--database-url", database_url)
    assert stats.returncode == 0 and '"bytes_per_ngram"' in stats.stdout
    listed = _run("datastore", "list", "--database-url", database_url)
    assert ds_name in listed.stdout
    missing = _run("datastore", "stats", "--name", "no-such-store", "--database-url", database_url)
    assert missing.returncode == 2 and "no ready datastore named 'no-such-store'" in missing.stderr


def test_rest_index_cli_indexes_the_same_token_stream(tmp_path, sharegpt_sample, real_stream, tokenizer):
    from datastore import SuffixIndex
    from datastore.continuations import SEPARATOR

    out = tmp_path / "rest"
    proc = _run("ingest", "rest-index", "--path", str(sharegpt_sample), "--limit", "40", "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    index = SuffixIndex.load(out)
    expected = real_stream.astype(np.int64)  # the same 40 conversations, tokenized as a build tokenizes them
    expected[real_stream == SEPARATOR] = len(tokenizer)  # REST's separator is the vocabulary size
    assert np.array_equal(np.asarray(index.tokens, dtype=np.int64), expected)
    assert f"{index.nbytes:,} bytes" in proc.stdout and index.nbytes == 6 * len(real_stream)
    assert not list(tmp_path.glob(".rest-*"))  # staged beside the output, renamed into place, nothing left over
    missing = _run("ingest", "rest-index", "--path", str(tmp_path / "nowhere.json"), "--out", str(out))
    assert missing.returncode == 2 and "nowhere.json: no such file or directory" in missing.stderr
    assert SuffixIndex.load(out).num_tokens == len(real_stream)  # a failed run leaves the previous index
