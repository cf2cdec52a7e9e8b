"""The native drafting core against its Python oracle (``tests/oracle``): the same drafts, bit for bit, on random
request streams, random datastore trees and random calibrations (hypothesis), and on the evaluation sets' prompts
drafted from a real datastore; the feature names it exports are the calibration's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import crest_native
from datastore.tree import Match
from drafting.calibration import FEATURES, Calibration, TokenBias
from drafting.draft import CostCurve
from oracle.core import CONTEXT_TOKENS, MATCH_NODES, PythonCore
from support import given_trees, native_core, native_extend, native_step, random_tree

DEFAULTS = crest_native.DEFAULTS


def test_the_oracle_uses_the_native_defaults():
    """The oracle restates the core's settings it is compared at; they are the native defaults."""
    assert (DEFAULTS["match_nodes"], DEFAULTS["context_tokens"], DEFAULTS["outputs_depth"]) == \
        (MATCH_NODES, CONTEXT_TOKENS, 16)
    assert DEFAULTS["sources"] == ("ds", "live", "local", "outputs") and crest_native.MAX_BUDGET == 1024


def tree(m: Match | None):
    return None if m is None else (len(m.ngram), m.tree.token_ids, m.tree.parents, m.tree.counts, m.tree.root_count)


def same_bits(want, got) -> None:
    """A draft of the oracle and the native core's arrays for it: the same tokens, parents, score bits and sources."""
    tokens, parents, scores, sources = got
    assert np.array_equal(want.token_ids, tokens) and np.array_equal(want.parents, parents)
    assert want.scores.tobytes() == np.asarray(scores, np.float64).tobytes(), (want.scores, scores)
    assert sources is not None and np.array_equal(want.sources, sources), (want.sources, sources)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.booleans(), st.sampled_from([0.0, 0.05, 0.3]),
       st.sampled_from([0, 600, 1 << 20]),
       st.sampled_from([crest_native.SOURCES, ("ds",), ("live", "local"), ("local", "outputs")]))
def test_native_drafts_equal_the_oracle(seed, vocab_bits, chain, min_score, outputs_bytes, sources):
    rng = np.random.default_rng(seed)
    vocab = 2 + vocab_bits * 3
    biased = np.flatnonzero(rng.random(vocab) < 0.5)  # a token term on about half the vocabulary, or none
    term = TokenBias(biased, rng.normal(scale=1.5, size=len(biased)), "random") if rng.random() < 0.7 else None
    cal = Calibration(rng.normal(scale=0.7, size=len(FEATURES)), float(rng.normal()), float(rng.choice([0.0, 1.0])),
                      sources=crest_native.SOURCES, token_bias=term)
    oracle = PythonCore(cal, outputs_bytes, sources=sources)
    native = native_core(calibration=cal, outputs_bytes=outputs_bytes, sources=sources, local_depth=16,
                         online_strength=0.0)  # the oracle scores with the calibration given (online: test_online)
    active: list[int] = []
    handles: dict[int, int] = {}
    for step in range(40):
        roll = rng.random()
        if roll < 0.2 or not active:  # a new request
            prompt = rng.integers(0, vocab, size=int(rng.integers(1, 40))).tolist()
            key = step * 7 + int(rng.integers(7))
            oracle.start(key, prompt)
            handles[key] = native.start(np.asarray(prompt, np.uint32))
            active.append(key)
        elif roll < 0.3:  # one finishes: its output feeds the output index of both
            key = active.pop(int(rng.integers(len(active))))
            assert oracle.stop(key) == native.stop(handles.pop(key)).tolist()
        elif roll < 0.35:  # outputs finished elsewhere (another process of the fleet) join both, an empty one skipped
            outs = [rng.integers(0, vocab, size=int(rng.integers(0, 30))).tolist() for _ in range(rng.integers(1, 4))]
            for o in outs:
                oracle.outputs.add(o)
            native.add_outputs(np.asarray(sum(outs, []), np.uint32), np.asarray([len(o) for o in outs], np.int64))
        else:  # a step for every active request: random datastore candidates and live trees
            budgets = [int(rng.integers(1, 20)) for _ in active]
            stored = [[Match(tuple(range(n)), random_tree(rng, vocab, int(rng.integers(0, 30))))
                       for n in range(int(rng.integers(0, 4)), 0, -1)] for _ in active]
            live = [Match((1, 2), random_tree(rng, vocab, int(rng.integers(0, 20)))) if rng.random() < 0.4 else None
                    for _ in active]
            # the live layer's delta: a shorter, an equal or a longer match than the main build's (summed when equal)
            delta = [Match(tuple(range(int(rng.integers(1, 4)))), random_tree(rng, vocab, int(rng.integers(0, 20))))
                     if rng.random() < 0.4 else None for _ in active]
            want = oracle.draft(active, budgets, stored, live, chain, min_score, delta)
            curve = None
            if chain and rng.random() < 0.5:  # an engine's step-cost curve: a knee at a random batch size
                knee, fixed = float(rng.integers(2, 3 * len(active) + 3)), float(rng.uniform(0.01, 0.03))
                curve = CostCurve(np.array([1.0, knee, knee + 1.0]), np.array([fixed, fixed, fixed * 1.2]),
                                  float(rng.uniform(0.0, 0.01)))
            kept = oracle.cut_to_curve(active, [d for d, _ in want], curve) if curve else [len(d) for d, _ in want]
            made = native_step(native, [handles[k] for k in active], budgets,
                               given_trees([[tree(m) for m in c] for c in stored], [tree(m) for m in live],
                                           [tree(m) for m in delta]), chain=chain, min_score=min_score, curve=curve)
            tokens, parents, scores, offsets, chosen, sources = (made.tokens, made.parents, made.scores, made.offsets,
                                                                 made.chosen, made.sources)
            for j, (draft, c) in enumerate(want):
                s, e, n = offsets[j], offsets[j + 1], kept[j]
                assert draft.sources is not None
                assert e - s == n  # a cut chain keeps its first n nodes
                same_bits(draft, (np.concatenate([tokens[s:e], draft.token_ids[n:]]),
                                  np.concatenate([parents[s:e], draft.parents[n:]]),
                                  np.concatenate([scores[s:e], draft.scores[n:]]),
                                  np.concatenate([sources[s:e], draft.sources[n:]])))
                assert c == chosen[j]
            for key, (draft, _) in zip(active, want):  # the target commits a few tokens: some of the draft's, or not
                toks = rng.integers(0, vocab, size=int(rng.integers(1, 4))).tolist()
                if len(draft) and rng.random() < 0.6:  # the path to a random node, cut at a random depth
                    path = [int(rng.integers(len(draft)))]
                    while draft.parents[path[-1]] >= 0:
                        path.append(int(draft.parents[path[-1]]))
                    toks = draft.token_ids[path[::-1][:int(rng.integers(0, len(path) + 1))]].tolist() + toks[:1]
                oracle.extend(key, toks)
                native_extend(native, handles[key], toks)
                assert native.acceptance(handles[key]) == oracle.acceptance(key)  # the engine's verdicts, bit for bit
    info = native.outputs_info()
    o = oracle.outputs
    assert (info.outputs, info.bytes, info.evictions) == (o.num_outputs, o.nbytes, o.evictions)


