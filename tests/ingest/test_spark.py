"""``--engine spark`` against the single-node build on real samples: identical rows, blob for blob, identical
per-n statistics and source reports; a killed Spark build leaves the previous build serving. Runs Spark
``local[2]`` on the real tokenizer and the real Postgres; skips (with the reason) where pyspark or Java 17+
is missing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

import numpy as np
import psycopg
import pytest

from datastore.admin.catalog import drop_datastore
from datastore.client import Datastore
from datastore.keys import decode_key
from ingest.build import BuildConfig, build_datastore, tokenize_source
from ingest.counting import count_top_t
from ingest.spark import spark_problem
from ingest.spark.kernels import count_candidates, count_histogram, merge_counts, partial_counts
from ingest.spark.selection import select, thresholds
from support import REPO

pytestmark = pytest.mark.skipif(spark_problem() is not None, reason=f"--engine spark unavailable: {spark_problem()}")

SPARK = "local[2]"


def _rows(url: str, build_id: int) -> list[tuple[bytes, bytes]]:
    with psycopg.connect(url) as conn:
        return conn.execute(f"SELECT key, tree FROM token_trees_{int(build_id)} ORDER BY key").fetchall()


def _both(url: str, **params):
    """Build the same corpus with both engines; returns both results (their datastores dropped afterwards)."""
    tag = uuid.uuid4().hex[:8]
    results: dict[str, Any] = {}
    try:
        for engine in ("duckdb", "spark"):
            config = BuildConfig(name=f"test-eq-{engine}-{tag}", engine=engine, spark_master=SPARK, database_url=url,
                                 **params)
            results[engine] = build_datastore(config, progress=False)
            results[engine + "_rows"] = _rows(url, results[engine].build_id)
    finally:
        for engine in ("duckdb", "spark"):
            if engine in results:
                drop_datastore(url, results[engine].name)
    return results


def _assert_identical(r: dict) -> None:
    duck, spark = r["duckdb"], r["spark"]
    assert len(r["duckdb_rows"]) == duck.num_trees > 0
    assert [k for k, _ in r["spark_rows"]] == [k for k, _ in r["duckdb_rows"]]  # same keys
    assert r["spark_rows"] == r["duckdb_rows"]  # same blobs
    assert spark.ngram_stats == duck.ngram_stats
    assert (spark.num_documents, spark.num_tokens) == (duck.num_documents, duck.num_tokens)
    # what the Spark engine does not record (docs/building.md, "Contamination screen"): its builds are refused for
    # scoring
    local_only = {"digest", "packages", "contamination"}
    assert {k: v for k, v in spark.report.items() if k not in local_only} == \
        {k: v for k, v in duck.report.items() if k not in local_only}
    assert "contamination" in duck.report and "contamination" not in spark.report


@pytest.fixture(scope="module")
def sharegpt_with_faults(sharegpt_sample, tmp_path_factory):
    """The real, cut-off ShareGPT sample with malformed records put in front: an unknown role, a missing
    field, a record that is not an object, a wrong type."""
    bad = [{"id": "x1", "conversations": [{"from": "alien", "value": "hi"}]}, {"id": "x2"}, 7,
           {"id": "x3", "conversations": [{"from": "human", "value": 5}]}]
    raw = sharegpt_sample.read_bytes()
    assert raw.startswith(b"[")
    path = tmp_path_factory.mktemp("spark") / "faults.json"
    path.write_bytes(b"[" + ", ".join(json.dumps(r) for r in bad).encode() + b"," + raw[1:])
    return path


@pytest.mark.slow  # a whole Spark build, over a minute on two cores
def test_sharegpt_build_is_identical(database_url, sharegpt_with_faults):
    # small buckets (max_occurrences) so that both engines split every n into several tree partitions
    r = _both(database_url, path=sharegpt_with_faults, top_t=2000, max_n=4, max_occurrences=30_000)
    _assert_identical(r)
    report = r["spark"].report
    for reason in ("unknown role", "missing field: conversations", "record is not an object", "wrong type: from/value"):
        assert report["malformed"][reason] == 1, report["malformed"]
    assert any("cut off" in note for note in report["notes"])  # the partial last record is reported, not fatal


@pytest.mark.slow  # a whole Spark build, over a minute on two cores
def test_code_build_is_identical(database_url, code_sample):
    r = _both(database_url, source="code", path=(code_sample,), top_t=500, max_n=5, depth=8, tree_budget=32)
    _assert_identical(r)
    assert r["spark"].report["duplicates"] == 1  # the sample's copy of decoder.py
    assert r["spark"].report["malformed"] == {"undecodable bytes": 1, "empty text": 1}


@pytest.mark.slow  # a whole Spark build, over a minute on two cores
def test_jsonl_limit_keeps_the_same_documents(database_url, code_sample, tmp_path):
    """--limit keeps the first N documents in file order on both engines, after dropping malformed and
    duplicate records, and both report only what was read up to there."""
    texts = [p.read_text() for p in sorted(code_sample.glob("*.py")) if p.name not in ("latin1.py", "empty.py")]
    folder = tmp_path / "jsonl"
    folder.mkdir()
    (folder / "a.jsonl").write_text("\n".join([json.dumps({"content": texts[0]}), "{not json", "",
                                               json.dumps({"content": texts[0]}), json.dumps({"text": "x"}),
                                               *[json.dumps({"content": t}) for t in texts[1:4]]]) + "\n")
    (folder / "b.jsonl").write_text("\n".join(json.dumps({"content": t}) for t in texts[4:]) + "\n")
    r = _both(database_url, source="jsonl", path=folder, limit=5, top_t=300, max_n=3)
    _assert_identical(r)
    assert r["spark"].num_documents == 5
    assert r["spark"].report["malformed"] == {"invalid JSON": 1, "missing field: content": 1}
    assert r["spark"].report["duplicates"] == 2  # the repeated first line, and the sample's copy of decoder.py


def test_count_kernels_and_selection_match_duckdb(tokenizer, sharegpt_sample, tmp_path):
    """The Spark count kernels (two partitions, three reducers) and the driver's selection, against DuckDB's
    count_top_t on the same stream, at top-t values that cut through ties."""
    import pyarrow as pa

    stream_path = tmp_path / "stream.u32"
    tokenize_source(BuildConfig(path=sharegpt_sample, limit=30), tokenizer, stream_path, progress=False)
    stream = np.fromfile(stream_path, dtype=np.uint32)
    docs = [d[:-1].astype(np.int32) for d in np.split(stream, np.flatnonzero(stream == 0xFFFFFFFF) + 1)[:-1]]
    halves = [pa.RecordBatch.from_arrays([pa.array(part, pa.list_(pa.int32()))], names=["ids"])
              for part in (docs[:13], docs[13:])]
    groups: dict[tuple[int, int], list] = {}
    for half in halves:
        for row in partial_counts(iter([half]), max_n=3, reducers=3):
            groups.setdefault((row.column("n")[0].as_py(), row.column("reducer")[0].as_py()), []).append(row)
    merged = [merge_counts(pa.Table.from_batches(rows)) for rows in groups.values()]
    hist: dict[tuple[int, int], int] = {}
    for table in merged:
        for batch in count_histogram(iter(table.to_batches())):
            for n, c, k in zip(*(batch.column(i).to_pylist() for i in range(3))):
                hist[(n, c)] = hist.get((n, c), 0) + k
    for n in (1, 2, 3):
        ranking = count_top_t(stream, n, 10**9)
        ties = np.flatnonzero(ranking.counts[1:] == ranking.counts[:-1]) + 1  # a top-t here splits equal counts
        for top_t in (int(ties[len(ties) // 10]), int(ties[len(ties) // 2])):
            stats = thresholds([(m, c, k) for (m, c), k in hist.items()], top_t, 1)
            threshold = stats[n].threshold
            assert threshold is not None
            rows = [b for t in merged for b in count_candidates(iter(t.to_batches()), {n: threshold})]
            ngrams = np.concatenate([np.frombuffer(b.column("ngrams")[0].as_py(), dtype=np.uint32) for b in rows])
            counts = np.concatenate([np.frombuffer(b.column("counts")[0].as_py(), dtype=np.int64) for b in rows])
            got = select(n, ngrams, counts, stats[n], top_t)
            want = count_top_t(stream, n, top_t)
            assert len(counts) > top_t  # the candidates include ties beyond the cut
            assert np.array_equal(got.ngrams, want.ngrams) and np.array_equal(got.counts, want.counts)
            assert (got.distinct, got.occurrences, got.eligible) == (want.distinct, want.occurrences, want.eligible)


def _first_key(url: str, build_id: int) -> bytes:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT key FROM token_trees_{int(build_id)} LIMIT 1").fetchone()
        assert row is not None
        return row[0]


def _state(url: str, name: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [s for (s,) in conn.execute("SELECT state FROM datastores WHERE name = %s ORDER BY id", [name])]


@pytest.mark.slow  # a whole Spark build, over a minute on two cores
def test_killed_spark_build_leaves_previous_build_serving(database_url, sharegpt_sample, tokenizer, tmp_path):
    name = f"test-spark-kill-{uuid.uuid4().hex[:8]}"
    common = ["--name", name, "--path", str(sharegpt_sample), "--limit", "60", "--max-n", "3", "--quiet"]
    env = dict(os.environ, DATABASE_URL=database_url)
    try:
        first = build_datastore(BuildConfig(name=name, path=sharegpt_sample, limit=60, top_t=300, max_n=3,
                                            database_url=database_url), progress=False)
        proc = subprocess.Popen([sys.executable, "-m", "ingest", "build", "--engine", "spark", "--spark-master", SPARK,
                                 "--top-t", "400", *common], cwd=REPO, env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        deadline = time.monotonic() + 300
        while "building" not in _state(database_url, name):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the Spark build never started writing"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and the Python workers
        proc.wait(timeout=60)
        assert _state(database_url, name).count("ready") == 1
        with Datastore.open(name, tokenizer=tokenizer, database_url=database_url) as ds:
            assert ds.info.id == first.build_id  # the previous build still serves
            assert ds.lookup(list(decode_key(_first_key(database_url, first.build_id), ds.info.key_width))) is not None
        # the next build retires the killed one and takes over
        done = subprocess.run([sys.executable, "-m", "ingest", "build", "--engine", "spark", "--spark-master", SPARK,
                               "--top-t", "400", *common], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr
        assert done.stderr == "", done.stderr  # a clean run prints no warnings
        states = _state(database_url, name)
        assert states[-1] == "ready" and "building" not in states and states.count("ready") == 1
    finally:
        drop_datastore(database_url, name)


@pytest.mark.slow  # a whole Spark build, over a minute on two cores
def test_chat_build_is_identical(database_url, sharegpt_sample, tmp_path):
    """--source chat on both engines: gzip and cut-off zstd JSON Lines, Parquet, a cut-off ShareGPT array; the same
    rows, malformed records and skipped turns by reason, duplicates and notes."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    folder = tmp_path / "chat"
    (folder / "day2").mkdir(parents=True)
    chats = [[{"role": "system", "content": "You are terse."}, {"role": "user", "content": f"Count to {i}, please."},
              {"role": "assistant", "content": " ".join(str(k) for k in range(1, i + 1))}] for i in range(2, 40)]
    tool = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": None, "tool_calls": [{}]},
            {"role": "tool", "content": "4"}, {"role": "assistant", "content": "It is 4 degrees."},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    lines = [json.dumps({"messages": c}) for c in chats[:20]] + [
        "{not json", json.dumps({"id": 1}), json.dumps({"messages": [{"role": "robot", "content": "x"}]}),
        json.dumps({"messages": tool}), json.dumps({"messages": chats[0]})]
    (folder / "a.jsonl.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    packed = zstandard.ZstdCompressor().compress(
        "".join(json.dumps({"messages": c}) + "\n" for c in chats[20:] * 200).encode())
    (folder / "day2" / "b.jsonl.zst").write_bytes(packed[: len(packed) - 10])  # cut off: a note
    turn = pa.struct([("role", pa.string()), ("content", pa.string())])
    pq.write_table(pa.table({"messages": pa.array([*chats[5:15], None], pa.list_(turn))}),
                   folder / "day2" / "c.parquet")
    (folder / "d.json").write_bytes(sharegpt_sample.read_bytes()[:400_000])  # a cut-off ShareGPT array
    r = _both(database_url, source="chat", path=(folder,), top_t=300, max_n=3)
    _assert_identical(r)
    report = r["spark"].report
    assert report["malformed"]["invalid JSON"] == 1 and report["malformed"]["unknown role"] == 1
    assert report["malformed"]["missing field: messages"] == 2  # the record without it, the null Parquet row
    assert report["malformed"]["tool turn skipped"] == 1 and report["malformed"]["tool_calls turn skipped"] == 1
    assert report["malformed"]["non-text content skipped"] == 1
    assert report["duplicates"] > 10
    assert len(report["notes"]) == 2 and any("zstd file is cut off" in n for n in report["notes"])


def test_spark_refuses_compressed_jsonl_and_sharegpt_naming_the_fix(tmp_path):
    """Spark's own readers read these sources; a compressed file is refused (before any session is used) with the
    engine that reads it."""
    import gzip

    from ingest.errors import SourceError
    from ingest.spark.sources import read_records

    (tmp_path / "a.jsonl").write_text('{"content": "x"}\n')
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(b'{"content": "y"}\n'))
    with pytest.raises(SourceError, match=r"b\.jsonl\.gz is compressed: use --engine duckdb"):
        read_records(None, "jsonl", (tmp_path,), glob="", text_field="content", partitions=1)
    (tmp_path / "s.json.gz").write_bytes(gzip.compress(b"[]"))
    with pytest.raises(SourceError, match="use --engine duckdb or --source chat"):
        read_records(None, "sharegpt", (tmp_path / "s.json.gz",), glob="", text_field="content", partitions=1)
