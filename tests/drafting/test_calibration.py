"""The calibration (:mod:`drafting.calibration`) and the native core's node tables it is fitted on: a known answer of
the features and scores the core computes, the fit on data with a known answer, weights matched to the core's features
by name (a mismatch names the feature), the shipped parameters, and the back-off lookup on a real datastore."""

from __future__ import annotations

import json

import numpy as np
import pytest

from crest_native import SOURCES
from datastore.tree import Match
from drafting import DraftingService
from drafting.calibration import DEFAULT_PATH, FEATURES, Calibration
from oracle.calibration import COLUMN, conditional, draft_from_candidates, model_features, node_table, scores
from support import tree_from_paths

F = COLUMN


def test_the_core_node_table_known_answer():
    """Two datastore candidates and a live tree below a request whose own tokens predict nothing yet: the core's
    tables (one per candidate), the features by name and the scores of the shipped calibration."""
    cal = Calibration.load()
    service = DraftingService(None, vocab_size=100, outputs_bytes=0, calibration=cal)
    service.start_request("r", [1, 2, 3])  # no repeated suffix: no local match
    ds = Match((1, 2, 3), tree_from_paths({(5,): 10, (6,): 3, (5, 7): 8}, root=14))
    shorter = Match((3,), tree_from_paths({(8,): 4}, root=9))
    live = Match((3,), tree_from_paths({(5,): 2, (5, 9): 1, (8,): 1}, root=3))
    tables = service.node_tables("r", [ds, shorter], live)
    assert len(tables) == 2
    t = tables[0]
    paths = [(5,), (6,), (5, 7), (5, 9), (8,)]  # the first candidate whole, then the live tree's new nodes
    assert t.tokens.tolist() == [5, 6, 7, 9, 8] and t.parents.tolist() == [-1, -1, 0, 0, -1]
    assert t.depths.tolist() == [1, 1, 2, 2, 1] and t.features.shape == (5, len(FEATURES))
    x = t.features
    assert x[0, F["ds_ratio"]] == pytest.approx(10 / 15) and x[0, F["live_ratio"]] == pytest.approx(2 / 4)
    assert x[2, F["ds_ratio"]] == pytest.approx(8 / 11) and x[2, F["ds_log_parent"]] == pytest.approx(np.log1p(10))
    assert x[:, F["ds_on"]].tolist() == [1, 1, 1, 0, 0] and x[:, F["live_on"]].tolist() == [1, 0, 0, 1, 1]
    assert np.allclose(x[:, F["ds_log_n"]], np.log1p(3) * np.array([1, 1, 1, 0, 0]))
    assert x[:, F["ds_miss"]].tolist() == [0, 0, 0, 1, 1] and x[:, F["live_miss"]].tolist() == [0, 1, 1, 0, 0]
    assert x[:, F["agree"]].tolist() == [1, 0, 0, 0, 0]
    assert x[:, F["local_on"]].sum() == x[:, F["outputs_on"]].sum() == 0
    assert np.allclose(x[:, F["log_depth"]], np.log([1, 1, 2, 2, 1]))
    oracle = node_table({"ds": ds, "live": live}, cal.prior)  # the oracle's table of the same sources
    assert oracle is not None and np.array_equal(oracle.features, x) and len(paths) == len(oracle.tokens)
    assert t.scores.tobytes() == scores(cal, oracle).tobytes()  # P(node) = product of conditionals, the same bits
    assert tables[1].tokens.tolist() == [8, 5, 9]  # the shorter candidate's union
    with pytest.raises(KeyError, match="'q' is not active"):
        service.node_tables("q", [ds], None)


def with_model(cal: Calibration, weights=(0.5, 2.0, 1.0)) -> Calibration:
    """``cal`` weighing the model features too."""
    return Calibration(np.concatenate([cal.coef, weights]), cal.intercept, cal.prior, sources=cal.sources,
                       token_bias=cal.token_bias)


