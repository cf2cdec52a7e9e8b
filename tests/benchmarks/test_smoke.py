"""Every benchmark script (``benchmarks/*.py``) run end to end as a user runs it (``python benchmarks/NAME.py ...``,
``DATABASE_URL`` the session's database), on tiny inputs: the session's small ShareGPT datastore, a few saved
references, one or two prompts, a second or two of load. So no benchmark rots after an API change unnoticed: each test
checks the exit code and the figures the script printed or wrote. What a script measures is not checked here (speed and
memory are the scripts' own business: docs/contributing.md).

The scripts that replay saved greedy references (``--references DIR``, ``benchmarks/_refs.py``) read the module's
:func:`references`: real plain-greedy outputs of the target, short ones. The ones that start a vLLM engine are slow and
run on the engine worker (tests/conftest.py); Spark, SGLang and arctic-inference are skipped, with the reason, where
they are missing."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from sglang_ngram import available as sglang_missing

from datastore.admin.catalog import drop_datastore, empty_live_layer, list_datastores
from datastore.errors import DatastoreNotFound
from ingest.spark import spark_problem
from support import REPO

BENCHMARKS = sorted(p.stem for p in (REPO / "benchmarks").glob("*.py") if not p.stem.startswith("_"))
REF_TOKENS = 24  # new tokens of each saved reference here (the scripts' provenance says 128: these are its prefixes)
NO_VLLM = "vLLM is not installed: `bash scripts/setup-vllm.sh` (the `vllm` extra)"
NO_ARCTIC = "arctic-inference is not installed: `bash scripts/setup-vllm.sh --arctic`"
ARCTIC = importlib.util.find_spec("arctic_inference") is not None


def engine(test):
    """A test that starts a vLLM engine: slow, on the engine worker (one engine at a time: tests/conftest.py), skipped
    without vLLM."""
    for mark in (pytest.mark.slow, pytest.mark.xdist_group("engine"),
                 pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM)):
        test = mark(test)
    return test


def _run(script: str, *args: object, url: str, env: dict | None = None, timeout: float = 600) -> str:
    """``python benchmarks/SCRIPT.py ARGS`` in the repository's root with ``DATABASE_URL=url`` (every script, so that
    none ever falls back to the embedded server) and ``env``; asserts it exits 0 and returns what it printed (stdout,
    then stderr)."""
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / f"{script}.py"), *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "DATABASE_URL": url, **(env or {})})
    assert proc.returncode == 0, f"{script} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout + proc.stderr


def _lines(text: str, pattern: str) -> list[re.Match]:
    """Every line of ``text`` that matches ``pattern`` (from its start)."""
    return [m for line in text.splitlines() if (m := re.match(pattern, line))]


def _names(url: str) -> set[str]:
    return {r["name"] for r in list_datastores(url, include_all=True)}


def _drop(url: str, *names: str) -> None:
    """Drop datastores ``names`` and empty their live layers (outputs and ``<name>.live``), where they exist."""
    for name in names:
        empty_live_layer(url, name, wait_s=120)
        try:
            drop_datastore(url, name)
        except DatastoreNotFound:
            pass


# -- what the scripts replay ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def references(target, tokenizer, tmp_path_factory) -> Path:
    """A ``--references`` folder as ``benchmarks/references.py`` writes it (``<set>.jsonl``, under the provenance the
    scripts check: the whole set's prompts, the default model in fp32, 128 new tokens) holding Spec-Bench's first three
    prompts (``writing``: the fit half's first two, the report half's first), HumanEval's first three and the second
    turn of Spec-Bench's first. Each output is the first :data:`REF_TOKENS` tokens of the target's plain-greedy output
    (:func:`decoder.greedy_generate`; greedy, so the prefix of its 128 tokens)."""
    import torch
    from references import _second_turns

    from decoder import greedy_generate
    from evaluation.prompts import load_prompts
    from evaluation.references import expected, write_references

    folder = tmp_path_factory.mktemp("references")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 135M model, one token at a time: faster on one thread than on two contended ones
    try:
        def greedy(prompt: list[int]) -> list[int]:
            return greedy_generate(target, prompt, max_new_tokens=REF_TOKENS).output_ids

        rows = {name: [(p.id, list(p.token_ids), greedy(list(p.token_ids)))
                       for p in load_prompts(name, tokenizer)[:3]] for name in ("spec_bench", "humaneval")}
        (second,) = _second_turns(tokenizer, {pid: out for pid, _, out in rows["spec_bench"][:1]})
        rows["spec_bench_turn2"] = [(second[0], second[2], greedy(second[2]))]
    finally:
        torch.set_num_threads(threads)
    for name, saved in rows.items():
        provenance = expected(name, tokenizer, max_new_tokens=128)
        write_references(folder / f"{name}.jsonl", provenance, saved)
    return folder


@pytest.fixture(scope="module")
def bench_cache(references, tokenizer, tmp_path_factory) -> Path:
    """A ``CREST_CACHE`` of this module's own for the scripts that read references where ``python -m evaluation
    replay`` saves them (:func:`research.hf_bench.replay.reference_store`): the same references of Spec-Bench and HumanEval."""
    from evaluation.references import expected, read_references
    from research.hf_bench.store import reference_store
    from toolkit.tokenizer import DEFAULT_MODEL

    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as env:  # the cache the references are put in, for this fixture only
        env.setenv("CREST_CACHE", str(cache))
        for name in ("spec_bench", "humaneval"):
            store = reference_store(DEFAULT_MODEL, "float32", name, 128)
            for r in read_references(references / f"{name}.jsonl", expected(name, tokenizer, max_new_tokens=128)):
                store.put(r.id, r.prompt, r.output)
    return cache


def test_every_benchmark_has_a_smoke_test():
    """A new script in benchmarks/ gets its smoke test here."""
    here = Path(__file__).read_text()
    assert BENCHMARKS and not [b for b in BENCHMARKS if f"def test_{b}" not in here]


# -- builds and the datastore ---------------------------------------------------------------------------------------


def test_build(database_url, sharegpt_sample):
    name = f"test-bench-{uuid.uuid4().hex[:8]}"
    try:
        out = _run("build", "--name", name, "--top-t", "300", "--limit", "20", "--path", sharegpt_sample,
                   "--max-n", "3", url=database_url)
    finally:
        _drop(database_url, name)
    (m,) = _lines(out, r"documents (\d+); tokens ([\d,]+); n-grams stored ([\d,]+)")
    assert int(m[1]) == 20 and int(m[2].replace(",", "")) > 0 and int(m[3].replace(",", "")) > 0
    assert _lines(out, r"end to end [\d.]+ s .* [\d,]+ tokens/s") and _lines(out, r"peak RSS: largest single process")
    assert len(_lines(out, r"  n=\d: kept [\d,]+ of [\d,]+")) == 3


@pytest.mark.skipif(spark_problem() is not None, reason=f"--engine spark unavailable: {spark_problem()}")
@pytest.mark.slow
def test_spark_build(database_url, sharegpt_sample):
    prefix = f"test-spark-{uuid.uuid4().hex[:8]}"
    try:
        out = _run("spark_build", "--masters", "local[1]", "--path", sharegpt_sample, "--limit", "20", "--top-t",
                   "300", "--name", prefix, url=database_url)
    finally:
        _drop(database_url, f"{prefix}-duckdb", f"{prefix}-spark-local1")
    assert len(_lines(out, r"(duckdb|spark local\[1\]) +wall +[\d.]+ s +[\d,]+ tokens/s")) == 2
    (m,) = _lines(out, r"spark local\[1\]: [\d.]+x the DuckDB wall time; rows ([\d,]+): only DuckDB (\d+), only Spark "
                       r"(\d+), blobs differing (\d+); per-n stats and report identical: (\w+)")
    assert int(m[1].replace(",", "")) > 0 and m.groups()[1:] == ("0", "0", "0", "True")
    assert not {n for n in _names(database_url) if n.startswith(prefix)}  # dropped by the script itself


def test_lookup(database_url, chat_datastore):
    out = _run("lookup", "--name", chat_datastore, "--database-url", database_url, "--lookups", "300",
               url=database_url)
    (m,) = _lines(out, r"bytes per stored n-gram \(table \+ index\): ([\d.]+)")
    assert float(m[1]) > 0
    for what in ("SELECT 1 round trip", "longest-match lookup", "shared client, cache miss",
                 "shared client, cache hit"):
        assert _lines(out, re.escape(what) + r" +\(300\): p50 [\d.]+ ms +p90 [\d.]+ ms +p99 [\d.]+ ms"), what
    assert len(_lines(out, r"replica longest match, (cold|warm) page cache \(300\): p50 [\d.]+ µs")) == 2
    (hit,) = _lines(out, r"replica hit rate ([\d.]+)")
    (pg,) = _lines(out, r"hit rate ([\d.]+), mean matched n")
    assert 0 < float(hit[1]) == float(pg[1])  # the replica answers what Postgres answers


def test_ddl_blocking(database_url):
    name = f"test-ddl-{uuid.uuid4().hex[:8]}"
    try:
        out = _run("ddl_blocking", "--seconds", "1", "--drop-cap", "1", "--name", name, url=database_url)
    finally:
        _drop(database_url, name)
    rows = {m[1]: m for m in _lines(out, r"\| ([^|]+) \| ([\d.]+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| (\d+) \|")}
    assert set(rows) == {"usual (no DDL)", "datastore drop (ours)", "plain DROP TABLE"}
    assert all(int(m[3]) > 0 for m in rows.values()) and rows["usual (no DDL)"][6] == "0"
    assert float(rows["datastore drop (ours)"][2]) < float(rows["plain DROP TABLE"][2])  # ours does not queue
    assert "gave up after its 1 s cap" in out
    assert name not in _names(database_url)


@pytest.mark.slow
def test_load(database_url, tmp_path):
    name = f"test-load-{uuid.uuid4().hex[:8]}"
    try:
        _run("load", "--database-url", database_url, "--clients", "2", "--procs", "1", "--seconds", "2", "--limit",
             "20", "--name", name, "--out", tmp_path / "load.json", url=database_url)
    finally:
        _drop(database_url, name)  # the script leaves it in place
    (row,) = json.loads((tmp_path / "load.json").read_text())
    assert row["clients"] == 2 and row["lookups"] > 0 and row["errors"] == 0 and row["lookup_ms"]["50"] > 0
    assert row["build_id"] > 0 and row["saw_new_build_after_ms"][0] is not None  # the rebuild was swapped in and seen


@pytest.mark.slow
def test_live_layer(database_url, tmp_path):
    name = f"test-live-{uuid.uuid4().hex[:8]}"
    try:
        _run("live_layer", "--name", name, "--outputs", "2", "--every", "0.2", "--main-tokens", "3K", "--sizes", "2K",
             "--json", tmp_path / "live.json", url=database_url)
    finally:
        _drop(database_url, name)
    got = json.loads((tmp_path / "live.json").read_text())
    (fresh,), (cost,) = got["freshness"], got["compaction"]
    assert fresh["outputs"] >= 1 and 0 < fresh["p50_s"] <= fresh["max_s"] and fresh["main"]["tokens"] >= 3000
    assert fresh["compactions_by_A"]["fold"] == 0  # the outputs went to the delta, beside the main build
    assert fresh["drafter_steps"]["replica_steps"] + fresh["drafter_steps"]["round_trip_steps"] > 0
    assert cost["tokens"] >= 2000 and cost["ngrams"] > 0 and cost["bytes_on_disk"] > 0 and cost["peak_rss_mib"] > 0
    assert not {name, f"{name}.live", f"{name}.live.delta"} & _names(database_url)  # removed by the script itself


# -- replaying saved references -------------------------------------------------------------------------------------


def test_calibrate(database_url, chat_datastore, references, tmp_path):
    from drafting import Calibration

    try:
        out = _run("calibrate", "--datastore", chat_datastore, "--code-datastore", chat_datastore, "--references",
                   references, "--out", tmp_path / "calibration.json", "--plot", tmp_path / "calibration.png",
                   "--live-top-t", "1000", url=database_url)
    finally:
        _drop(database_url, "calibfit-a", "calibfit-b")  # the cross-fitted live layers it leaves for inspection
    assert _lines(out, r"fitted on 4 prompts, [\d,]+ nodes")
    cal = Calibration.load(tmp_path / "calibration.json")
    report = cal.meta["report"]
    assert set(report) == {"spec_bench", "humaneval"} and all(r["prompts"] == 1 and r["nodes"] > 0
                                                               for r in report.values())
    assert (tmp_path / "calibration.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_choose_k(database_url, chat_datastore, references):
    out = _run("choose_k", "--k", "2", "4", "--floors", "0.1", "--concurrency", "1", "8", "--datastore",
               chat_datastore, "--code-datastore", chat_datastore, "--references", references, url=database_url)
    rows = _lines(out, r"(spec_bench|humaneval) +c=(\d+) +k=(\d+) .* x([\d.]+) +\(([\d.]+), ([\d.]+)\)")
    assert len(rows) == 2 * 2 * 2 and all(float(m[5]) >= 1 and float(m[4]) > 0 for m in rows)
    best = _lines(out, r"best (spec_bench|humaneval) c=(\d+): k=(\d+), floor=0.1 \(x[\d.]+\)")
    assert {(m[1], m[2]) for m in best} == {(s, c) for s in ("spec_bench", "humaneval") for c in ("1", "8")}


def test_draft_assembly(database_url, chat_datastore, bench_cache):
    out = _run("draft_assembly", "--datastore", chat_datastore, "--database-url", database_url, "--limit", "1",
               url=database_url, env={"CREST_CACHE": str(bench_cache)})
    (trie,) = _lines(out, r"trie build: ([\d.]+) ms per 1,000 prompt tokens \(median over 13 prompts")
    (step,) = _lines(out, r"draft assembly per step over (\d+) steps \(ms\): p50 ([\d.]+)")
    assert float(trie[1]) > 0 and int(step[1]) > 0 and float(step[2]) > 0


def test_hot_cache(database_url, chat_datastore, references):
    out = _run("hot_cache", "--datastore", chat_datastore, "--code-datastore", chat_datastore, "--sample", "5",
               "--references", references, url=database_url)
    sets = _lines(out, r"(spec_bench|humaneval) \(.*; ([\d,]+) steps, \d+% with a stored match\): LRU tree cache hit "
                       r"rate [\d.]+%")
    assert [m[1] for m in sets] == ["spec_bench", "humaneval"] and all(int(m[2]) > 0 for m in sets)
    assert len(_lines(out, r" +hot set of the +[\d,]+ most frequent \(count >= [\d,]+\): would answer")) == 6


def test_outputs_stream(database_url, references):
    out = _run("outputs_stream", "--minutes", "0.02", "--every", "0.3", "--outputs-mb", "0.002", "--budget", "4",
               "--references", references, url=database_url)
    assert _lines(out, r"output index bound 0.002 MiB; 7 references a pass; budget 4")
    reports = _lines(out, r" +[\d.]+ +([\d,]+) +[\d.]+ +([\d,]+) +(\d+) +[\d.]+ +\d+ +([\d.]+)$")
    assert reports and int(reports[-1][1].replace(",", "")) > 0 and int(reports[-1][3]) > 0  # served, evicted
    (end,) = _lines(out, r"([\d,]+) requests, ([\d,]+) tokens in [\d.]+ min; index within 0.002 MiB")
    assert int(end[2].replace(",", "")) > 0


def test_peers(database_url, chat_datastore, references, tmp_path):
    methods = ["merged", "merged-no-index", "local", "datastore", "ngram", *(["suffix"] if ARCTIC else [])]
    out = _run("peers", "--sets", "spec_bench", "humaneval", "--half", "all", "--budgets", "4", "--methods", *methods,
               "--workers", "2", "--datastore", chat_datastore, "--code-datastore", chat_datastore, "--references",
               references, "--out", tmp_path / "peers.json", url=database_url)
    saved = json.loads((tmp_path / "peers.json").read_text())
    assert saved["methods"] == methods and saved["info"]["prompts"] == {"spec_bench": 3, "humaneval": 3}
    pooled = [r for r in saved["rows"] if r["category"] == "all"]
    assert {(r["set"], r["method"], r["form"]) for r in pooled} == {
        (s, m, f) for s in ("spec_bench", "humaneval") for m in methods
        for f in (("chain",) if m == "ngram" else ("tree", "chain"))}
    assert all(r["prompts"] == 3 and r["accept_length"] >= 1 for r in pooled)
    table = _run("peers", "--table", "--out", tmp_path / "peers.json", url=database_url)
    assert table.splitlines()[0].split()[3:3 + len(methods)] == methods and "merged/best peer" in out


def test_proposer_step(database_url, chat_datastore, references):
    out = _run("proposer_step", "--concurrency", "2", "--k", "4", "--datastore", chat_datastore, "--references",
               references, "--flush-mb", "1", url=database_url)
    rows = _lines(out, r"(spec_bench|humaneval) +(\d+) +(\d+) +([\d.]+) +[\d.]+ +[\d.]+ +[\d.]+ +([\d.]+)$")
    assert {(m[1], m[2]) for m in rows} == {(s, "2") for s in ("spec_bench", "humaneval")}
    assert all(int(m[3]) > 0 and float(m[4]) > 0 and float(m[5]) >= 1 for m in rows)


def test_cut_simulation(database_url, chat_datastore, references):
    cuts = ("goodput", "oracle", "0.3")
    out = _run("cut_simulation", "--concurrency", "2", "--k", "4", "--datastore", chat_datastore, "--references",
               references, "--cuts", *cuts, url=database_url)
    rows = _lines(out, r"(spec_bench|humaneval) +(\S+) +([\d.]+) +(\S+) +([\d.]+) +([\d.]+) +([\d.]+)%$")
    assert [(m[1], m[2]) for m in rows] == [(s, c) for s in ("spec_bench", "humaneval") for c in cuts]
    assert all(float(m[3]) > 0 and float(m[5]) >= 1 for m in rows)
    assert all(float(m[7]) == 100.0 for m in rows if m[2] == "oracle" and float(m[6]) > 0)  # only accepted tokens


@pytest.mark.slow
def test_replica_memory(database_url, chat_datastore, references):
    out = _run("replica_memory", "--processes", "2", "--datastores", "sharegpt", "--datastore", chat_datastore,
               "--batch", "2", "--references", references, url=database_url)
    assert _lines(out, re.escape(chat_datastore) + r" \(replica [\d,]+ MiB\)")
    rows = _lines(out, r"  (alone|2 at once) +PSS +([\d.]+) \( *([\d.]+)\) +USS +([\d.]+) +RSS +([\d.]+) +steps (\d+)")
    assert [m[1] for m in rows] == ["alone", "2 at once", "2 at once"]
    assert all(float(m[2]) > 0 and float(m[4]) > 0 and int(m[6]) > 0 for m in rows)


def test_ranking_headroom(database_url, chat_datastore, references, tmp_path):
    # a fleet stream as `fleet.py prepare` leaves it: Spec-Bench's saved references, the second a repeat of the first
    saved = [json.loads(line) for line in (references / "spec_bench.jsonl").read_text().splitlines()[1:]]
    stream = [{"id": f"r{i}", "kind": kind, "text": "", "prompt_ids": r["prompt_ids"], "output_ids": r["output_ids"]}
              for i, (r, kind) in enumerate(zip([saved[0], *saved], ("new", "repeat", "new", "new")))]
    (tmp_path / "today.json").write_text(json.dumps({"meta": {}, "stream": stream}))
    out = _run("ranking_headroom", "--datastore", chat_datastore, "--code-datastore", chat_datastore, "--references",
               references, "--fleet", tmp_path, "--fleet-datastore", chat_datastore, "--out",
               tmp_path / "headroom.json", url=database_url)
    report = json.loads((tmp_path / "headroom.json").read_text())
    assert list(report["streams"]) == ["spec_bench", "humaneval", "fleet"]
    assert report["streams"]["fleet"]["report_requests"] == 2  # the odd ones: the repeat and the last
    for name, got in report["streams"].items():
        rows = {r: row["accept_length"]["all"] for r, row in got["rows"].items()}
        assert list(rows) == ["union's best", "shipped", "refit", "refit + history", "boosted", "boosted + tokens"]
        assert all(a >= 1 for a in rows.values()) and rows["union's best"] == max(rows.values()), name
        assert len(_lines(out, rf"{name} \(datastore {re.escape(chat_datastore)}; fitted on \d+ requests")) == 1
        cut = got["cut"]
        assert list(cut) == [*rows, "perfect cut"], name
        # the shipped chain trimmed to what is accepted: every draft token is accepted, so a step commits its draft
        # tokens and the bonus, except a request's last, whose bonus would fall past the output's end
        perfect = cut["perfect cut"]
        past_end = perfect["steps"] * (perfect["drafted_per_step"] - perfect["accept_length"] + 1)
        assert -1e-9 < past_end < got["report_requests"] + 1e-9, name
        assert all(row["tok_s"] > 0 and 0 < row["cut"] <= 1 for row in cut.values()), name
    first = _lines(out, r"first token: the union offers ([\d.]+); the shipped chain's is the target's at ([\d.]+)% of "
                        r"positions, one of them at ([\d.]+)%")
    assert len(first) == 3 and all(float(m[1]) >= 1 and float(m[2]) <= float(m[3]) for m in first)
    repeat = report["streams"]["fleet"]["rows"]["union's best"]["accept_length"]["repeat"]
    assert repeat > report["streams"]["fleet"]["rows"]["union's best"]["accept_length"]["new"]  # its answer is held


def test_replica_gil(database_url, chat_datastore):
    out = _run("replica_gil", "--datastore", chat_datastore, "--alone-s", "0.2", url=database_url)
    written = _lines(out, r"writer: (thread|process); replica ([\d,.]+) MiB written in ([\d.]+) s")
    assert [m[1] for m in written] == ["thread", "process"] and all(float(m[2].replace(",", "")) > 0 for m in written)
    rows = _lines(out, r"  (alone|during the write) +matmuls +([\d,]+) +p50 +([\d.]+) +p99 +([\d.]+) +max +([\d.]+) ms")
    assert [m[1] for m in rows] == ["alone", "during the write"] * 2
    assert all(int(m[2].replace(",", "")) > 0 for m in rows)
    missing = subprocess.run([sys.executable, str(REPO / "benchmarks" / "replica_gil.py"), "--datastore", "no-such"],
                             cwd=REPO, capture_output=True, text=True, timeout=120,
                             env={**os.environ, "DATABASE_URL": database_url})
    assert missing.returncode != 0 and "--datastore no-such: no ready datastore" in missing.stderr


def test_service_step(database_url, chat_datastore, references):
    out = _run("service_step", "--batch", "2", "--budget", "4", "--cache-mb", "1", "--datastore", chat_datastore,
               "--code-datastore", chat_datastore, "--references", references, url=database_url)
    rows = _lines(out, r"(spec_bench|humaneval) +(chain|tree) +(replica|trip) +\d+ +(\d+) +([\d.]+) +[\d.]+ +\d+% "
                       r"+\d+% +([\d.]+) +([0-9a-f]{16})$")
    assert len(rows) == 2 * 2 * 2 and all(int(m[4]) > 0 and float(m[5]) > 0 and float(m[6]) >= 1 for m in rows)
    digests: dict[tuple[str, str], set[str]] = {}
    for m in rows:
        digests.setdefault((m[1], m[2]), set()).add(m[7])
    assert all(len(d) == 1 for d in digests.values())  # the replica drafts bit for bit what the round trip drafts


def test_stream(database_url, chat_datastore, references, tmp_path):
    # not ours+live-own: ours+live with a layer per process, twice the compactions
    methods = ["ours", "ours+live", "ours+auto", *(["suffix", "suffix-2proc"] if ARCTIC else [])]
    try:
        out = _run("stream", "--budgets", "3", "--forms", "chain", "--half", "all", "--window", "2", "--pace", "0.1",
                   "--live-top-t", "1000", "--methods", *methods, "--datastore", chat_datastore, "--code-datastore",
                   chat_datastore, "--references", references, "--out", tmp_path / "stream.json", url=database_url)
    finally:
        _drop(database_url, *(f"stream-{s}{t}" for s in ("chat", "code") for t in ("", "-a", "-b", "-auto")))
    rows = json.loads((tmp_path / "stream.json").read_text())
    assert [(r["stream"], r["method"]) for r in rows] == [(s, m) for s in ("chat", "code") for m in methods]
    assert all(r["accept_length"] >= 1 for r in rows)
    assert len(_lines(out, r"(chat|code) budget 3 chain \S+: [\d.]+ \(by quarter")) == len(rows)
    assert {r["stream"]: r["requests"] for r in rows} == {"chat": 4, "code": 3}  # writing-81 then its second turn
    table = _run("stream", "--table", "--out", tmp_path / "stream.json", url=database_url)
    assert len(_lines(table, r"(chat|code) +3 chain ")) == 2


def test_fleet_refuses_a_run_before_its_prepare(tmp_path):
    """``run``, ``table`` and ``plot`` on a folder ``prepare`` never wrote, or whose file is cut short: one line naming
    the file and the command to run."""
    def refused(step: str, named: str, remedy: str) -> None:
        proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "fleet.py"), step, "--dir", str(tmp_path)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and named in proc.stderr and remedy in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr

    for step, missing in (("run", "today.json"), ("table", "fleet.json"), ("plot", "fleet.json")):
        refused(step, missing, "first")
    (tmp_path / "today.json").write_text('{"stream": [')
    (tmp_path / "fleet.json").write_text('{"meta": {}}')
    refused("run", "today.json is not JSON", "prepare")
    refused("table", "fleet.json holds no 'rows'", "run")


@pytest.mark.slow
def test_fleet(database_url, sharegpt_sample, tmp_path):
    """``prepare`` on a slice of the ShareGPT sample (answers by our own greedy loop, 8 tokens each; the openings and
    their follow-ups), then ``run`` with every method at K = 2 (the live layer's arrivals 0.05 s apart)."""
    name = f"test-fleet-{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "fleet"
    methods = ["ngram", "ours", "ours-unshared", "ours-nolive", "ours-human",
               *(["suffix", "suffix-warm"] if ARCTIC else [])]
    try:
        out = _run("fleet", "prepare", "--engine", "hf", "--path", sharegpt_sample, "--yesterday", "30", "--today",
                   "12", "--distill", "3", "--max-new-tokens", "8", "--top-t", "300", "--dir", folder, "--name", name,
                   url=database_url)
        assert _lines(out, r"yesterday: 30 conversations; today: \d+ openings and [1-9]\d* follow-ups")
        assert _lines(out, f"built {name}-both")
        out = _run("fleet", "run", "--k", "2", "--methods", *methods, "--interval", "0.05", "--dir", folder,
                   "--name", name, url=database_url)
    finally:
        _drop(database_url, f"{name}-human", f"{name}-both")
    saved = json.loads((folder / "fleet.json").read_text())
    assert [(r["method"], r["k"]) for r in saved["rows"]] == [(m, 2) for m in methods]
    assert all(r["accept_length"] >= 1 and len(r["by_quarter"]) == 4 for r in saved["rows"])
    assert sum(saved["meta"]["kinds_scored"].values()) == saved["rows"][0]["requests"] > 0
    assert saved["meta"]["kinds_scored"]["follow-up"] > 0 and saved["meta"]["follow_gap"] == 4
    assert len(_lines(out, r"(ngram|ours[\w-]*|suffix[\w-]*) +[\d.]+$")) == len(methods)
    for r in saved["rows"]:  # which sources held the accepted draft tokens: ours only (the peers record none)
        a = r["sources"]
        assert (a == {}) != r["method"].startswith("ours"), r
        assert not a or all(0 <= a["only"][s] <= a["held"][s] <= 1 for s in a["held"]) and a["held"]["heads"] == 0
        assert r["method"] != "ours-nolive" or a["held"]["live"] == 0
    table = _run("fleet", "table", "--dir", folder, url=database_url)
    assert table.splitlines()[0].startswith("accept length, chain of 8")
    _run("fleet", "plot", "--dir", folder, "--png", tmp_path / "fleet.png", "--window", "2", url=database_url)
    assert (tmp_path / "fleet.png").stat().st_size > 10_000


@pytest.mark.slow
def test_distill_curve(database_url, sharegpt_sample, references, tokenizer, tmp_path):
    """Two sizes of answers in the distill's format (the sample's own first answers, their tokens counted as the
    distill counts them) beside the sample as the human corpus: every datastore built, replayed and dropped."""
    from serving.distill import append_chunk, opening, read_conversations

    lines = []
    for conv in read_conversations([Path(sharegpt_sample)], Counter()):
        first = opening(conv)
        if first is not None and len(conv) > len(first) and conv[len(first)]["role"] == "assistant":
            answer = conv[len(first)]
            lines.append(json.dumps({"messages": [*first, answer], "distilled": {
                "output_tokens": len(tokenizer.encode(answer["content"], add_special_tokens=False))}}))
    answers = tmp_path / "answers.jsonl.zst"
    append_chunk(answers, lines[:12])
    out = _run("distill_curve", "--answers", answers, "--human", sharegpt_sample, "--sizes", "300", "900",
               "--top-t", "2K", "--chain", "4", "--tree", "8", "--references", references, "--name",
               f"test-dcurve-{uuid.uuid4().hex[:8]}", "--out", tmp_path / "curve.json", url=database_url)
    rows = json.loads((tmp_path / "curve.json").read_text())["rows"]
    assert [r["corpus"] for r in rows] == ["human"] + ["distilled", "human+distilled", "human, equal tokens"] * 2
    assert all(0 < r["answer_tokens"] <= size for r, size in zip(rows[1::3], (300, 900)))
    assert all(r["corpus_tokens"] > 0 and r["bytes"] > 0 and r["merged chain 4"] >= 1 and r["datastore tree 8"] >= 1
               for r in rows)
    assert rows[2]["corpus_tokens"] > rows[0]["corpus_tokens"]  # the human corpus and the answers
    assert len(_lines(out, r"(human|distilled)")) >= 7


@pytest.mark.skipif(not ARCTIC, reason=NO_ARCTIC)
def test_peer_memory(database_url, code_sample, tokenizer, bench_cache, tmp_path):
    from ingest.build import BuildConfig, tokenize_corpus

    folder = tmp_path / "sizes" / "code-10pct-s0-test"  # as python -m research.study corpus-size names a tokenized size
    folder.mkdir(parents=True)
    corpus = tokenize_corpus(BuildConfig(source="code", path=code_sample), tokenizer, folder / "tokens.u32",
                             progress=False)
    (folder / "corpus.json").write_text(json.dumps({"num_documents": corpus.num_documents,
                                                    "num_tokens": corpus.num_tokens}))
    _run("peer_memory", "--workdir", tmp_path / "sizes", "--peers", "suffix", "--corpus", "code", "--limit", "1",
         "--out", tmp_path / "peer_memory.json", url=database_url, env={"CREST_CACHE": str(bench_cache)})
    (row,) = json.loads((tmp_path / "peer_memory.json").read_text())
    assert row["peer"] == "suffix" and row["size"] == "10pct" and row["tokens"] == corpus.num_tokens > 0
    assert not row["extrapolated"] and row["load_s"] >= 0 and isinstance(row["bytes"], int)
    assert set(row["accept"]) == {"tree 8", "tree 16", "chain 4", "chain 8"}
    assert all(a >= 0 for a in row["accept"].values()) and row["accept"]["tree 16"] > 0  # HumanEval/3 reuses its prompt


# -- SGLang ---------------------------------------------------------------------------------------------------------


def test_sglang_ngram():
    """The module imports and runs as a script (it has no command line of its own: ``peers.py`` and
    ``peer_memory.py`` drive it), says what is missing, and reads SGLang's (tokens, mask) drafts: a root, a chain of
    two under it and a sibling, then padding."""
    import numpy as np
    from sglang_ngram import to_draft

    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "sglang_ngram.py")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and not proc.stdout, proc.stderr[-2000:]
    missing = sglang_missing()
    assert missing is None or "bash scripts/setup-vllm.sh --sglang" in missing
    tokens = np.array([7, 11, 12, 13, 0, 0], np.int32)
    mask = np.eye(6, dtype=np.uint8)
    mask[1:, 0] = 1
    mask[2, 1] = 1  # 12 under 11; 13 beside 11; the two zeros are padding under the root
    draft = to_draft(tokens, mask)
    assert draft.token_ids.tolist() == [11, 12, 13] and draft.parents.tolist() == [-1, 0, -1]


@pytest.mark.skipif(sglang_missing() is not None, reason=str(sglang_missing()))
def test_sglang_ngram_in_peers(database_url, chat_datastore, references, tmp_path):
    _run("peers", "--sets", "humaneval", "--half", "all", "--budgets", "4", "--methods", "merged", "sglang-bfs",
         "sglang-prob", "--workers", "1", "--datastore", chat_datastore, "--code-datastore", chat_datastore,
         "--references", references, "--out", tmp_path / "peers.json", url=database_url,
         env={"CREST_CACHE": str(tmp_path / "cache")})  # SGLang's module is compiled into the cache
    rows = [r for r in json.loads((tmp_path / "peers.json").read_text())["rows"] if r["category"] == "all"]
    assert {r["method"] for r in rows} == {"merged", "sglang-bfs", "sglang-prob"}
    assert all(r["accept_length"] >= 1 for r in rows)


# -- vLLM -----------------------------------------------------------------------------------------------------------


def test_gpu_projection(database_url, tmp_path):
    """On a run as ``vllm_serving.py`` writes it (its ``runs``): each row projected (the real run's projection is in
    :func:`test_vllm_serving`)."""
    from gpu_projection import StepModel, project

    def run(method: str, accepted: int, drafted: int) -> dict:
        return {"method": method, "k": 8, "concurrency": 1, "sets": {"spec_bench": {
            "prompts": ["writing-83", "roleplay-93"], "tokens": 256, "prompt_tokens": 140,
            "counters": {"spec_decode_num_accepted_tokens": accepted, "spec_decode_num_draft_tokens": drafted},
            "propose": {"mean_ms": 0.0 if method == "none" else 0.3}}}}

    saved = {"rows": [], "runs": [run("none", 0, 0), run("crest", 120, 400)], "temperature": 0.0}
    (tmp_path / "run.json").write_text(json.dumps(saved))
    out = _run("gpu_projection", "--run", tmp_path / "run.json", url=database_url)
    assert _lines(out, r"ESTIMATE: vLLM on an H100")
    rows = {m[1]: m for m in _lines(out, r"spec_bench +(none|crest) +1 +([\d.]+) .* ([\d.]+) +- *$")}
    want = {p.method: p for p in project(saved, StepModel())}
    assert set(rows) == {"none", "crest"}
    assert float(rows["crest"][3]) == pytest.approx(want["crest"].speedup_vs_none, abs=0.006) and rows["none"][3] == \
        "1.00"


@engine
def test_references(database_url, target, tokenizer, tmp_path):
    """One engine: the first prompt of each set and its second turn, 8 tokens each, equal to our greedy output."""
    from decoder import greedy_generate
    from evaluation.prompts import load_prompts
    from evaluation.references import expected, read_references

    out = _run("references", "--limit", "1", "--max-new-tokens", "8", "--max-num-seqs", "2", "--enforce-eager",
               "--out-dir", tmp_path,
               url=database_url, timeout=900)
    assert len(_lines(out, r"(spec_bench|humaneval|spec_bench_turn2): 1 prompts, \d+ tokens in \d+ s")) == 3
    for name in ("spec_bench", "humaneval", "spec_bench_turn2"):
        (ref,) = read_references(tmp_path / f"{name}.jsonl", expected(name, tokenizer, max_new_tokens=8))
        assert 1 <= len(ref.output) <= 8
        if name != "spec_bench_turn2":
            prompt = load_prompts(name, tokenizer)[0]
            assert ref.id == prompt.id and ref.output == greedy_generate(target, prompt.token_ids,
                                                                         max_new_tokens=8).output_ids
    again = _run("references", "--limit", "1", "--max-new-tokens", "8", "--out-dir", tmp_path, url=database_url)
    assert not _lines(again, r".*prompts, \d+ tokens in")  # kept: no engine started


@engine
def test_vllm_serving(database_url, chat_datastore, tmp_path):
    """Two engines (vLLM's ``ngram``, then ours; concurrency 1, two Spec-Bench prompts of 8 tokens, with the step
    accounting), then ``gpu_projection.py`` on the result."""
    try:
        out = _run("vllm_serving", "--methods", "ngram", "crest", "--concurrency", "1", "--sets", "spec_bench",
                   "--prompts", "2", "--max-new-tokens", "8", "--enforce-eager", "--accounting", "--out",
                   tmp_path / "vllm_serving.json", "--env", f"CREST_DATASTORE={chat_datastore}", url=database_url,
                   timeout=900)
    finally:
        empty_live_layer(database_url, chat_datastore)  # the outputs the run appended to the session's datastore
    result = json.loads((tmp_path / "vllm_serving.json").read_text())
    assert sorted(r["method"] for r in result["rows"]) == ["crest", "ngram"]
    (row,) = [r for r in result["rows"] if r["method"] == "crest"]
    (run,) = [r for r in result["runs"] if r["method"] == "crest"]
    (peer,) = [r for r in result["runs"] if r["method"] == "ngram"]
    assert peer["sets"]["spec_bench"]["propose"]["p50_ms"] > 0  # a built-in method's proposer, timed
    forwards = run["sets"]["spec_bench"]["accounting"]["forwards"]  # [ms, tokens] each, the prefill first
    assert len(forwards) >= 8 and all(ms > 0 and tokens > 0 for ms, tokens in forwards)
    assert forwards[0][1] > 9  # a prefill (a chat prompt's tokens), where a decode step verifies at most 1 + k
    assert run["compaction_checks"] >= 0 and isinstance(run["compactions"], list)
    assert _lines(out, r"spec_bench +1 crest +\d+ +[\d.]+")  # the accounting's table
    assert row["method"] == "crest" and row["prompts"] == 2 and row["tokens_per_s"] > 0
    assert row["accept_length"] >= 1 and row["proposer_steps"] > 0 and row["propose_p50_ms"] > 0
    assert _lines(out, r"spec_bench +crest +8 +1 +[\d.]+")
    projected = _run("gpu_projection", "--run", tmp_path / "vllm_serving.json", "--max-new-tokens", "8",
                     url=database_url)
    assert _lines(projected, r"spec_bench +crest +1 +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +\d+ +- +-$")
