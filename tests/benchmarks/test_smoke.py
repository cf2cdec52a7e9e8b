"""Every product benchmark (``python -m benchmarks.NAME``) run end to end as a user runs it (``DATABASE_URL`` the
session's database), on tiny inputs: the session's small ShareGPT datastore, a few saved references, one or two
prompts, a second or two of load. So no benchmark rots after an API change unnoticed: each test checks the exit code
and the figures the script printed or wrote. What a script measures is not checked here (speed and memory are the
scripts' own business: docs/contributing.md).

The scripts that replay saved greedy references (``--references DIR``) read the session's ``references`` fixture:
real plain-greedy outputs of the target, short ones. The one that starts a vLLM engine is slow and runs on the engine
worker (tests/conftest.py); Spark, SGLang and arctic-inference are skipped, with the reason, where they are missing."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import uuid

import pytest

from benchmarks.sglang_ngram import available as sglang_missing
from datastore.admin.catalog import empty_live_layer, list_datastores
from ingest.spark import spark_problem
from support import REPO, drop_datastores, printed, run_script

BENCHMARKS = sorted(p.stem for p in (REPO / "benchmarks").glob("*.py")
                    if not p.stem.startswith("_") and "def main(" in p.read_text())
NO_ARCTIC = "arctic-inference is not installed: `bash scripts/setup-vllm.sh --arctic`"
ARCTIC = importlib.util.find_spec("arctic_inference") is not None


def _run(script: str, *args: object, url: str, env: dict | None = None, timeout: float = 600) -> str:
    return run_script(f"benchmarks.{script}", *args, url=url, env=env, timeout=timeout)



def _names(url: str) -> set[str]:
    return {r["name"] for r in list_datastores(url, include_all=True)}


def test_every_benchmark_has_a_smoke_test():
    """A new benchmark in benchmarks/ gets its smoke test here (or, run as a user runs it, in its own module)."""
    here = "".join(p.read_text() for p in (REPO / "tests" / "benchmarks").glob("test_*.py"))
    assert BENCHMARKS and not [b for b in BENCHMARKS if f"def test_{b}" not in here]


def test_build(database_url, sharegpt_sample):
    name = f"test-bench-{uuid.uuid4().hex[:8]}"
    try:
        out = _run("build", "--name", name, "--top-t", "300", "--limit", "20", "--path", sharegpt_sample,
                   "--max-n", "3", url=database_url)
    finally:
        drop_datastores(database_url, name)
    (m,) = printed(out, r"documents (\d+); tokens ([\d,]+); n-grams stored ([\d,]+)")
    assert int(m[1]) == 20 and int(m[2].replace(",", "")) > 0 and int(m[3].replace(",", "")) > 0
    assert printed(out, r"end to end [\d.]+ s .* [\d,]+ tokens/s") and printed(out, r"peak RSS: largest single process")
    assert len(printed(out, r"  n=\d: kept [\d,]+ of [\d,]+")) == 3


@pytest.mark.skipif(spark_problem() is not None, reason=f"--engine spark unavailable: {spark_problem()}")
@pytest.mark.slow
def test_spark_build(database_url, sharegpt_sample):
    prefix = f"test-spark-{uuid.uuid4().hex[:8]}"
    try:
        out = _run("spark_build", "--masters", "local[1]", "--path", sharegpt_sample, "--limit", "20", "--top-t",
                   "300", "--name", prefix, url=database_url)
    finally:
        drop_datastores(database_url, f"{prefix}-duckdb", f"{prefix}-spark-local1")
    assert len(printed(out, r"(duckdb|spark local\[1\]) +wall +[\d.]+ s +[\d,]+ tokens/s")) == 2
    (m,) = printed(out, r"spark local\[1\]: [\d.]+x the DuckDB wall time; rows ([\d,]+): only DuckDB (\d+), only Spark "
                       r"(\d+), blobs differing (\d+); per-n stats and report identical: (\w+)")
    assert int(m[1].replace(",", "")) > 0 and m.groups()[1:] == ("0", "0", "0", "True")
    assert not {n for n in _names(database_url) if n.startswith(prefix)}  # dropped by the script itself


def test_lookup(database_url, chat_datastore):
    out = _run("lookup", "--name", chat_datastore, "--database-url", database_url, "--lookups", "300",
               url=database_url)
    (m,) = printed(out, r"bytes per stored n-gram \(table \+ index\): ([\d.]+)")
    assert float(m[1]) > 0
    for what in ("SELECT 1 round trip", "longest-match lookup", "shared client, cache miss",
                 "shared client, cache hit"):
        assert printed(out, re.escape(what) + r" +\(300\): p50 [\d.]+ ms +p90 [\d.]+ ms +p99 [\d.]+ ms"), what
    assert len(printed(out, r"replica longest match, (cold|warm) page cache \(300\): p50 [\d.]+ µs")) == 2
    (hit,) = printed(out, r"replica hit rate ([\d.]+)")
    (pg,) = printed(out, r"hit rate ([\d.]+), mean matched n")
    assert 0 < float(hit[1]) == float(pg[1])  # the replica answers what Postgres answers


@pytest.mark.slow
def test_load(database_url, tmp_path):
    name = f"test-load-{uuid.uuid4().hex[:8]}"
    try:
        _run("load", "--database-url", database_url, "--clients", "2", "--procs", "1", "--seconds", "2", "--limit",
             "20", "--name", name, "--out", tmp_path / "load.json", url=database_url)
    finally:
        drop_datastores(database_url, name)  # the script leaves it in place
    (row,) = json.loads((tmp_path / "load.json").read_text())
    assert row["clients"] == 2 and row["lookups"] > 0 and row["errors"] == 0 and row["lookup_ms"]["50"] > 0
    assert row["build_id"] > 0 and row["saw_new_build_after_ms"][0] is not None  # the rebuild was swapped in and seen


@pytest.mark.slow
def test_live_layer(database_url, tmp_path):
    name = f"test-live-{uuid.uuid4().hex[:8]}"
    try:
        _run("live_layer", "--name", name, "--outputs", "2", "--every", "0.2", "--main-tokens", "3K", "--sizes", "2K",
             "--out", tmp_path / "live.json", url=database_url)
    finally:
        drop_datastores(database_url, name)
    got = json.loads((tmp_path / "live.json").read_text())
    (fresh,), (cost,) = got["freshness"], got["compaction"]
    assert fresh["outputs"] >= 1 and 0 < fresh["p50_s"] <= fresh["max_s"] and fresh["main"]["tokens"] >= 3000
    assert fresh["compactions_by_A"]["fold"] == 0  # the outputs went to the delta, beside the main build
    assert fresh["drafter_steps"]["replica_steps"] + fresh["drafter_steps"]["round_trip_steps"] > 0
    assert cost["tokens"] >= 2000 and cost["ngrams"] > 0 and cost["bytes_on_disk"] > 0 and cost["peak_rss_mib"] > 0
    assert not {name, f"{name}.live", f"{name}.live.delta"} & _names(database_url)  # removed by the script itself


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
    rows = printed(out, r"(spec_bench|humaneval) +(\d+) +(\d+) +([\d.]+) +[\d.]+ +[\d.]+ +[\d.]+ +([\d.]+)$")
    assert {(m[1], m[2]) for m in rows} == {(s, "2") for s in ("spec_bench", "humaneval")}
    assert all(int(m[3]) > 0 and float(m[4]) > 0 and float(m[5]) >= 1 for m in rows)


def test_head_forward(tmp_path):
    out = _run("head_forward", "--rows", "1", "3", "--calls", "10", "--flush-mb", "1", "--out", tmp_path / "h.json",
               url="")
    rows = printed(out, r"^ +(\d+) +([\d.]+) +[\d.]+ +[\d.]+ +([\d.]+) +[\d.]+ +[\d.]+$")
    assert [m[1] for m in rows] == ["1", "3"] and all(float(m[2]) > 0 and float(m[3]) > 0 for m in rows)
    assert [r["rows"] for r in json.loads((tmp_path / "h.json").read_text())["rows"]] == [1, 3]


@pytest.mark.slow
def test_replica_memory(database_url, chat_datastore, references):
    out = _run("replica_memory", "--processes", "2", "--datastores", "sharegpt", "--datastore", chat_datastore,
               "--batch", "2", "--references", references, url=database_url)
    assert printed(out, re.escape(chat_datastore) + r" \(replica [\d,]+ MiB\)")
    rows = printed(out, r"  (alone|2 at once) +PSS +([\d.]+) \( *([\d.]+)\) +USS +([\d.]+) +RSS +([\d.]+) +steps (\d+)")
    assert [m[1] for m in rows] == ["alone", "2 at once", "2 at once"]
    assert all(float(m[2]) > 0 and float(m[4]) > 0 and int(m[6]) > 0 for m in rows)


def test_service_step(database_url, chat_datastore, references):
    out = _run("service_step", "--batch", "2", "--budget", "4", "--cache-mb", "1", "--datastore", chat_datastore,
               "--code-datastore", chat_datastore, "--references", references, url=database_url)
    rows = printed(out, r"(spec_bench|humaneval) +(chain|tree) +(replica|trip) +\d+ +(\d+) +([\d.]+) +[\d.]+ +\d+% "
                       r"+\d+% +([\d.]+) +([0-9a-f]{16})$")
    assert len(rows) == 2 * 2 * 2 and all(int(m[4]) > 0 and float(m[5]) > 0 and float(m[6]) >= 1 for m in rows)
    digests: dict[tuple[str, str], set[str]] = {}
    for m in rows:
        digests.setdefault((m[1], m[2]), set()).add(m[7])
    assert all(len(d) == 1 for d in digests.values())  # the replica drafts bit for bit what the round trip drafts


def test_online_fit(database_url, chat_datastore, references, tmp_path):
    out = _run("online_fit", "--sets", "spec_bench", "humaneval", "--window", "1", "--budget", "4", "--datastore",
               chat_datastore, "--code-datastore", chat_datastore, "--references", references, "--out",
               tmp_path / "online.json", url=database_url)
    saved = json.loads((tmp_path / "online.json").read_text())
    assert [(r["set"], r["variant"]) for r in saved["stream"]] == [
        (s, v) for s in ("spec_bench", "humaneval") for v in ("frozen", "online", "flat", "flat-warmed")]
    assert all(r["requests"] == 1 and r["accept"] >= 1 and r["windows"] for r in saved["stream"])
    learnt = {(r["set"], r["variant"]): r["verdicts"] for r in saved["stream"]}
    assert all(learnt[s, "frozen"] == 0 < learnt[s, "online"] for s in ("spec_bench", "humaneval"))
    assert learnt["spec_bench", "flat-warmed"] > learnt["spec_bench", "flat"]  # it adopted the other half's verdicts
    assert printed(out, r"spec_bench +flat-warmed +[\d.]+ +[\d.]+")
    fleet = _run("online_fit", "--sets", "spec_bench", "--half", "all", "--fleet", "--window", "1", "--budget", "4",
                 "--datastore", chat_datastore, "--references", references, "--out", tmp_path / "fleet.json",
                 url=database_url)
    (row,) = json.loads((tmp_path / "fleet.json").read_text())["fleet"]
    assert row["a_requests"] == 1 and row["a_folded"] > 0 and row["b_adopted"] == row["a_folded"]
    assert "fleet of two" in fleet


def test_mixed_stream(database_url, chat_datastore, code_sample, ds_name, references, tmp_path):
    from ingest.build import BuildConfig, build_datastore

    build_datastore(BuildConfig(name=ds_name, source="code", path=code_sample, top_t=2000, database_url=database_url),
                    progress=False)
    methods = ["named", "named-shared", "both", *(["suffix"] if ARCTIC else [])]
    out = _run("mixed_stream", "--methods", *methods, "--forms", "chain", "--budgets", "4", "--datastore",
               chat_datastore, "--code-datastore", ds_name, "--both", chat_datastore, "--references", references,
               "--out", tmp_path / "mixed.json", url=database_url)
    saved = json.loads((tmp_path / "mixed.json").read_text())
    assert saved["methods"] == methods and saved["requests"] == 2
    assert [r["method"] for r in saved["rows"]] == methods
    assert all(r["accept_length"] >= 1 and r["spec_bench"] >= 1 and r["humaneval"] >= 1 for r in saved["rows"])
    assert "named ÷ both" in out
    same = subprocess.run([sys.executable, "-m", "benchmarks.mixed_stream", "--code-datastore", chat_datastore,
                           "--datastore", chat_datastore], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert same.returncode == 2 and "name another" in same.stderr and "Traceback" not in same.stderr


def _fleet_refused(*args: object, env: dict | None = None) -> str:
    """``python -m benchmarks.fleet ARGS`` exits 1 with a one-line error, no traceback; returns its stderr."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.fleet", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc.stderr