def test_the_model_features_and_scores_equal_the_oracles():
    """Given a next-state estimate, the core reads the union's depth-1 tokens against the LM head: the model features
    and the with-model scores are the oracle's bits, the other columns unchanged; a token outside the head's rows is
    not scored."""
    cal = Calibration.load()
    rng = np.random.default_rng(7)
    lm_head = rng.normal(size=(9, 16)).astype(np.float32)  # tokens 0..8; token 9 is no row of it
    state = rng.normal(size=16).astype(np.float32)
    service = DraftingService(None, vocab_size=100, outputs_bytes=0, calibration=cal)
    service.start_request("r", [1, 2, 3])
    ds = Match((1, 2, 3), tree_from_paths({(5,): 10, (6,): 3, (5, 7): 8, (9,): 2}, root=15))
    live = Match((3,), tree_from_paths({(5,): 2, (5, 8): 1, (8,): 1}, root=3))
    plain = service.node_tables("r", [ds], live)[0]
    with pytest.raises(ValueError, match="no model is set: call set_model"):
        service.node_tables("r", [ds], live, state)
    mine = with_model(cal)
    service.set_model(lm_head, mine)
    t = service.node_tables("r", [ds], live, state)[0]
    assert t.features.shape == (len(t.tokens), len(FEATURES) + 3)
    assert np.array_equal(t.features[:, :len(FEATURES)], plain.features)
    want = model_features(lm_head, state, t)
    assert t.features[:, len(FEATURES):].tobytes() == want.tobytes()
    first = t.depths == 1
    assert want[first & (t.tokens < 9), 0].all() and not want[~first | (t.tokens == 9)].any()
    assert np.exp(want[want[:, 0] > 0, 1]).sum() == pytest.approx(1.0) and want[:, 2].sum() == 1
    assert t.scores.tobytes() == scores(mine, t).tobytes()
    assert service.node_tables("r", [ds], live)[0].scores.tobytes() == plain.scores.tobytes()  # no state: as before
    service.close()


def test_the_model_terms_stack_on_a_calibration_with_a_known_answer():
    """Acceptance drawn from 1.5 x the shipped logit + known model terms: the stacked fit recovers them, folded into
    one with-model calibration whose logit is theirs (the token biases scaled with the rest); bad input is refused."""
    base = Calibration.load()
    rng = np.random.default_rng(5)
    n = 60_000
    x = np.zeros((n, len(FEATURES) + 3))
    x[:, :len(FEATURES)] = rng.normal(size=(n, len(FEATURES))) * 0.3
    x[:, len(FEATURES)] = rng.random(n) < 0.5
    x[:, len(FEATURES) + 1] = -rng.exponential(size=n) * x[:, len(FEATURES)]
    x[:, len(FEATURES) + 2] = (x[:, len(FEATURES) + 1] > -0.3) * x[:, len(FEATURES)]
    tokens = rng.choice(base.token_bias.tokens[:20], size=n) if base.token_bias is not None else np.zeros(n, np.int64)
    want = 1.5 * base.logits(x[:, :len(FEATURES)], tokens) + x[:, len(FEATURES):] @ np.array([0.3, 1.2, 0.8]) - 0.4
    y = rng.random(n) < 1 / (1 + np.exp(-want))
    cal = base.with_model_terms(x, y, tokens, meta={"what": "synthetic"})
    assert cal.with_model and cal.meta["what"] == "synthetic"
    assert np.allclose(cal.coef[len(FEATURES):], [0.3, 1.2, 0.8], atol=0.2)
    assert np.corrcoef(cal.logits(x, tokens), want)[0, 1] > 0.995
    with pytest.raises(ValueError, match="weighs the model features already"):
        cal.with_model_terms(x, y, tokens)
    with pytest.raises(ValueError, match=r"do not match \[rows, 29\]"):
        base.with_model_terms(x[:, :-1], y, tokens)
    path = str(DEFAULT_PATH)
    assert Calibration.from_json(cal.to_json(), path).coef.tolist() == cal.coef.tolist()
    partial_model = cal.to_json()
    partial_model["features"], partial_model["coef"] = partial_model["features"][:-1], partial_model["coef"][:-1]
    with pytest.raises(ValueError, match="some of the model features.*train-head"):
        Calibration.from_json(partial_model, path)


