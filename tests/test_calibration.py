"""Calibrated node scores and the back-off lookup: known answers on small trees, oracles on random ones, the
fit on data with a known answer, the shipped parameters, and the back-off lookup on a real datastore."""

from __future__ import annotations

import numpy as np
import pytest

from datastore.tree import Match, TokenTree
from decoder.accept import accepted_mask, reference_predictions
from decoder.calibration import COLUMN, FEATURES, Calibration, draft_from_candidates, node_table

F = COLUMN


def _tree(paths: dict[tuple, int], root: int = 0) -> TokenTree:
    """A token tree from ``path -> count`` (parents listed before children)."""
    index: dict[tuple, int] = {}
    toks: list[int] = []
    pars: list[int] = []
    cnts: list[int] = []
    for path, c in paths.items():
        index[path] = len(toks)
        toks.append(path[-1])
        pars.append(index[path[:-1]] if len(path) > 1 else -1)
        cnts.append(c)
    return TokenTree(np.array(toks), np.array(pars), np.array(cnts), root)


def _paths(table) -> list[tuple]:
    out: list[tuple] = []
    for t, p in zip(table.tokens.tolist(), table.parents.tolist()):
        out.append((out[p] if p >= 0 else ()) + (t,))
    return out


def test_node_table_known_answer():
    ds = Match((1, 2, 3), _tree({(5,): 10, (6,): 3, (5, 7): 8}, root=14))
    local = Match((3,), _tree({(5,): 2, (5, 9): 1, (8,): 1}, root=3))
    t = node_table({"ds": ds, "local": local}, prior=1.0)
    assert t is not None
    assert _paths(t) == [(5,), (6,), (5, 7), (5, 9), (8,)]
    assert t.depths.tolist() == [1, 1, 2, 2, 1]
    x = t.features
    assert x[0, F["ds_ratio"]] == pytest.approx(10 / 15) and x[0, F["local_ratio"]] == pytest.approx(2 / 4)
    assert x[2, F["ds_ratio"]] == pytest.approx(8 / 11) and x[2, F["ds_log_parent"]] == pytest.approx(np.log1p(10))
    assert x[:, F["ds_on"]].tolist() == [1, 1, 1, 0, 0] and x[:, F["local_on"]].tolist() == [1, 0, 0, 1, 1]
    assert np.allclose(x[:, F["ds_log_n"]], np.log1p([3, 3, 3, 0, 0]) * [1, 1, 1, 0, 0])
    assert np.allclose(x[:, F["local_log_n"]], np.log1p([1, 0, 0, 1, 1]))
    # a source "misses" a node when it predicted other children of that node's parent
    assert x[:, F["ds_miss"]].tolist() == [0, 0, 0, 1, 1]
    assert x[:, F["local_miss"]].tolist() == [0, 1, 1, 0, 0]
    assert x[:, F["agree"]].tolist() == [1, 0, 0, 0, 0]
    assert x[:, F["live_on"]].sum() == 0 and x[:, F["outputs_on"]].sum() == 0
    assert np.allclose(x[:, F["log_depth"]], np.log([1, 1, 2, 2, 1]))
    assert node_table({"ds": None, "local": None}) is None and node_table({}) is None
    with pytest.raises(ValueError, match="unknown sources"):
        node_table({"corpus": ds})


def test_every_source_block_and_four_way_agreement():
    ds = Match((4,), _tree({(5,): 4}, root=4))
    live = Match((3, 4), _tree({(5,): 2, (5, 6): 2}, root=2))
    local = Match((4,), _tree({(5,): 1}, root=1))
    outputs = Match((2, 3, 4), _tree({(5,): 3, (5, 6): 1, (7,): 1}, root=4))
    t = node_table({"ds": ds, "live": live, "local": local, "outputs": outputs})
    assert t is not None
    assert _paths(t) == [(5,), (5, 6), (7,)]
    x = t.features
    assert x[0, F["agree"]] == 3 and x[1, F["agree"]] == 1 and x[2, F["agree"]] == 0
    assert x[0, F["live_log_n"]] == pytest.approx(np.log1p(2))
    assert x[0, F["outputs_log_n"]] == pytest.approx(np.log1p(3))
    assert x[1, F["live_on"]] == 1 and x[1, F["ds_on"]] == 0 and x[1, F["outputs_ratio"]] == pytest.approx(1 / 4)
    assert x[2, F["ds_miss"]] == 1 and x[2, F["outputs_miss"]] == 0