def test_fleet_refuses_a_run_before_its_prepare(tmp_path):
    """``run``, ``table`` and ``plot`` on a folder ``prepare`` never wrote, or whose file is cut short: one line naming
    the file and the command to run."""
    def refused(step: str, named: str, remedy: str) -> None:
        stderr = _fleet_refused(step, "--dir", tmp_path)
        assert named in stderr and remedy in stderr, stderr[-2000:]

    for step, missing, fix in (("run", "today.json", "fleet prepare"), ("table", "fleet.json", "fleet run"),
                               ("plot", "fleet.json", "fleet run")):
        refused(step, f"{missing} not found", fix)
    (tmp_path / "today.json").write_text('{"stream": [')
    (tmp_path / "fleet.json").write_text('{"meta": {}}')
    refused("run", "today.json is not JSON", "fleet prepare")
    refused("table", "fleet.json holds no rows", "fleet run")


def test_fleet_prepare_restarts_with_the_cpu_settings_as_a_module(tmp_path):
    """``prepare`` restarts itself with vLLM's CPU settings before anything reads (``python -m benchmarks.fleet`` again,
    its package intact); there, a stream larger than the corpus is refused naming the options to lower."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    stderr = _fleet_refused("prepare", "--dir", tmp_path, "--yesterday", "1000000", env=env)
    assert "fewer than --yesterday 1000000" in stderr and "lower them" in stderr, stderr[-2000:]


def _head_from_here(path, distilled: tuple[str, ...] = ()) -> None:
    """The shipped head's weights in a file whose record says ``train-head`` made it here (as the fleet requires), on
    the ``distilled`` answer files."""
    from drafting import DraftHead
    from drafting.head import DEFAULT_HEAD, WEIGHTS

    shipped = DraftHead.load(DEFAULT_HEAD)
    DraftHead(**{w: getattr(shipped, w) for w in WEIGHTS}, calibration=shipped.calibration, target=shipped.target,
              meta={"sharegpt_tokens": 0, "distilled": list(distilled)}).save(path)


def test_fleet_refuses_a_head_that_saw_today(tmp_path):
    """The shipped head was trained on the answers to every ShareGPT opening, today's among them: refused, naming the
    head to train instead."""
    from drafting.head import DEFAULT_HEAD

    (tmp_path / "today.json").write_text(json.dumps({"meta": {}, "stream": [
        {"id": "today-0", "kind": "new", "text": "hi", "prompt_ids": [1, 2, 3], "output_ids": [4, 5]}]}))
    stderr = _fleet_refused("run", "--dir", tmp_path, "--methods", "ours", "--head", DEFAULT_HEAD)
    assert "saw today's answers" in stderr and "python -m evaluation train-head" in stderr, stderr[-2000:]
    stderr = _fleet_refused("run", "--dir", tmp_path, "--methods", "ours", "--head", tmp_path)
    assert "is not a draft head file" in stderr, stderr[-2000:]
    _head_from_here(tmp_path / "head.npz", (str(tmp_path / "all.jsonl"),))  # trained here on other answers: refused
    stderr = _fleet_refused("run", "--dir", tmp_path, "--methods", "ours", "--head", tmp_path / "head.npz")
    assert "all.jsonl, which may hold today's" in stderr, stderr[-2000:]
    assert f"--distilled {(tmp_path / 'distilled.jsonl.zst').resolve()}" in stderr


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
        assert printed(out, r"yesterday: 30 conversations; today: \d+ openings and [1-9]\d* follow-ups")
        assert printed(out, f"built {name}-both")
        out = _run("fleet", "run", "--k", "2", "--methods", *methods, "--interval", "0.05", "--dir", folder,
                   "--name", name, url=database_url)
        _head_from_here(tmp_path / "head.npz")  # ours with the target's state: the states computed, then read
        headed = _run("fleet", "run", "--k", "2", "--methods", "ours", "--head", tmp_path / "head.npz", "--interval",
                      "0.05", "--dir", folder, "--name", name, "--out", tmp_path / "head.json", url=database_url)
    finally:
        drop_datastores(database_url, f"{name}-human", f"{name}-both")
    assert printed(headed, "ours read the target's state through the draft head")
    rows = json.loads((tmp_path / "head.json").read_text())["rows"]
    assert [(r["method"], r["head"]) for r in rows] == [("ours", str(tmp_path / "head.npz"))]
    assert rows[0]["accept_length"] >= 1 and len(list((folder / "states").glob("*.npy"))) > 0
    saved = json.loads((folder / "fleet.json").read_text())
    assert [(r["method"], r["k"], r["head"]) for r in saved["rows"]] == [(m, 2, None) for m in methods]
    assert all(r["accept_length"] >= 1 and len(r["by_quarter"]) == 4 for r in saved["rows"])
    assert sum(saved["meta"]["kinds_scored"].values()) == saved["rows"][0]["requests"] > 0
    assert saved["meta"]["kinds_scored"]["follow-up"] > 0 and saved["meta"]["follow_gap"] == 4
    assert len(printed(out, r"(ngram|ours[\w-]*|suffix[\w-]*) +[\d.]+$")) == len(methods)
    for r in saved["rows"]:  # which sources held the accepted draft tokens: ours only (the peers record none)
        a = r["sources"]
        assert (a == {}) != r["method"].startswith("ours"), r
        assert not a or all(0 <= a["only"][s] <= a["held"][s] <= 1 for s in a["held"])
        assert r["method"] != "ours-nolive" or a["held"]["live"] == 0
    table = _run("fleet", "table", "--dir", folder, url=database_url)
    assert table.splitlines()[0].startswith("accept length, chain of 8")
    _run("fleet", "plot", "--dir", folder, "--png", tmp_path / "fleet.png", "--window", "2", url=database_url)
    assert (tmp_path / "fleet.png").stat().st_size > 10_000


def test_sglang_ngram():
    """The module imports and runs as a script (it has no command line of its own: ``peers`` drives it), says what is
    missing, and reads SGLang's (tokens, mask) drafts: a root, a chain of two under it and a sibling, then padding."""
    import numpy as np

    from benchmarks.sglang_ngram import to_draft

    proc = subprocess.run([sys.executable, "-m", "benchmarks.sglang_ngram"], cwd=REPO,
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


@pytest.mark.slow
@pytest.mark.xdist_group("engine")
@pytest.mark.vllm
def test_vllm_serving(database_url, chat_datastore, tmp_path):
    """Two engines (vLLM's ``ngram``, then ours; concurrency 1, two Spec-Bench prompts of 8 tokens, with the step
    accounting)."""
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
    assert printed(out, r"spec_bench +1 crest +\d+ +[\d.]+")  # the accounting's table
    assert row["method"] == "crest" and row["prompts"] == 2 and row["tokens_per_s"] > 0
    assert row["accept_length"] >= 1 and row["proposer_steps"] > 0 and row["propose_p50_ms"] > 0
    assert printed(out, r"spec_bench +crest +8 +1 +[\d.]+")
