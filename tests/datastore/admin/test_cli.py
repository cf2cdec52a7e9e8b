"""``python -m datastore`` (:mod:`datastore.admin.cli`): every subcommand refuses bad input with the documented exit
code and a one-line message naming the input; stats, list, replica and a closed pipe, on a real build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO, call, check_refusal, run_module

DATASTORE = [
    (["stats", "--name", "no-such-0f3a"], 2, ("no-such-0f3a",)),
    (["stats", "--name", "bad/name"], 2, ("bad/name",)),
    (["stats"], 2, ("--name",)),
    (["drop", "no-such-0f3a"], 2, ("no-such-0f3a",)),
    (["grant-reader", "crest_nobody_0f3a", "--name", "never-built-0f3a"], 2, ("never-built-0f3a", "--future")),
    (["grant-reader", "probe_ro'le2"], 2, ('CREATE ROLE "probe_ro\'le2" LOGIN', "--create")),
    (["revoke-reader", "crest_nobody_0f3a"], 2, ("crest_nobody_0f3a",)),
    (["replica", "--name", "no-such-0f3a", "--folder", "/tmp"], 2, ("no-such-0f3a",)),
    (["replica", "--name", "x", "--build", "0"], 2, ("--build",)),
    (["list", "--database-url", "not-a-url"], 2, ("not-a-url",)),
    (["migrate", "--database-url", "postgresql://crest:hunter2@127.0.0.1:1/none"], 1, ("127.0.0.1",)),
    (["vacuum", "--database-url", "host=127.0.0.1 port=1 password=hunter2"], 1, ("127.0.0.1",)),
]


@pytest.mark.parametrize("argv,code,names", DATASTORE, ids=[" ".join(a) for a, _, _ in DATASTORE])
def test_datastore_subcommands_refuse_bad_input(argv, code, names, capsys, database_url, monkeypatch):
    from datastore.admin.cli import main

    monkeypatch.setenv("DATABASE_URL", database_url)
    check_refusal(main, argv, code, names, capsys)


def test_json_piped_into_head_ends_quietly(database_url, chat_datastore):
    proc = subprocess.run(f"{sys.executable} -m datastore stats --name {chat_datastore} --json | head -c 10",
                          shell=True, cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"DATABASE_URL": database_url, "PATH": "/usr/bin:/bin"})
    assert proc.stdout.startswith("{") and "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_list_columns_stay_aligned(database_url, chat_datastore, capsys):
    from datastore.admin.cli import main

    got, text = call(main, ["list", "--database-url", database_url], capsys)
    assert got == 0 and chat_datastore in text
    lines = [line for line in text.splitlines() if "│" in line]
    assert len({len(line) for line in lines}) == 1  # a table: every row as wide as the header


def test_datastore_cli_stats_and_missing_name(database_url, sharegpt_sample, ds_name):
    out = run_module("ingest", "build", "--name", ds_name, "--path", str(sharegpt_sample), "--limit", "5", "--top-t",
                     "50", "--max-n", "2", "--quiet", "--database-url", database_url)
    assert out.returncode == 0, out.stderr
    assert "bytes per n-gram" in out.stdout
    stats = run_module("datastore", "stats", "--name", ds_name, "--json", "--database-url", database_url)
    assert stats.returncode == 0 and '"bytes_per_ngram"' in stats.stdout
    listed = run_module("datastore", "list", "--database-url", database_url)
    assert ds_name in listed.stdout
    missing = run_module("datastore", "stats", "--name", "no-such-store", "--database-url", database_url)
    assert missing.returncode == 2 and "no ready datastore named 'no-such-store'" in missing.stderr


def test_replica_writes_the_hosts_file_once_and_refuses_a_replaced_build(database_url, chat_datastore, tmp_path):
    """``replica`` writes the ready build's file, then finds it there; a build id that is not the ready one, and no
    folder where replicas are off, are refused by name (exit 2)."""
    from crest_native import Replica

    argv = ["replica", "--name", chat_datastore, "--folder", str(tmp_path), "--json", "--database-url", database_url]
    first = run_module("datastore", *argv)
    assert first.returncode == 0, first.stderr
    done = json.loads(first.stdout)
    assert done["written"]["entries"] > 0 and done["written"]["bytes"] == Path(done["path"]).stat().st_size
    assert f'"build":{done["build"]},'.encode() in Replica(done["path"]).identity
    again = json.loads(run_module("datastore", *argv).stdout)
    assert again == {**done, "written": None}
    stale = run_module("datastore", *argv, "--build", str(done["build"] + 1000))
    assert stale.returncode == 2 and f"build {done['build'] + 1000} of datastore {chat_datastore!r}" in stale.stderr
    off = run_module("datastore", "replica", "--name", chat_datastore, "--database-url", database_url,
                     env=dict(os.environ, CREST_REPLICAS="off"))
    assert off.returncode == 2 and "--folder" in off.stderr.splitlines()[-1]
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    refused = run_module("datastore", *argv[:4], str(not_a_folder), *argv[5:])
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert str(not_a_folder) in refused.stderr and "--folder DIR" in refused.stderr.splitlines()[-1]
