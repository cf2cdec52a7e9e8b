"""The storage study: grid datastores cut from one build equal direct builds; the CLI end to end."""

from __future__ import annotations

import csv
import uuid
from typing import cast

import numpy as np
import pytest
from psycopg import sql

from datastore.admin.catalog import DatastoreNotFound, datastore_stats, drop_datastore, list_datastores
from datastore.codec import decode_tree
from datastore.connection import connect
from ingest.build import BuildConfig, build_datastore, tokenize_corpus
from ingest.counting import count_top_t
from ingest.tokens import open_stream
from toolkit.tokenizer import DEFAULT_MODEL


def _rows(url: str, name: str) -> dict[bytes, bytes]:
    table = datastore_stats(url, name)["table"]
    with connect(url) as conn:
        return {bytes(k): bytes(t) for k, t in conn.execute(
            sql.SQL("SELECT key, tree FROM {}").format(sql.Identifier(table))).fetchall()}


@pytest.fixture
def prefix(database_url):
    """A unique datastore-name prefix; every datastore under it is dropped afterwards."""
    p = f"test-{uuid.uuid4().hex[:8]}"
    yield p
    for row in list_datastores(database_url, include_all=True):
        if row["name"].startswith(p):
            try:
                drop_datastore(database_url, row["name"])
            except DatastoreNotFound:
                pass


def test_grid_points_equal_direct_builds(database_url, sharegpt_sample, tokenizer, tmp_path, prefix):
    from research.study.corpus import StudyCorpus
    from research.study.crest import CrestPoint, full_build, materialize

    tok = tokenize_corpus(BuildConfig(path=sharegpt_sample, limit=60), tokenizer, tmp_path / "tokens.u32",
                          progress=False)
    corpus = StudyCorpus("sharegpt", tmp_path, tok, 0.0, len(tokenizer))
    full = full_build(corpus, 300, 3, url=database_url, tokenizer=tokenizer, tokenizer_spec=DEFAULT_MODEL,
                      prefix=prefix, progress=False)
    assert full.seconds > 0
    again = full_build(corpus, 200, 3, url=database_url, tokenizer=tokenizer, tokenizer_spec=DEFAULT_MODEL,
                       prefix=prefix, progress=False)
    assert again.seconds == 0 and again.table == full.table  # reused: it covers top-t 200

    # the cached ranking, sliced, is exactly what counting at the smaller top-t returns
    stream = open_stream(tok.path)
    for n in (1, 2, 3):
        direct = count_top_t(stream, n, 100)
        cached = full.ranking.load(n, 100, 1)
        assert cached is not None
        assert np.array_equal(cached.ngrams, direct.ngrams) and np.array_equal(cached.counts, direct.counts)

    # a combined point copied out of the full build holds the same rows as a build at that top-t
    direct_name = f"{prefix}-direct"
    build_datastore(BuildConfig(name=direct_name, top_t=100, max_n=3, database_url=database_url), progress=False,
                    corpus=tok)
    point_name = f"{prefix}-point"
    fingerprint = datastore_stats(database_url, direct_name)["tokenizer_fingerprint"]
    made = materialize(full, CrestPoint((1, 2, 3), 100), point_name, url=database_url, tokenizer_spec=DEFAULT_MODEL,
                       fingerprint=fingerprint)
    assert _rows(database_url, point_name) == _rows(database_url, direct_name)
    stats = datastore_stats(database_url, point_name)
    assert made.bytes == stats["bytes_total"] and made.ngrams == stats["rows"]

    # a single-n point: the top-t 2-grams only, and its mean tree size is that of its stored trees
    made = materialize(full, CrestPoint((2,), 40), point_name, url=database_url, tokenizer_spec=DEFAULT_MODEL,
                       fingerprint=fingerprint)
    rows = _rows(database_url, point_name)
    width = full.key_width
    assert len(rows) == made.ngrams == 40 and all(len(k) == 2 * width for k in rows)
    sizes = [len(decode_tree(blob)) for blob in rows.values()]
    assert made.per_n[2][1] == pytest.approx(np.mean(sizes))


