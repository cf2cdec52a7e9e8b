"""Bad input, entry point by entry point: every case exits with the documented code and a one-line message that
names the input (and the fix), and never a traceback; defaults are what ``--help`` says; the lookup API refuses
what it would otherwise coerce. Each table row is one input a hostile new user tried."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from typing import Any, cast

import numpy as np
import pytest

from conftest import REPO
from datastore.errors import BadDatabaseUrl, InvalidContext

NO_SUCH = "/no/such/path-0f3a"


def _call(main, argv: list[str], capsys) -> tuple[int, str]:
    """Run an entry point in-process: ``(exit code, everything it printed)``."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    printed = capsys.readouterr()
    return int(code or 0), printed.out + printed.err


def _check(main, argv, code: int, names: tuple[str, ...], capsys) -> None:
    t0 = time.monotonic()
    got, text = _call(main, argv, capsys)
    assert got == code, (argv, got, text[-2000:])
    assert "Traceback" not in text, (argv, text[-2000:])
    for needle in names:
        assert needle in text, (argv, needle, text[-2000:])
    assert "hunter2" not in text  # a password is never echoed
    # no doubled punctuation ("1..8" is a range, "..." an ellipsis)
    assert not re.search(r"(?<![\d.])\.\.(?![\d.])|;;|::\s|, ,", text), (argv, text)
    assert time.monotonic() - t0 < 30, argv  # nothing hangs: bad input is refused at once


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
    (["rest-index", "--path", NO_SUCH], 2, (NO_SUCH,)),
    (["compact-live", "--name", "a b"], 2, ("'a b'",)),
    (["compact-live", "--max-bytes", "12"], 2, ("'12'", "--max-bytes", "1024")),
]


@pytest.mark.parametrize("argv,code,names", INGEST, ids=[" ".join(a) for a, _, _ in INGEST])
def test_ingest_build_refuses_bad_input(argv, code, names, capsys, database_url, monkeypatch):
    from ingest.cli import main

    monkeypatch.setenv("DATABASE_URL", database_url)
    _check(main, argv, code, names, capsys)


def test_a_sharegpt_directory_and_a_malformed_environment_url(tmp_path, capsys, monkeypatch):
    from ingest.cli import main

    monkeypatch.setenv("DATABASE_URL", "not-a-url")
    _check(main, ["build", "--limit", "1"], 2, ("not-a-url", "DATABASE_URL"), capsys)
    monkeypatch.setenv("DATABASE_URL", "postgresql://crest:hunter2@127.0.0.1:1/none")
    got, text = _call(main, ["build", "--limit", "1", "--source", "sharegpt", "--path", str(tmp_path)], capsys)
    assert got == 2 and str(tmp_path) in text and "directory" in text and "Traceback" not in text
    got, text = _call(main, ["build", "--limit", "1"], capsys)  # a server that cannot be reached: a failure
    assert got == 1 and "127.0.0.1" in text and "hunter2" not in text and "Traceback" not in text


def test_a_hub_id_with_no_network_fails_within_seconds(capsys):
    from decoder.cli import main

    t0 = time.monotonic()
    got, text = _call(main, ["replay", "--model", "HuggingFaceTB/no-such-model-0f3a", "--budget", "3"], capsys)
    assert got == 2 and "no-such-model-0f3a" in text and "HF_HUB_OFFLINE" in text
    assert time.monotonic() - t0 < 5


DATASTORE = [
    (["stats", "--name", "no-such-0f3a"], 2, ("no-such-0f3a",)),
    (["stats", "--name", "bad/name"], 2, ("bad/name",)),
    (["stats"], 2, ("--name",)),
    (["drop", "no-such-0f3a"], 2, ("no-such-0f3a",)),
    (["grant-reader", "crest_nobody_0f3a", "--name", "never-built-0f3a"], 2, ("never-built-0f3a", "--future")),
    (["grant-reader", "probe_ro'le2"], 2, ('CREATE ROLE "probe_ro\'le2" LOGIN', "--create")),
    (["revoke-reader", "crest_nobody_0f3a"], 2, ("crest_nobody_0f3a",)),
    (["list", "--database-url", "not-a-url"], 2, ("not-a-url",)),
    (["migrate", "--database-url", "postgresql://crest:hunter2@127.0.0.1:1/none"], 1, ("127.0.0.1",)),
    (["vacuum", "--database-url", "host=127.0.0.1 port=1 password=hunter2"], 1, ("127.0.0.1",)),
]