def test_fit_recovers_a_known_model():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40_000, len(FEATURES)))
    w = np.zeros(len(FEATURES))
    w[F["ds_ratio"]], w[F["local_ratio"]], w[F["log_depth"]] = 2.0, 3.0, -1.0
    y = rng.random(len(x)) < 1 / (1 + np.exp(-(x @ w - 0.5)))
    cal = Calibration.fit(x[:30_000], y[:30_000], meta={"what": "synthetic"})
    held = conditional(cal, x[30_000:])
    truth = 1 / (1 + np.exp(-(x[30_000:] @ w - 0.5)))
    assert np.abs(held - truth).mean() < 0.02
    assert cal.coef[F["local_ratio"]] == pytest.approx(3.0, abs=0.2)
    with pytest.raises(ValueError, match="one class"):
        Calibration.fit(x[:10], np.ones(10, bool))
    with pytest.raises(ValueError, match="do not match"):
        Calibration.fit(x[:10, :3], y[:10])


def test_fit_recovers_known_token_biases():
    """Nodes whose token shifts their logit by a known bias: the fit finds each frequent token's bias (the others
    share the intercept), and scores them through the oracle and the native core alike."""
    rng = np.random.default_rng(5)
    n = 60_000
    x = np.zeros((n, len(FEATURES)))
    x[:, F["ds_on"]] = 1.0
    x[:, F["ds_ratio"]] = rng.random(n)
    tokens = rng.choice([7, 11, 13, 40, 41], size=n, p=[0.3, 0.3, 0.3, 0.05, 0.05])
    shift = np.select([tokens == 7, tokens == 11], [1.5, -1.0], 0.0)
    y = rng.random(n) < 1 / (1 + np.exp(-(3.0 * x[:, F["ds_ratio"]] - 2.0 + shift)))
    cal = Calibration.fit(x, y, tokens=tokens, token_terms=3, tokenizer="t")
    assert cal.token_bias is not None and cal.token_bias.tokens.tolist() == [7, 11, 13]  # the 3 most frequent
    assert cal.token_bias.bias.tolist() == pytest.approx([1.5, -1.0, 0.0], abs=0.15)
    assert cal.coef[F["ds_ratio"]] == pytest.approx(3.0, abs=0.2)
    probe = np.repeat(x[:1], 3, axis=0)
    p = conditional(cal, probe, np.array([7, 13, 41]))
    assert p[0] > p[1] and p[1] == pytest.approx(p[2], abs=0.05)
    with pytest.raises(ValueError, match="tokenizer"):
        Calibration.fit(x, y, tokens=tokens, token_terms=3)
    with pytest.raises(ValueError, match="pass tokens"):
        conditional(cal, probe)