def _random_tree(rng, vocab=6, nodes=12) -> TokenTree:
    paths: dict[tuple, int] = {}
    frontier = [()]
    while len(paths) < nodes:
        base = frontier[rng.integers(len(frontier))]
        path = base + (int(rng.integers(vocab)),)
        if path in paths or len(path) > 5:
            continue
        paths[path] = 0
        frontier.append(path)
    counts = {p: 0 for p in paths}
    for p in paths:  # each node counts one occurrence of each path through it
        for k in range(1, len(p) + 1):
            counts[p[:k]] += 1
    return _tree(counts, root=max(counts.values()) + 1)


def test_scores_and_acceptance_against_oracles():
    rng = np.random.default_rng(0)
    cal = Calibration(rng.normal(size=len(FEATURES)), -0.5)
    for _ in range(50):
        a, b = _random_tree(rng), _random_tree(rng)
        t = node_table({"ds": Match((1, 2), a), "local": Match((2,), b)})
        assert t is not None
        paths = _paths(t)
        assert len(set(paths)) == len(paths) == len(set(a.paths()) | set(b.paths()))  # the exact union
        q, p = cal.conditional(t.features), cal.scores(t)
        for i, path in enumerate(paths):  # P(node) = product of conditionals along its path
            expect = np.prod([q[paths.index(path[:k])] for k in range(1, len(path) + 1)])
            assert p[i] == pytest.approx(expect)
        ref = rng.integers(6, size=8)
        pos = int(rng.integers(0, 4))
        ok = accepted_mask(t.tokens, t.parents, t.depths, reference_predictions(t.depths, ref, pos))
        assert ok.tolist() == [tuple(ref[pos:pos + len(path)].tolist()) == path for path in paths]


def test_back_off_chooses_the_largest_expected_accepted_length():
    rng = np.random.default_rng(1)
    cal = Calibration(rng.normal(size=len(FEATURES)), 0.0)
    for _ in range(30):
        cands = [Match(tuple(range(n)), _random_tree(rng)) for n in (3, 2, 1)]
        local = Match((9,), _random_tree(rng))
        for budget, chain in ((3, False), (8, False), (3, True), (64, True)):
            draft, chosen = draft_from_candidates(cal, cands, {"local": local}, budget, chain=chain)
            gains = [draft_from_candidates(cal, [c], {"local": local}, budget, chain=chain)[0].scores.sum()
                     for c in cands]
            assert chosen == int(np.argmax(gains)) and draft.scores.sum() == pytest.approx(max(gains))
            assert len(draft) <= budget
            if chain:
                assert draft.parents.tolist() == list(range(-1, len(draft) - 1))
            else:  # prefix-closed, best first
                assert all(p < i for i, p in enumerate(draft.parents.tolist()))
                assert np.all(np.diff(draft.scores) <= 1e-12)
    empty, chosen = draft_from_candidates(cal, [], {}, 8)
    assert len(empty) == 0 and chosen == -1
    with pytest.raises(ValueError, match="budget"):
        draft_from_candidates(cal, [], {}, -1)


def test_budget_stops_where_the_expected_gain_falls_below_the_node_cost():
    rng = np.random.default_rng(2)
    cal = Calibration(rng.normal(size=len(FEATURES)), 1.0)
    local = Match((9,), _random_tree(rng, nodes=20))
    full, _ = draft_from_candidates(cal, [], {"local": local}, 20)
    cost = float(np.median(full.scores))
    cut, _ = draft_from_candidates(cal, [], {"local": local}, 20, min_score=cost)
    assert len(cut) == int((full.scores >= cost).sum()) and np.all(cut.scores >= cost)


def test_fit_recovers_a_known_model():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40_000, len(FEATURES)))
    w = np.zeros(len(FEATURES))
    w[F["ds_ratio"]], w[F["local_ratio"]], w[F["log_depth"]] = 2.0, 3.0, -1.0
    y = rng.random(len(x)) < 1 / (1 + np.exp(-(x @ w - 0.5)))
    cal = Calibration.fit(x[:30_000], y[:30_000], meta={"what": "synthetic"})
    held = cal.conditional(x[30_000:])
    truth = 1 / (1 + np.exp(-(x[30_000:] @ w - 0.5)))
    assert np.abs(held - truth).mean() < 0.02
    assert cal.coef[F["local_ratio"]] == pytest.approx(3.0, abs=0.2)
    with pytest.raises(ValueError, match="one class"):
        Calibration.fit(x[:10], np.ones(10, bool))
    with pytest.raises(ValueError, match="do not match"):
        Calibration.fit(x[:10, :3], y[:10])