def test_the_native_features_are_the_calibrations_by_name():
    assert crest_native.FEATURES == FEATURES and len(FEATURES) == 4 * 6 + 2
    assert FEATURES[:2] == ("ds_on", "ds_ratio") and FEATURES[-2:] == ("agree", "log_depth")
    assert FEATURES[18:24] == ("outputs_on", "outputs_ratio", "outputs_log_parent", "outputs_ratio_x_log_parent",
                               "outputs_log_n", "outputs_miss")
    assert crest_native.SOURCES == ("ds", "live", "local", "outputs")


def test_native_core_refuses_bad_settings_and_stale_handles():
    """The core refuses settings it cannot draft with, naming them, and a handle whose request stopped (its slot may be
    reused: the generation tells them apart)."""
    cal = Calibration(np.zeros(len(FEATURES)), 0.0)
    options = crest_native.Options()
    with pytest.raises(ValueError, match="unknown source 'corpus'"):
        options.sources = ["ds", "corpus"]
    for name, value in (("back_off_min_budget", -1), ("match_nodes", 0), ("local_depth", 0), ("max_tokens", -1)):
        bad = crest_native.Options()
        setattr(bad, name, value)
        with pytest.raises(ValueError, match="back_off_min_budget and max_tokens >= 0"):
            crest_native.Core(cal.coef, cal.intercept, cal.prior, bad)
    with pytest.raises(TypeError):
        options.outputs_bytes = -1  # a byte count
    with pytest.raises(AttributeError):
        options.match_nodez = 64  # type: ignore[attr-defined, unused-ignore]
    assert sorted(DEFAULTS) == sorted(crest_native.Options.names)
    core = native_core(calibration=cal, outputs_bytes=0)
    a = core.start(np.array([5, 6], np.uint32))
    assert core.active(a) and core.count(a) == 2 and core.tokens(a, 1).tolist() == [6] and len(core) == 1
    assert core.stop(a).tolist() == [] and core.stop(a) is None and not core.active(a) and len(core) == 0
    b = core.start(np.array([7], np.uint32))  # b reuses a's slot, a is still refused
    assert b != a and core.active(b) and not core.active(a) and core.count(a) == 0
    made = native_step(core, [a], [0], given_trees([[]]), appended=[[5]])
    # a stale handle (a request stopped meanwhile) follows nothing and drafts an empty row, the others as ever
    assert made.followed == [True] and made.drafted and made.nodes == 0 and made.inactive == 1
    empty = native_step(core, [a, b], [4, 4], given_trees([[], []]))
    assert empty.offsets.tolist()[:2] == [0, 0] and empty.inactive == 1  # a's row: no draft
    for lengths in ([2, 2], [-1, 4], [1]):  # outputs from elsewhere whose lengths do not lay out the tokens given
        with pytest.raises(ValueError, match="add_outputs"):
            core.add_outputs(np.arange(3, dtype=np.uint32), np.asarray(lengths, np.int64))
    with pytest.raises(ValueError, match="pass token_ids and token_bias together"):
        crest_native.Core(cal.coef, cal.intercept, cal.prior, options, np.arange(2), None)