def test_a_token_term_saves_loads_and_belongs_to_its_tokenizer(tmp_path):
    """The token term round-trips through the file; a malformed one is refused naming the fix; a drafter for
    another tokenizer gets the calibration without it; bad terms are refused by the class and by the native core."""
    import crest_native
    from drafting.calibration import TokenBias

    term = TokenBias(np.array([3, 9]), np.array([0.5, -0.25]), "abc")
    cal = Calibration(np.zeros(len(FEATURES)), 0.1, token_bias=term)
    cal.save(tmp_path / "c.json")
    back = Calibration.load(tmp_path / "c.json")
    assert back.token_bias is not None and back.token_bias.tokenizer == "abc"
    assert back.token_bias.tokens.tolist() == [3, 9] and back.token_bias.bias.tolist() == [0.5, -0.25]
    assert back.digest() == cal.digest() and back.digest() != Calibration(cal.coef, 0.1).digest()
    assert cal.for_tokenizer("abc") is cal
    other = cal.for_tokenizer("xyz")
    assert other.token_bias is None and np.array_equal(other.coef, cal.coef) and other.intercept == 0.1
    raw = json.loads((tmp_path / "c.json").read_text())
    raw["token_bias"]["tokens"] = [9, 3]
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="token_bias is malformed.*ascending.*refit"):
        Calibration.load(tmp_path / "bad.json")
    del raw["token_bias"]["tokenizer"]
    (tmp_path / "anonymous.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="token_bias is malformed"):
        Calibration.load(tmp_path / "anonymous.json")
    (tmp_path / "truncated.json").write_text((tmp_path / "c.json").read_text()[:40])
    with pytest.raises(ValueError, match="truncated.json is not a calibration file.*refit"):
        Calibration.load(tmp_path / "truncated.json")
    for tokens, bias, match in (([1, 2], [0.0], "pair up"), ([-1], [0.0], "ascending"), ([1], [np.inf], "finite")):
        with pytest.raises(ValueError, match=match):
            TokenBias(np.array(tokens), np.array(bias), "t")
    options = crest_native.Options()
    for ids, bias in (([3, 9], [0.5]), ([9, 3], [0.5, 0.5]), ([3, -2], [0.0, 0.0])):
        with pytest.raises(ValueError, match="token bias"):
            crest_native.Core(cal.coef, cal.intercept, cal.prior, options, np.array(ids, np.int64), np.array(bias))
    with pytest.raises(ValueError, match="together"):
        crest_native.Core(cal.coef, cal.intercept, cal.prior, options, np.array([3], np.int64), None)


def test_save_load_round_trip_and_refusals(tmp_path):
    cal = Calibration(np.arange(len(FEATURES), dtype=float), 0.25, 1.0, {"fit_prompts": 3}, SOURCES)
    cal.save(tmp_path / "c.json")
    back = Calibration.load(tmp_path / "c.json")
    assert np.array_equal(back.coef, cal.coef) and back.intercept == 0.25 and back.meta == {"fit_prompts": 3}
    with pytest.raises(FileNotFoundError, match="python -m evaluation calibrate"):
        Calibration.load(tmp_path / "missing.json")
    raw = json.loads((tmp_path / "c.json").read_text())
    raw["features"], raw["coef"] = raw["features"][::-1], raw["coef"][::-1]  # the same weights, listed otherwise
    (tmp_path / "reordered.json").write_text(json.dumps(raw))
    assert np.array_equal(Calibration.load(tmp_path / "reordered.json").coef, cal.coef)  # matched by name
    renamed = dict(raw, features=[f if f != "ds_ratio" else "ds_share" for f in raw["features"]])
    (tmp_path / "renamed.json").write_text(json.dumps(renamed))
    with pytest.raises(ValueError, match="no weight for feature 'ds_ratio'.*refit"):
        Calibration.load(tmp_path / "renamed.json")
    extra = dict(raw, features=raw["features"] + ["s4c_prob"], coef=raw["coef"] + [1.0])
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    with pytest.raises(ValueError, match="weighs feature 's4c_prob', which the native core does not compute"):
        Calibration.load(tmp_path / "extra.json")


def test_a_calibration_refuses_a_source_it_does_not_weigh():
    """A calibration weighs the retrieval sources; one over an unknown source is refused, naming it."""
    with pytest.raises(ValueError, match="sources="):
        Calibration(np.zeros(len(FEATURES)), 0.0, sources=("ds", "live", "local", "outputs", "heads"))
    assert Calibration.load(DEFAULT_PATH).sources == SOURCES


def test_shipped_calibration_was_fitted_on_one_half_and_reported_on_the_other(tokenizer):
    from toolkit.tokenizer import tokenizer_fingerprint

    cal = Calibration.load()
    meta = cal.meta
    assert cal.token_bias is not None and len(cal.token_bias.tokens) == meta["token_terms"] > 0
    assert cal.token_bias.tokenizer == tokenizer_fingerprint(tokenizer)  # the target's, whose ids it weighs
    assert meta["half"].startswith("fit") and meta["fit_prompts"] > 100 and meta["fit_rows"] > 10_000
    for name in ("spec_bench", "humaneval"):
        rep = meta["report"][name]
        uncalibrated = rep.get("ece_count_ratio", rep.get("ece_noisy_or"))  # the baseline it was reported against
        assert rep["prompts"] > 0 and rep["ece_calibrated"] < uncalibrated
    assert cal.meta["local"] == {"kind": "suffix", "max_depth": cal.local_depth}
    assert cal.meta["outputs"]["max_bytes"] > 0
    # a node both the corpus and the request itself predict, with a high ratio, beats one only the corpus predicts
    both = np.zeros(len(FEATURES))
    both[[F["ds_on"], F["local_on"]]] = 1
    both[[F["ds_ratio"], F["local_ratio"]]] = 0.8
    both[F["agree"]] = 1
    alone = both.copy()
    alone[[F["local_on"], F["local_ratio"], F["agree"]]] = 0
    none = np.array([-1])  # a token without a bias of its own
    assert conditional(cal, both[None], none)[0] > conditional(cal, alone[None], none)[0]


@pytest.mark.parametrize("chain", [False, True])
def test_calibrated_back_off_drafts_are_lossless(target, eval_prompts, chat_datastore, database_url, tokenizer, chain):
    from datastore.shared import SharedDatastore
    from decoder import greedy_generate, speculative_generate
    from drafting import DatastoreSource

    source = DatastoreSource(lambda: SharedDatastore.open(chat_datastore, tokenizer=tokenizer,
                                                          database_url=database_url))
    service = DraftingService(source, vocab_size=len(tokenizer))
    saved = 0
    try:
        for p in eval_prompts:
            want = greedy_generate(target, p.token_ids, max_new_tokens=32).output_ids
            res = speculative_generate(target, p.token_ids, service, max_new_tokens=32, budget=4, chain=chain)
            assert res.output_ids == want, p.id
            assert all(s.drafted <= 4 for s in res.steps)
            saved += len(res.output_ids) - 1 - len(res.steps)
    finally:
        source.close()
    assert saved > 0 and service.stats.steps > 0


def test_service_backs_off_for_large_trees_only(eval_prompts, chat_datastore, database_url, tokenizer):
    """The service's drafts are the oracle's merge of the same candidates: every stored suffix for large trees, the
    longest one for chains and small trees."""
    from datastore.shared import SharedDatastore
    from drafting import DatastoreSource
    from oracle.core import MATCH_NODES
    from oracle.local import RequestAutomaton

    cal = Calibration.load()
    source = DatastoreSource(lambda: SharedDatastore.open(chat_datastore, tokenizer=tokenizer,
                                                          database_url=database_url))
    service = DraftingService(source, vocab_size=len(tokenizer), outputs_bytes=0)
    differs = 0
    try:
        for p in eval_prompts:
            ids = list(p.token_ids)
            for cut in range(8, len(ids), 9):
                service.start_request("r", ids[:cut])
                own = RequestAutomaton(cal.local_depth)
                own.extend(ids[:cut])
                cands = source.candidates_batch([ids[:cut]])[0]
                for budget, chain, pool in ((64, False, cands), (8, False, cands[:1]), (64, True, cands[:1])):
                    got = service.step(["r"], [budget], chain=chain).drafts[0]
                    want, _ = draft_from_candidates(cal, pool, {"local": own.match(max(budget, MATCH_NODES))}, budget,
                                                    chain=chain)
                    assert got.token_ids.tolist() == want.token_ids.tolist()
                    assert got.scores.tobytes() == want.scores.tobytes()
                longest, _ = draft_from_candidates(cal, cands[:1], {"local": own.match(MATCH_NODES)}, 64)
                differs += longest.token_ids.tolist() != service.step(["r"], [64]).drafts[0].token_ids.tolist()
                service.stop_request("r")
    finally:
        source.close()
    assert differs > 0  # the back-off chose a shorter n-gram somewhere


def test_a_drafter_for_another_tokenizer_drops_the_token_term(chat_datastore, database_url, tokenizer, caplog):
    """The token term weighs token ids of the tokenizer it names: a drafter opened with that tokenizer keeps it, one
    opened with another (here the target's with one token added) drafts without it and says so once (the datastore
    refuses that tokenizer too, on its own)."""
    import copy
    import logging

    from drafting.calibration import TokenBias
    from toolkit.tokenizer import tokenizer_fingerprint

    cal = Calibration(np.zeros(len(FEATURES)), 0.0,
                      token_bias=TokenBias(np.array([5]), np.array([1.0]), tokenizer_fingerprint(tokenizer)))
    other = copy.deepcopy(tokenizer)
    other.add_tokens(["<crest-test-token>"])
    with caplog.at_level(logging.WARNING, logger="drafting.service"):
        mine = DraftingService.open(chat_datastore, tokenizer=tokenizer, database_url=database_url, live=False,
                                    calibration=cal, replicas=False)
        assert mine.calibration is cal and not [r for r in caplog.records if r.name == "drafting.service"]
        theirs = DraftingService.open(chat_datastore, tokenizer=other, database_url=database_url, live=False,
                                      calibration=cal, replicas=False)
    try:
        assert theirs.calibration.token_bias is None and np.array_equal(theirs.calibration.coef, cal.coef)
        assert mine.calibration.token_bias is not None and mine.calibration.token_bias.tokens.tolist() == [5]
        assert [r.getMessage() for r in caplog.records if r.name == "drafting.service"] == [
            "the calibration's token term was fitted for another tokenizer: drafting without it (fit one for yours "
            "with python -m evaluation calibrate)"]
    finally:
        mine.close()
        theirs.close()