def test_save_load_round_trip_and_refusals(tmp_path):
    cal = Calibration(np.arange(len(FEATURES), dtype=float), 0.25, 1.0, {"fit_prompts": 3})
    cal.save(tmp_path / "c.json")
    back = Calibration.load(tmp_path / "c.json")
    assert np.array_equal(back.coef, cal.coef) and back.intercept == 0.25 and back.meta == {"fit_prompts": 3}
    with pytest.raises(FileNotFoundError, match="calibrate.py"):
        Calibration.load(tmp_path / "missing.json")
    (tmp_path / "old.json").write_text('{"features": ["a"], "coef": [1], "intercept": 0, "prior": 1}')
    with pytest.raises(ValueError, match="refit"):
        Calibration.load(tmp_path / "old.json")


def test_shipped_calibration_was_fitted_on_one_half_and_reported_on_the_other():
    cal = Calibration.load()
    meta = cal.meta
    assert meta["half"].startswith("fit") and meta["fit_prompts"] > 100 and meta["fit_rows"] > 10_000
    for name in ("spec_bench", "humaneval"):
        rep = meta["report"][name]
        uncalibrated = rep.get("ece_count_ratio", rep.get("ece_noisy_or"))  # the baseline it was reported against
        assert rep["prompts"] > 0 and rep["ece_calibrated"] < uncalibrated
    assert cal.meta["local"] == cal.local_strategy().config() and cal.meta["outputs"]["max_bytes"] > 0
    # a node both the corpus and the request itself predict, with a high ratio, beats one only the corpus predicts
    both = np.zeros(len(FEATURES))
    both[[F["ds_on"], F["local_on"]]] = 1
    both[[F["ds_ratio"], F["local_ratio"]]] = 0.8
    both[F["agree"]] = 1
    alone = both.copy()
    alone[[F["local_on"], F["local_ratio"], F["agree"]]] = 0
    assert cal.conditional(both[None])[0] > cal.conditional(alone[None])[0]


@pytest.mark.parametrize("chain", [False, True])
def test_calibrated_back_off_drafts_are_lossless(target, eval_prompts, chat_datastore, database_url, tokenizer, chain):
    from datastore.shared import SharedDatastore
    from decoder import greedy_generate, speculative_generate
    from decoder.drafters import DatastoreSource
    from decoder.service import DraftingService

    source = DatastoreSource(lambda: SharedDatastore.open(chat_datastore, tokenizer=tokenizer,
                                                          database_url=database_url))
    service = DraftingService(source)
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
    """The service's drafts are the reference merge of the same candidates: every stored suffix for large trees,
    the longest one for chains and small trees."""
    from datastore.shared import SharedDatastore
    from decoder.core import MATCH_NODES, PythonCore
    from decoder.drafters import DatastoreSource
    from decoder.service import DraftingService

    cal = Calibration.load()
    source = DatastoreSource(lambda: SharedDatastore.open(chat_datastore, tokenizer=tokenizer,
                                                          database_url=database_url))
    service = DraftingService(source, core=PythonCore(cal, outputs_bytes=0))
    differs = 0
    try:
        for p in eval_prompts:
            ids = list(p.token_ids)
            for cut in range(8, len(ids), 9):
                service.start_request("r", ids[:cut])
                own = cal.local_strategy().new()
                own.extend(ids[:cut])
                cands = source.candidates_batch([ids[:cut]])[0]
                for budget, chain, pool in ((64, False, cands), (8, False, cands[:1]), (64, True, cands[:1])):
                    got = service.propose([("r", budget)], chain=chain)[0]
                    want, _ = draft_from_candidates(cal, pool, {"local": own.match(max(budget, MATCH_NODES))}, budget,
                                                    chain=chain)
                    assert got.token_ids.tolist() == want.token_ids.tolist()
                    assert np.array_equal(got.scores, want.scores)
                longest, _ = draft_from_candidates(cal, cands[:1], {"local": own.match(MATCH_NODES)}, 64)
                differs += longest.token_ids.tolist() != service.propose([("r", 64)])[0].token_ids.tolist()
                service.stop_request("r")
    finally:
        source.close()
    assert differs > 0  # the back-off chose a shorter n-gram somewhere
    with pytest.raises(ValueError, match="back_off_min_budget"):
        DraftingService(None, core=PythonCore(cal), back_off_min_budget=-1)