@pytest.mark.slow
def test_study_cli_end_to_end(database_url, tmp_path, prefix, tokenizer):
    """The study on a tiny grid and small corpora: CSV rows and PNGs from real runs, values reproducible."""
    from benchmarks.peer_drafters import RetrievalDrafter
    from benchmarks.rest_index import SuffixIndex
    from drafting import DatastoreSource
    from evaluation.prompts import MT_BENCH, load_prompts
    from research.hf_bench.store import reference_store
    from research.study.cli import main
    from research.study.runner import replay_accept_length

    out = tmp_path / "out"
    argv = ["storage", "--corpus", "sharegpt", "code", "--corpus-limit", "150", "--limit", "1",
            "--max-new-tokens", "12", "--top-t", "50", "200", "--single-top-t", "50", "--single-n", "1", "2",
            "--combined-m", "3", "--rest-fractions", "50%", "100%", "--workdir", str(tmp_path / "work"),
            "--out", str(out), "--name-prefix", prefix, "--database-url", database_url, "--quiet"]
    assert main(argv) == 0
    refs_by_set = {}
    for eval_set, categories in (("spec_bench", MT_BENCH), ("humaneval", None)):
        prompts = load_prompts(eval_set, tokenizer, limit=1, categories=categories)
        store = reference_store(DEFAULT_MODEL, "float32", eval_set, 12)
        saved = [store.get(p.id, p.token_ids) for p in prompts]
        assert all(r is not None for r in saved)  # the study saved every reference
        refs_by_set[eval_set] = (prompts, cast(list[list[int]], saved))
    for corpus, eval_set in (("sharegpt", "spec_bench"), ("code", "humaneval")):
        prompts, refs = refs_by_set[eval_set]
        committed = sum(len(r) - 1 for r in refs)  # every method commits the same tokens after the prefill
        with open(out / f"study_storage_{corpus}.csv") as fh:
            rows = list(csv.DictReader(fh))
        methods = [r["method"] for r in rows]
        assert methods.count("rest") == 2 and methods.count("crest-combined") == 2
        assert methods.count("merged") == 2 and methods.count("trie") == 1
        assert 2 <= methods.count("crest-single") <= 2  # n=1 and n=2 at t=50
        for r in rows:
            assert int(r["prompts"]) == len(prompts) and 0 < int(r["steps"]) <= committed
            assert float(r["accept_length"]) * int(r["steps"]) == pytest.approx(committed, abs=0.01)
            if r["method"] != "trie":
                assert int(r["bytes"]) > 0
        rest = [r for r in rows if r["method"] == "rest"]
        assert all(int(r["bytes"]) == 6 * int(r["corpus_tokens"]) for r in rest)  # 16-bit ids + 32-bit suffixes
        assert int(rest[0]["corpus_tokens"]) < int(rest[1]["corpus_tokens"])
        combined = [r for r in rows if r["method"] == "crest-combined"]
        assert int(combined[0]["bytes"]) < int(combined[1]["bytes"])
        for png in (f"study_storage_{corpus}.png", f"study_tree_sizes_{corpus}.png"):
            assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with open(out / f"study_tree_sizes_{corpus}.csv") as fh:
            assert {int(r["n"]) for r in csv.DictReader(fh)} == {1, 2, 3}

    # the REST row is reproduced by replaying its saved index directly
    eval_prompts, refs = refs_by_set["spec_bench"]
    folder = next((tmp_path / "work").glob("sharegpt-*")) / "rest" / f"{1.0:.6f}"
    index = SuffixIndex.load(folder)
    drafter = RetrievalDrafter(DatastoreSource(lambda: index), name="rest", vocab_size=len(tokenizer))
    replayed = replay_accept_length(drafter, eval_prompts, refs, 64)
    with open(out / "study_storage_sharegpt.csv") as fh:
        full_rest = [row for row in csv.DictReader(fh) if row["method"] == "rest" and float(row["fraction"]) == 1.0][0]
    assert int(full_rest["steps"]) == replayed.steps
    assert float(full_rest["accept_length"]) == pytest.approx(replayed.accept_length, abs=1e-4)
    assert float(full_rest["mean_tree_nodes"]) == pytest.approx(replayed.mean_drafted, abs=1e-2)
    names = {r["name"] for r in list_datastores(database_url)}
    assert f"{prefix}-sharegpt-full" in names and f"{prefix}-sharegpt-point" not in names


def test_verdicts_compare_at_equal_bytes():
    from research.study.runner import StudyRow
    from research.study.summary import assess, best_within, interpolate

    def row(method, size, acc, n=0):
        return StudyRow("c", "e", method, n, 0, 0.0, 0, 0, size, acc, 1, 1, 0.0, 0.0, 0.0)

    rows = [row("rest", 100, 1.2), row("rest", 1000, 1.5), row("crest-single", 5, 1.4, 1),
            row("crest-combined", 50, 1.6, 5), row("merged", 50, 2.0, 5)]
    assert best_within([(5, 1.4), (50, 1.6)], 40) == 1.4 and best_within([(5, 1.4)], 4) is None
    assert interpolate([(100, 1.2), (1000, 1.5)], 316) == pytest.approx(1.35, abs=1e-3)
    assert interpolate([(100, 1.2), (1000, 1.5)], 50) is None
    reach, equal, merged = assess(rows)
    assert reach.met and "20.0x less" in reach.figure          # REST's best 1.5 at 1000 B; CREST 1.6 at 50 B
    assert not equal.met and "min 1.07" in equal.figure        # at 1000 B: 1.6 / 1.5
    assert merged.met
    assert not assess(rows + [row("merged", 1000, 1.4, 5), row("crest-combined", 1000, 1.7, 5)])[2].met
