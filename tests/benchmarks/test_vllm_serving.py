"""The serving benchmark's rounds (``benchmarks/vllm_serving.py --repeats``): engines run in ABBA order, and every ratio
is taken within its round, so a host that slows down between rounds moves no ratio."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.vllm_serving import (
    _other_cpu,
    _process_cpu,
    _table,
    build_parser,
    common_forward_curve,
    over_rounds,
    runs_of,
    schedule,
)


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


def test_variants_run_beside_ours_and_a_custom_proposer_is_a_method():
    custom = "custom:research.experiments.oracle_cut.OracleCutProposer"
    args = build_parser().parse_args(["--methods", "suffix", "crest", custom, "--variant", "CREST_LIVE=0"])
    assert runs_of(args) == [("suffix", {}), ("crest", {}), ("crest", {"CREST_LIVE": "0"}), (custom, {})]
    for refused in ("custom:NoDot", "eagle"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--methods", refused])
    with pytest.raises(SystemExit, match="pass it as --variant"):
        runs_of(build_parser().parse_args(["--env", "CREST_LIVE=0"]))


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


def _timed_run(method: str, steps: dict[int, int], slower: float, rest_s: float) -> dict:
    """An ``--accounting`` run of 100 output tokens whose forward pass over ``n`` tokens takes ``10 + n`` ms times
    ``slower`` (``steps[n]`` such passes), with ``rest_s`` seconds of other work."""
    forwards = [[(10.0 + n) * slower, n] for n, count in steps.items() for _ in range(count)]
    forward_s = sum(ms for ms, _ in forwards) / 1e3
    run = _run(method, 0, 1.0, [[1] * 50, [2] * 50])
    run["sets"]["spec_bench"] |= {"wall_s": forward_s + rest_s,
                                  "accounting": {"forward": [forward_s, len(forwards)], "forwards": forwards}}
    return run


def test_forward_passes_priced_at_one_curve_take_out_a_slower_host():
    """Ours ran while the host's forward pass was 1.5x slower: measured, it loses to suffix; with every run's forward
    passes priced at the pooled curve (ngram's and suffix's passes outvote ours at each token count), it takes fewer,
    larger steps and wins, by exactly what its steps and tokens cost at the shared curve."""
    results = [_timed_run("ngram", {1: 60, 2: 20}, 1.0, 0.2), _timed_run("suffix", {1: 30, 2: 40}, 1.0, 0.2),
               _timed_run("crest", {1: 10, 2: 20, 3: 20}, 1.5, 0.2)]
    assert common_forward_curve(results, "spec_bench", 8) == {1: 11.0, 2: 12.0, 3: 13.0 * 1.5}
    rows = {r["method"]: r for r in _table(results, ["spec_bench"])}
    suffix = 100 / (0.2 + (30 * 11 + 40 * 12) / 1e3)
    ours = 100 / (0.2 + (10 * 11 + 20 * 12 + 20 * 13 * 1.5) / 1e3)  # its 3-token passes are its own
    assert rows["suffix"]["tokens_per_s_common_forward"] == pytest.approx(suffix)
    assert rows["crest"]["tokens_per_s_common_forward"] == pytest.approx(ours)
    assert rows["crest"]["tokens_per_s"] < rows["suffix"]["tokens_per_s"] and ours > suffix
    summary = {e["method"]: e for e in over_rounds(list(rows.values()))}
    assert summary["crest"]["x_best_built_in_common_forward"] == pytest.approx([ours / suffix])
    assert summary["suffix"]["x_best_built_in_common_forward"] == [None]
    plain = _table([_run("crest", 0, 44.0, [[1, 2]])], ["spec_bench"])  # no --accounting: no such figure
    assert plain[0]["tokens_per_s_common_forward"] is None


def test_other_processes_cpu_is_summed_by_command_name():
    before = {1: ("postgres", 10.0), 2: ("postgres", 1.0), 3: ("python", 5.0), 4: ("bash", 2.0), 9: ("gone", 1.0),
              5: ("kworker/u8:0-writeback", 1.0)}
    after = {1: ("postgres", 10.5), 2: ("postgres", 1.25), 3: ("python", 5.0), 4: ("sleep", 0.5), 7: ("python", 0.2),
             5: ("kworker/u8:0-writeback", 1.25), 6: ("kworker/0:2-events", 0.125)}
    got = _other_cpu(before, after)
    # pid 4 is another program now (its pid reused): it counts whole; pid 3 took nothing; pid 9 ended unseen; the
    # kernel's workers are one entry, whatever work each is named by
    assert got == pytest.approx({"postgres": 0.75, "sleep": 0.5, "kworker": 0.375, "python": 0.2})
    assert list(got) == ["postgres", "sleep", "kworker", "python"]  # most first
    import os
    here = _process_cpu()
    assert os.getpid() not in here and os.getppid() in here and all(cpu >= 0 for _, cpu in here.values())
