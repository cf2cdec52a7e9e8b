"""The BFCL function-calling sets (:mod:`toolkit.eval_sets`, :mod:`evaluation.prompts`, :mod:`evaluation.bfcl`): the
data fetched from the bfcl-eval wheel on PyPI (once, no dependencies, nothing installed); each development category's
first prompts, held-out categories apart; a prompt is a chat whose system message lists its functions in JSON (a
multi-turn entry's: its classes' functions, but the excluded ones), and a later turn carries the conversation so far,
the model's answers included; a conversation's turns share their entry's half; the sets are screened where their data
is; a prompt that does not fit the engine's context is named, and refused or left out by a flag."""

from __future__ import annotations

import json

import pytest

from evaluation.bfcl import fetch, turn_prompts
from evaluation.greedy import fitting
from evaluation.prompts import BFCL_SYSTEM, load_prompts
from evaluation.references import Reference, half
from toolkit.eval_sets import BFCL_CATEGORIES, BFCL_PER_CATEGORY, read_rows, screened_texts


@pytest.fixture(scope="module")
def bfcl_data(tmp_path_factory):
    """The BFCL data, fetched once for this module into a folder of its own."""
    return fetch(tmp_path_factory.mktemp("bfcl") / "data")


@pytest.fixture
def bfcl(bfcl_data, monkeypatch):
    monkeypatch.setenv("CREST_BFCL_DATA", str(bfcl_data))
    return bfcl_data


def test_the_data_is_fetched_once_from_the_wheel(bfcl_data):
    assert (bfcl_data / "BFCL_v4_simple_python.json").exists() and (bfcl_data / "multi_turn_func_doc").is_dir()
    assert "Apache 2.0" in (bfcl_data / "SOURCE").read_text()
    assert fetch(bfcl_data) == bfcl_data  # there already: nothing downloaded


def test_each_category_gives_its_first_prompts_and_the_held_out_ones_are_apart(bfcl, tokenizer):
    prompts = load_prompts("bfcl", tokenizer)
    held_out = load_prompts("bfcl_heldout", tokenizer)
    cats = {p.category for p in prompts}
    assert cats == set(BFCL_CATEGORIES["bfcl"])
    assert {p.category for p in held_out} == set(BFCL_CATEGORIES["bfcl_heldout"])
    for cat in BFCL_CATEGORIES["bfcl"][:4]:  # one prompt an entry: the first ones, in file order
        ids = [p.id for p in prompts if p.category == cat]
        assert ids == [f"{cat}-{i}" for i in range(BFCL_PER_CATEGORY)]
    rows = read_rows("bfcl")
    multi = [r for r in rows if r["category"] == "multi_turn_base"]
    turns = sum(len(r["turns"]) for r in multi)
    assert turns >= BFCL_PER_CATEGORY > turns - len(multi[-1]["turns"])  # its turns count, up to the cap
    first = prompts[0]
    system = first.text.split("<|im_end|>")[0]
    assert BFCL_SYSTEM.strip()[:40] in system
    functions = json.loads(system.split("The functions:\n", 1)[1])
    assert functions == rows[0]["functions"] and first.text.endswith("<|im_start|>assistant\n")


def test_a_multi_turn_entry_calls_its_classes_functions_but_the_excluded_ones(bfcl):
    entry = next(r for r in read_rows("bfcl") if r["category"] == "multi_turn_base")
    raw = json.loads((bfcl / "BFCL_v4_multi_turn_base.json").read_text().splitlines()[0])
    names = {f["name"] for f in entry["functions"]}
    assert names and not names & set(raw["excluded_function"])
    assert len(names) == len(entry["functions"]) >= 10


def test_a_later_turn_carries_the_conversation_and_its_turns_share_their_half(bfcl, tokenizer):
    entry = next(r for r in read_rows("bfcl") if r["category"] == "multi_turn_base")
    answers = {entry["id"]: ["[mv(source='a', destination='b')]"]}
    second = next(p for p in turn_prompts(tokenizer, "bfcl", answers, 1) if p.id == f"{entry['id']}/t2")
    assert "mv(source='a', destination='b')" in second.text
    assert entry["turns"][0][0]["content"] in second.text and entry["turns"][1][0]["content"] in second.text
    assert turn_prompts(tokenizer, "bfcl", {}, 1) == []  # no earlier answer: no later turn
    refs = [Reference(i, "multi_turn_base", [], []) for i in
            ("multi_turn_base-0", "multi_turn_base-0/t2", "multi_turn_base-0/t3", "multi_turn_base-1",
             "multi_turn_base-1/t2")]
    assert [r.id for r in half(refs, "fit")] == ["multi_turn_base-0", "multi_turn_base-0/t2", "multi_turn_base-0/t3"]
    assert [r.id for r in half(refs, "report")] == ["multi_turn_base-1", "multi_turn_base-1/t2"]


def test_the_sets_are_screened_where_their_data_is(bfcl):
    texts = dict(screened_texts())
    ids = [item for item, _ in texts["bfcl"]]
    assert len(ids) == len(read_rows("bfcl")) + len(read_rows("bfcl_heldout"))
    assert all(text for _, text in texts["bfcl"])


def test_a_prompt_that_does_not_fit_is_named_and_refused_or_left_out(bfcl, tokenizer, capsys):
    prompts = load_prompts("bfcl", tokenizer)
    longest = max(prompts, key=lambda p: len(p.token_ids))
    room = len(longest.token_ids) - 1
    with pytest.raises(SystemExit, match=f"{longest.id} \\({len(longest.token_ids)} tokens\\).*--skip-long"):
        fitting("bfcl", prompts, room, skip=False)
    kept = fitting("bfcl", prompts, room, skip=True)
    assert longest not in kept and len(kept) == len(prompts) - sum(len(p.token_ids) > room for p in prompts)
    assert f"{longest.id} ({len(longest.token_ids)} tokens)" in capsys.readouterr().out
