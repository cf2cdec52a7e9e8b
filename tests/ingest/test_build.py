"""End to end against the real Postgres: builds from real samples, lookups vs the oracle,
failed and killed builds, tokenizer refusal, schema check."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np
import psutil
import psycopg
import pytest

from datastore.admin.catalog import datastore_stats, list_datastores
from datastore.admin.writer import DatastoreWriter
from datastore.client import Datastore
from datastore.errors import BuildConflict, DatastoreNotFound, TokenizerMismatch
from ingest.build import BuildConfig, build_datastore, tokenize_source
from oracle.ingest import continuation_tree, count_ngrams, top_t
from support import REPO
from toolkit.eval_sets import screened_texts


def _build(url, name, path, **kw):
    return build_datastore(BuildConfig(name=name, path=path, database_url=url, **kw), progress=False)


@pytest.fixture(scope="module")
def small_build(database_url, sharegpt_sample, tokenizer, tmp_path_factory):
    """A datastore over 40 real ShareGPT conversations, and the same token stream for the oracle."""
    name = f"test-e2e-{os.getpid()}"
    result = _build(database_url, name, sharegpt_sample, limit=40, top_t=400, max_n=3, depth=6, tree_budget=16)
    stream_path = tmp_path_factory.mktemp("e2e") / "stream.u32"
    tokenize_source(BuildConfig(path=sharegpt_sample, limit=40), tokenizer, stream_path, progress=False)
    yield name, result, np.fromfile(stream_path, dtype=np.uint32)
    from datastore.admin.catalog import drop_datastore
    drop_datastore(database_url, name)


def test_lookups_agree_with_oracle(small_build, database_url, tokenizer):
    name, result, stream = small_build
    kept = {n: dict(top_t(count_ngrams(stream, n), 400)) for n in (1, 2, 3)}
    rng = np.random.default_rng(0)
    starts = rng.integers(0, len(stream) - 8, 60)
    with Datastore.open(name, tokenizer=tokenizer, database_url=database_url) as ds:
        contexts = [s for s in (stream[a:a + int(rng.integers(1, 7))].tolist() for a in starts)
                    if 0xFFFFFFFF not in s]
        batch = ds.lookup_batch(contexts)
        for context, batched in zip(contexts, batch):
            match = ds.lookup(context)
            expected = next((tuple(context[-n:]) for n in (3, 2, 1) if n <= len(context)
                             and tuple(context[-n:]) in kept[n]), None)
            if expected is None:
                assert match is None and batched is None
                continue
            assert match.ngram == expected == batched.ngram
            root, nodes = continuation_tree(stream, expected, 6, 16)
            assert match.tree.root_count == root
            assert list(zip(match.tree.paths(), match.tree.counts.tolist())) == nodes
            assert batched.tree == match.tree


def test_stats_and_registry(small_build, database_url):
    name, result, _ = small_build
    s = datastore_stats(database_url, name)
    assert s["rows"] == result.num_trees == sum(v["rows"] for v in s["per_n"].values())
    assert s["bytes_total"] == result.bytes_on_disk > s["bytes_table"] > 0
    assert set(s["per_n"]) == {"1", "2", "3"}
    assert s["params"]["ns"] == [1, 2, 3] and s["params"]["max_n"] == 3  # what a client probes
    assert set(s["timings"]) == {"tokenize", "screen", "count", "tag", "trees", "encode", "load", "index"}
    screen = s["corpus"]["contamination"]  # the build screened its corpus: a ShareGPT sample holds no evaluation item
    parts = set(screened_texts())  # BFCL's too where its data was fetched on this host
    assert {"spec_bench", "humaneval", "humaneval_solutions"} <= parts
    assert {p: r["contaminated"] for p, r in screen["parts"].items()} == dict.fromkeys(parts, 0)
    assert s["timings"]["tokenize"] > 0 and s["timings"]["index"] > 0
    assert any(d["name"] == name and d["state"] == "ready" for d in list_datastores(database_url))


def test_other_tokenizer_is_refused(small_build, database_url):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    name, _, _ = small_build
    raw = Tokenizer(models.BPE(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator(["a tiny other tokenizer", "trained here"], trainers.BpeTrainer(vocab_size=60))
    other = PreTrainedTokenizerFast(tokenizer_object=raw)
    with pytest.raises(TokenizerMismatch, match="rebuild the datastore"):
        Datastore.open(name, tokenizer=other, database_url=database_url)


def test_unknown_name_lists_ready_ones(database_url, tokenizer, small_build):
    with pytest.raises(DatastoreNotFound, match="no ready datastore named 'nope-missing'"):
        Datastore.open("nope-missing", tokenizer=tokenizer, database_url=database_url)


def test_code_build_end_to_end(database_url, code_sample, tokenizer, ds_name, tmp_path):
    result = _build(database_url, ds_name, code_sample, source="code", top_t=300, max_n=4)
    assert result.report["duplicates"] == 1 and result.report["malformed"] == {"undecodable bytes": 1, "empty text": 1}
    stream_path = tmp_path / "s.u32"
    tokenize_source(BuildConfig(source="code", path=code_sample), tokenizer, stream_path, progress=False)
    stream = np.fromfile(stream_path, dtype=np.uint32)
    context = stream[100:110].tolist()
    with Datastore.open(ds_name, tokenizer=tokenizer, database_url=database_url) as ds:
        match = ds.lookup(context)
    kept = {n: dict(top_t(count_ngrams(stream, n), 300)) for n in range(1, 5)}
    expected = next(tuple(context[-n:]) for n in (4, 3, 2, 1) if tuple(context[-n:]) in kept[n])
    assert match.ngram == expected
    root, nodes = continuation_tree(stream, expected, 10, 64)
    assert list(zip(match.tree.paths(), match.tree.counts.tolist())) == nodes


def test_failed_build_leaves_previous_serving(database_url, sharegpt_sample, tokenizer, ds_name):
    first = _build(database_url, ds_name, sharegpt_sample, limit=10, top_t=50, max_n=2)
    with pytest.raises(RuntimeError, match="boom"), DatastoreWriter.begin(
            database_url, ds_name, tokenizer="x", tokenizer_fingerprint="0" * 64, key_width=2, corpus={},
            params={"max_n": 2}) as w:
        w.write([b"\x00\x01"], [b"junk"])
        raise RuntimeError("boom")
    states = {d["id"]: d["state"] for d in list_datastores(database_url, include_all=True) if d["name"] == ds_name}
    assert states[first.build_id] == "ready" and sorted(states.values()) == ["failed", "ready"]
    with Datastore.open(ds_name, tokenizer=tokenizer, database_url=database_url) as ds:
        assert ds.info.id == first.build_id
        assert ds.lookup([tokenizer.convert_tokens_to_ids("<|im_start|>")]) is not None


def test_concurrent_build_of_same_name_is_refused(database_url, ds_name):
    kw: dict[str, Any] = dict(tokenizer="x", tokenizer_fingerprint="0" * 64, key_width=2, corpus={}, params={})
    with DatastoreWriter.begin(database_url, ds_name, **kw), pytest.raises(BuildConflict, match="one build per name"):
        DatastoreWriter.begin(database_url, ds_name, **kw)


def _value(cur: psycopg.Cursor) -> Any:
    """The single value of a query that always returns one row."""
    row = cur.fetchone()
    assert row is not None
    return row[0]


@pytest.mark.slow
def test_killed_build_is_invisible_and_cleaned(database_url, sharegpt_sample, tokenizer, ds_name):
    first = _build(database_url, ds_name, sharegpt_sample, limit=10, top_t=50, max_n=2)
    env = dict(os.environ, DATABASE_URL=database_url)
    proc = subprocess.Popen([sys.executable, "-m", "ingest", "build", "--name", ds_name, "--path", str(sharegpt_sample),
                             "--top-t", "20K", "--quiet"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    with psycopg.connect(database_url, autocommit=True) as conn:
        while time.time() < deadline:  # wait until the new build has loaded rows, then kill it mid-build
            row = conn.execute("SELECT trees_table FROM datastores WHERE name = %s AND state = 'building'",
                               [ds_name]).fetchone()
            if row and _value(conn.execute("SELECT to_regclass(%s) IS NOT NULL", [row[0]])) and \
                    _value(conn.execute(f'SELECT count(*) FROM "{row[0]}"')) > 0:
                break
            assert proc.poll() is None, "the build ended before it could be interrupted"
            time.sleep(0.05)
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert workers, "the build should be running tree workers by now"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # a SIGKILLed build runs no cleanup: its workers must notice and exit on their own
        gone, alive = psutil.wait_procs(workers, timeout=15)
        assert not alive, f"orphaned workers still running: {[p.pid for p in alive]}"
        with Datastore.open(ds_name, tokenizer=tokenizer, database_url=database_url) as ds:
            assert ds.info.id == first.build_id
        assert row is not None
        stale_table = row[0]
        second = _build(database_url, ds_name, sharegpt_sample, limit=10, top_t=60, max_n=2)
        states = {d["id"]: d["state"] for d in list_datastores(database_url, include_all=True) if d["name"] == ds_name}
        assert states[second.build_id] == "ready" and states[first.build_id] == "retired"
        assert "failed" in states.values()
        assert not _value(conn.execute("SELECT to_regclass(%s) IS NOT NULL", [stale_table]))


