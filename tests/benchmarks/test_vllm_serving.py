"""The serving benchmark's rounds (``benchmarks/vllm_serving.py --repeats``): engines run in ABBA order, and every ratio
is taken within its round, so a host that slows down between rounds moves no ratio."""

from __future__ import annotations

import numpy as np
import pytest
from vllm_serving import _table, build_parser, over_rounds, schedule


def test_each_round_runs_in_the_reverse_order_of_the_one_before():
    runs = [("none", {}), ("suffix", {}), ("crest", {}), ("crest", {"CREST_LIVE": "0"})]
    order = schedule(runs, [1, 8], 3)
    assert len(order) == 2 * 3 * len(runs)
    for c in (1, 8):
        for rnd in range(3):
            got = [run for cc, r, run in order if cc == c and r == rnd]
            assert got == (runs if rnd % 2 == 0 else runs[::-1])
    assert [c for c, _, _ in order] == sorted(c for c, _, _ in order)  # one concurrency's rounds, then the next's
    assert schedule(runs, [1], 1) == [(1, 0, run) for run in runs]  # one round: the order as given
    assert build_parser().parse_args([]).repeats == 1
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--repeats", "0"])


def _run(method: str, rnd: int, tok_s: float, outputs: list[list[int]]) -> dict:
    """A run as a child writes it, reduced to what the table reads: ``tok_s`` tokens a second on one set."""
    tokens = sum(map(len, outputs))
    return {"method": method, "k": 8, "concurrency": 8, "round": rnd,
            "sets": {"spec_bench": {"prompts": ["a", "b"], "outputs": outputs, "tokens": tokens,
                                    "wall_s": tokens / tok_s, "tpot_s": 0.03, "counters": {}}}}


def test_every_ratio_is_taken_within_its_round():
    """Round 1 ran on a host 1.6x slower than round 0: the tok/s move, the ratios do not."""
    out = [[1, 2, 3, 4], [5, 6, 7]]
    speed = {"none": 30.0, "ngram": 36.0, "suffix": 40.0, "crest": 44.0}
    results = [_run(m, rnd, v / (1.6 if rnd else 1.0), out) for rnd in (0, 1) for m, v in speed.items()]
    rows = _table(results, ["spec_bench"])
    for row in rows:
        assert row["speedup_vs_none"] == pytest.approx(speed[row["method"]] / speed["none"])
        assert row["identical"] == 2
    summary = {e["method"]: e for e in over_rounds(rows)}
    ours = summary["crest"]
    assert ours["tokens_per_s"] == pytest.approx([44.0, 44.0 / 1.6])
    assert ours["tokens_per_s_median"] == pytest.approx(np.median([44.0, 44.0 / 1.6]))
    assert ours["x_none"] == pytest.approx([44.0 / 30.0] * 2)
    assert ours["x_best_built_in"] == pytest.approx([44.0 / 40.0] * 2)  # suffix, the faster built-in, in each round
    assert summary["suffix"]["x_best_built_in"] == [None, None] and summary["suffix"]["x_best_built_in_median"] is None
    # ratios against the faster round's peers would read 44 / 1.6 / 40 = 0.69 in round 1: not what is reported
    alone = over_rounds(_table([_run("crest", 0, 44.0, out)], ["spec_bench"]))
    assert alone[0]["x_none"] == [None] and alone[0]["x_best_built_in_median"] is None