@pytest.mark.parametrize("argv,code,names", DATASTORE, ids=[" ".join(a) for a, _, _ in DATASTORE])
def test_datastore_subcommands_refuse_bad_input(argv, code, names, capsys, database_url, monkeypatch):
    from datastore.cli import main

    monkeypatch.setenv("DATABASE_URL", database_url)
    _check(main, argv, code, names, capsys)


def test_json_piped_into_head_ends_quietly(database_url, chat_datastore):
    proc = subprocess.run(f"{sys.executable} -m datastore stats --name {chat_datastore} --json | head -c 10",
                          shell=True, cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"DATABASE_URL": database_url, "PATH": "/usr/bin:/bin"})
    assert proc.stdout.startswith("{") and "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_list_columns_stay_aligned(database_url, chat_datastore, capsys):
    from datastore.cli import main

    got, text = _call(main, ["list", "--database-url", database_url], capsys)
    assert got == 0 and chat_datastore in text
    lines = [line for line in text.splitlines() if "│" in line]
    assert len({len(line) for line in lines}) == 1  # a table: every row as wide as the header


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
    from decoder.cli import main

    monkeypatch.setenv("DATABASE_URL", database_url)
    _check(main, argv, code, names, capsys)


STUDY = [
    (["storage", "--corpus", "poetry"], 2, ("'poetry'",)),
    (["storage", "--budget", "0"], 2, ("--budget",)),
    (["storage", "--single-n", "9"], 2, ("--single-n", "9")),
    (["storage", "--combined-m", "1"], 2, ("--combined-m",)),
    (["storage", "--top-t", "0"], 2, ("--top-t",)),
    (["storage", "--rest-fractions", "150%"], 2, ("150%",)),
    (["storage", "--data-dir", NO_SUCH], 2, (NO_SUCH,)),
    (["storage", "--name-prefix", "bad prefix"], 2, ("'bad prefix'",)),
    (["storage", "--model", NO_SUCH], 2, (NO_SUCH,)),
    (["storage", "--database-url", "not-a-url"], 2, ("not-a-url",)),
]


@pytest.mark.parametrize("argv,code,names", STUDY, ids=[" ".join(a) for a, _, _ in STUDY])
def test_study_storage_refuses_bad_input(argv, code, names, capsys):
    from study.cli import main

    _check(main, argv, code, names, capsys)


# -- defaults: what --help says -----------------------------------------------------------------------------------

def _parsers():
    from datastore.cli import build_parser as datastore_parser
    from decoder.cli import build_parser as decoder_parser
    from ingest.cli import build_parser as ingest_parser
    from study.cli import build_parser as study_parser

    return {"ingest": ingest_parser(), "datastore": datastore_parser(), "decoder": decoder_parser(),
            "study": study_parser()}


def _spellings(value) -> set[str]:
    """The ways a help text may spell one value: as is; a count as 2M or 500K; a fraction as 4%."""
    out = {str(value)}
    if isinstance(value, int) and not isinstance(value, bool):
        for unit, size in (("K", 1_000), ("M", 1_000_000)):
            if value >= size and value % size == 0:
                out.add(f"{value // size}{unit}")
    if isinstance(value, float) and 0 < value <= 1:
        out.add(f"{value * 100:g}%")
    return out


def _says(stated: str, value) -> bool:
    """Whether a help text's ``default: ...`` states ``value`` (a list may be elided: ``1K 2K ... 512K``)."""
    if not isinstance(value, (list, tuple)):
        return any(stated == s or stated.startswith((s + ",", s + " ", s + ":")) for s in _spellings(value))
    if not value:
        return stated.startswith("none")
    if len(value) == 2 and stated == "both":
        return True
    words = stated.split()
    if "..." in words:
        head, tail = words[:words.index("...")], words[words.index("...") + 1:]
        return (all(w in _spellings(v) for w, v in zip(head, value)) and
                all(w in _spellings(v) for w, v in zip(tail[::-1], value[::-1])))
    return len(words) == len(value) and all(w in _spellings(v) for w, v in zip(words, value))


