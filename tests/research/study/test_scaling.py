"""The corpus-size study (:mod:`research.study.scaling`, :mod:`research.study.sizes`): the seeded code subset; the
command end to end on
small real corpora (every row from real builds and replays, the scaled top-t proportional to the tokens)."""

from __future__ import annotations

import csv
import json
import uuid

import pytest

from datastore.admin.catalog import list_datastores
from research.study.scaling import ScalingGrid
from research.study.sizes import site_package_subset


def _package(root, name: str, size: int) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("#" * size)
    (folder / "data.bin").write_bytes(b"x" * 10_000)  # not Python: not counted


def test_site_package_subset_is_seeded_whole_and_capped(tmp_path):
    site = tmp_path / "site-packages"
    for i in range(12):
        _package(site, f"pkg{i:02d}", 1000 * (i + 1))
    (site / "pkg00-1.0.dist-info").mkdir()
    (site / "single.py").write_text("x = 1\n")
    chosen, taken = site_package_subset((site,), 20_000, seed=7)
    assert chosen == site_package_subset((site,), 20_000, seed=7)[0]  # the seed decides
    assert taken <= 20_000 and taken == sum((p / "__init__.py").stat().st_size if p.is_dir() else p.stat().st_size
                                            for p in chosen)
    assert all(not p.name.endswith(".dist-info") for p in chosen)
    others = {tuple(site_package_subset((site,), 20_000, seed=s)[0]) for s in range(6)}
    assert len(others) > 1  # another seed, another share


def test_scaled_top_t_is_proportional_and_not_repeated():
    grid = ScalingGrid(top_t=(2000,), scaled_top_t=2000)
    assert grid.top_ts(100, 100) == [("fixed+scaled", 2000)]  # at the largest size: one build, on both lines
    assert grid.top_ts(25, 100) == [("fixed", 2000), ("scaled", 500)]
    with pytest.raises(ValueError, match="budgets"):
        ScalingGrid(tree_budgets=(), chain_budgets=())


@pytest.mark.slow
def test_corpus_size_cli_end_to_end(database_url, tmp_path, tokenizer):
    from evaluation.prompts import load_prompts
    from research.hf_bench.store import reference_store
    from research.study.cli import main
    from toolkit.tokenizer import DEFAULT_MODEL

    prefix = f"test-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out"
    argv = ["corpus-size", "--corpus", "sharegpt", "--corpus-limit", "60", "--limit", "1", "--max-new-tokens", "12",
            "--top-t", "300", "--scaled-top-t", "800", "--tree-budgets", "4", "--chain-budgets", "2",
            "--lookups", "30", "--workdir", str(tmp_path / "work"), "--out", str(out), "--name-prefix", prefix,
            "--database-url", database_url]
    assert main(argv) == 0
    with open(out / "study_corpus_size_builds.csv") as fh:
        builds = list(csv.DictReader(fh))
    with open(out / "study_corpus_size_accept.csv") as fh:
        accepts = list(csv.DictReader(fh))
    sizes = [b["size"] for b in builds if b["top_t_rule"].startswith("fixed")]
    assert sizes == ["10%", "33%", "100%"]
    tokens = {b["size"]: int(b["tokens"]) for b in builds}
    assert tokens["10%"] < tokens["33%"] < tokens["100%"]
    scaled = {b["size"]: int(b["top_t"]) for b in builds if b["top_t_rule"] == "scaled"}
    for size, top_t in scaled.items():
        assert top_t == max(1, round(800 * tokens[size] / tokens["100%"]))
    assert "100%" in scaled  # 800 differs from the fixed 300: built too
    for b in builds:
        assert int(b["peak_rss_bytes"]) > 0 and float(b["build_s"]) > 0 and int(b["bytes"]) > 0
        assert float(b["lookup_pg_p50_ms"]) > 0 and float(b["lookup_replica_p50_ms"]) > 0
        assert int(b["screen_contaminated"]) == 0 and set(json.loads(b["stages"])) >= {"count", "trees", "screen"}
    prompts = load_prompts("spec_bench", tokenizer, limit=1, half="report")
    store = reference_store(DEFAULT_MODEL, "float32", "spec_bench", 12)
    committed = sum(len(store.get(p.id, p.token_ids) or []) - 1 for p in prompts)  # after the prefill token
    pooled = [a for a in accepts if a["category"] == "all"]
    assert len(pooled) == len(builds) * 2 * 2  # datastore and merged, a tree and a chain
    for a in pooled:
        assert int(a["prompts"]) == len(prompts) and float(a["accept_length"]) >= 1.0
        assert float(a["accept_length"]) * int(a["steps"]) == pytest.approx(committed, abs=0.01)
    assert (out / "study_corpus_size_sharegpt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [r for r in list_datastores(database_url, include_all=True) if r["name"].startswith(prefix)]
