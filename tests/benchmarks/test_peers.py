"""The peer table (:mod:`benchmarks.peers`) prints the columns of the methods that ran, and no column of dashes."""

from __future__ import annotations

from benchmarks.peers import print_tables


def _rows(methods: dict[str, float]) -> list[dict]:
    return [{"set": "humaneval", "category": "all", "method": m, "form": "tree", "budget": 8, "accept_length": a}
            for m, a in methods.items()]


def test_only_the_columns_of_the_methods_that_ran(capsys):
    print_tables(_rows({"merged": 2.6, "ngram": 1.9}), ["merged", "ngram"])
    header, row = capsys.readouterr().out.splitlines()[:2]
    assert "merged/best peer" in header and "sglang" not in header
    assert row.split()[-1] == f"{2.6 / 1.9:.2f}"
    print_tables(_rows({"merged": 2.6, "sglang-bfs-corpus": 2.0}), ["merged", "sglang-bfs-corpus"])
    header = capsys.readouterr().out.splitlines()[0]
    assert "merged/sglang+corpus" in header
    print_tables(_rows({"merged": 2.6}), ["merged"])
    header, row = capsys.readouterr().out.splitlines()[:2]
    assert "/" not in header and "-" not in row.split()[3:]  # ours alone: no ratio columns at all