def test_every_default_is_what_help_says():
    """Each subcommand parsed with no options: every default a help text states is the value the option gets, and
    no subcommand's defaults leak into another's (``decoder bench`` drafts with ``merged``)."""
    required = {"drop": ["x"], "grant-reader": ["r"], "revoke-reader": ["r"], "grant-appender": ["r"],
                "stats": ["--name", "x"]}
    checked = 0
    for cli, parser in _parsers().items():
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        for name, subparser in sub.choices.items():
            args = vars(parser.parse_args([name, *required.get(name, [])]))
            for action in subparser._actions:
                text = (action.help or "").replace("%(default)s", str(action.default)).replace("%%", "%")
                m = re.search(r"\(default: ([^)]*)\)|default: ([^;)]*)\)?$", text)
                if not m or action.dest == "help":
                    continue
                stated = m.group(1) or m.group(2)
                value = args[action.dest]
                if value is None or isinstance(value, bool):
                    continue  # None: the help names where the value comes from instead (an env var, a cache ...)
                assert _says(stated.strip(), value), (cli, name, action.dest, value, stated)
                checked += 1
    assert checked > 40
    from decoder.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["bench"]).drafter == ["merged"] == parser.parse_args(["replay"]).drafter
    assert parser.parse_args(["budget"]).drafter == []


# -- the lookup API -------------------------------------------------------------------------------------------------

def test_lookups_refuse_what_they_would_coerce(chat_datastore, database_url, tokenizer, eval_prompts):
    from datastore import Datastore, SharedDatastore
    from decoder.drafters import DatastoreSource

    ids = list(eval_prompts[0].token_ids)
    vocab = len(tokenizer)
    cases = [
        (lambda c: c.lookup(np.array(ids, dtype=float) + 0.9), "float64"),
        (lambda c: c.lookup("How do I"), "str"),
        (lambda c: c.lookup(b"\x01\x02"), "bytes"),
        (lambda c: c.lookup(i for i in ids), "generator"),
        (lambda c: c.lookup(ids[:-1] + [vocab]), str(vocab)),
        (lambda c: c.lookup(ids[:-1] + [-3]), "-3"),
        (lambda c: c.lookup(ids[:-1] + [True]), "True"),
        (lambda c: c.lookup(ids[:-1] + [2.0]), "2.0"),
        (lambda c: c.lookup_batch(ids), "flat"),
        (lambda c: c.lookup_batch(iter([ids])), "list_iterator"),
        (lambda c: c.lookup_batch("ab"), "str"),
        (lambda c: c.lookup_batch([ids, np.zeros((2, 2), np.int64)]), "contexts[1]"),
        (lambda c: c.candidates_batch([ids, ids[:-1] + [vocab + 5]]), "contexts[1]"),
        (lambda c: c.lookup_batch(np.ones((2, 4), dtype=np.float32)), "float32"),
    ]
    for open_ in (Datastore.open, SharedDatastore.open):
        with open_(chat_datastore, tokenizer=tokenizer, database_url=database_url) as client:
            assert client.lookup(ids) is not None and client.lookup(np.asarray(ids, dtype=np.int32)) is not None
            assert len(client.lookup_batch(np.asarray([ids[:8], ids[1:9]], dtype=np.int64))) == 2  # rows: contexts
            for call, named in cases:
                with pytest.raises(InvalidContext, match=re.escape(named)):
                    call(client)
    source = DatastoreSource(lambda: Datastore.open(chat_datastore, tokenizer=tokenizer, database_url=database_url))
    with pytest.raises(InvalidContext):  # a caller's bug is raised, never swallowed as a datastore fault
        source.lookup(np.array(ids, dtype=float))
    assert not source.faults
    source.close()
    with pytest.raises(BadDatabaseUrl, match="not-a-url"):
        Datastore.open(chat_datastore, tokenizer=tokenizer, database_url="not-a-url")


def test_drafters_refuse_token_ids_they_would_coerce():
    from decoder.drafters import TrieDrafter

    drafter = TrieDrafter()
    with pytest.raises(InvalidContext, match="float"):
        drafter.start_request("a", np.array([1.5, 2.5]))
    with pytest.raises(InvalidContext, match="str"):
        drafter.start_request("a", cast(Any, "hello"))
    drafter.start_request("a", [1, 2, 3])
    with pytest.raises(InvalidContext, match="-1"):
        drafter.add_tokens("a", [-1])
    assert drafter.propose([("a", 2)])[0] is not None


def test_a_context_is_checked_by_its_last_ids_whole_when_shorter():
    from datastore.context import check_context

    assert check_context([5, 6], 10, 5) == [5, 6] == check_context(np.array([5, 6], dtype=np.uint32), 10, 5)
    assert check_context((1, 2, 3, 4), 10, 2) == [3, 4] == check_context(np.arange(1, 5), 10, 2)
    assert check_context([], 10, 3) == [] == check_context([1, 2], 10, 0)
    with pytest.raises(InvalidContext, match="outside"):
        check_context([99, 1], 10, 5)  # the early id is inside the tail: checked