@pytest.mark.parametrize("chain", [True, False])
def test_a_context_length_cuts_each_draft_to_what_fits(chain):
    """With ``max_tokens`` (an engine's context length), a request's draft is the one an unbounded core drafts at the
    budget that fits beside its tokens and the bonus token (``max_tokens - 1 - count``, at most the one asked, none
    when nothing fits), bit for bit; a negative ``max_tokens`` is refused."""
    cal = Calibration.load()
    max_tokens, budget = 64, 6
    cycle = [17, 4, 99, 23, 8, 61, 5]  # a request repeating itself: its own automaton drafts `budget` nodes
    counts = [max_tokens - 3, max_tokens - 1, max_tokens + 5, 20]  # 2 fit, none, none (past the end), all
    bounded = native_core(calibration=cal, outputs_bytes=0, max_tokens=max_tokens)
    free = native_core(calibration=cal, outputs_bytes=0)

    def drafts(core, budgets):
        handles = [core.start(np.array((cycle * 20)[:n], np.uint32)) for n in counts]
        made = native_step(core, handles, budgets, given_trees([[] for _ in counts]), chain=chain)
        o = made.offsets.tolist()
        return [(made.tokens[a:b].tolist(), made.parents[a:b].tolist(), made.scores[a:b].tolist(),
                 made.sources[a:b].tolist()) for a, b in zip(o, o[1:])]

    fits = [min(budget, max(0, max_tokens - 1 - n)) for n in counts]
    assert fits == [2, 0, 0, budget]
    got, want = drafts(bounded, [budget] * len(counts)), drafts(free, fits)
    assert got == want and [len(d[0]) for d in got] == fits
    with pytest.raises(ValueError, match="max_tokens"):
        native_core(calibration=cal, max_tokens=-1)


@pytest.mark.parametrize("chain", [True, False])
def test_the_service_drafts_what_the_oracle_drafts_on_the_evaluation_sets(chain, chat_datastore, database_url,
                                                                         tokenizer):
    """Request streams made of real evaluation prompts (Spec-Bench's every category, HumanEval), each request's
    second half committed a few tokens at a time, drafted from a real datastore by the service (the native core) and
    by the oracle core given the same lookups: the same drafts at every step, and the same output index after every
    request (both learn each finished output)."""
    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource, DraftingService
    from evaluation.prompts import load_prompts

    prompts = load_prompts("spec_bench", tokenizer, limit=1) + load_prompts("humaneval", tokenizer, limit=6)
    source = DatastoreSource(lambda: SharedDatastore.open(chat_datastore, tokenizer=tokenizer,
                                                          database_url=database_url, replicas=False))
    service = DraftingService(source, vocab_size=len(tokenizer), online_strength=0.0)  # the oracle does not learn
    oracle = PythonCore(service.calibration, DEFAULTS["outputs_bytes"])
    compared = nonempty = 0
    try:
        for i, p in enumerate(prompts):
            ids = [int(t) for t in p.token_ids]
            cut = max(4, len(ids) // 2)
            service.start_request(i, ids[:cut])
            oracle.start(i, ids[:cut])
            new: list[int] = []
            for pos in range(cut, len(ids), 3):
                budget = (3, 8, 40)[pos % 3]
                got = service.step([i], [budget], tokens=[new], chain=chain, min_score=0.05).drafts[0]
                back_off = not chain and budget >= DEFAULTS["back_off_min_budget"]
                found = source.retrieve_batch([ids[:pos][-16:]], [back_off])[0]
                cands = found.candidates if back_off else found.candidates[:1]
                want, _ = oracle.draft([i], [budget], [cands], [found.live], chain, 0.05)[0]
                same_bits(want, (got.token_ids, got.parents, got.scores, got.sources))
                compared += 1
                nonempty += len(got) > 0
                new = ids[pos:pos + 3]
                oracle.extend(i, new)
            service.step([i], [0], tokens=[new])
            service.stop_request(i)
            oracle.stop(i)
            info = service.outputs_info()
            assert (info["outputs"], info["bytes"]) == (oracle.outputs.num_outputs, oracle.outputs.nbytes)
    finally:
        source.close()
    assert compared > 300 and nonempty > compared // 2 and service.outputs_info()["outputs"] == len(prompts)
