"""The gate before scoring (:func:`evaluation.require_clean`): a datastore whose corpus holds scored prompts is refused,
by the function and by ``python -m evaluation``, naming the items and the documents; an unscreened one too, and
items its screen did not cover (another copy of the sets)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.eval_sets import read_rows


@pytest.fixture
def leaky_corpus(tmp_path) -> tuple[Path, str]:
    """A small code corpus: two ordinary files and one holding a HumanEval prompt with its solution."""
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "util.py").write_text("def twice(x):\n    return 2 * x\n\n\nprint(twice(21))\n")
    (root / "other.py").write_text("import math\n\n\ndef area(r):\n    return math.pi * r * r\n")
    row = read_rows("humaneval")[1]  # position 1: in the report half
    (root / "copied.py").write_text(row["prompt"] + row["canonical_solution"])
    return root, row["task_id"]


def test_a_contaminated_datastore_is_refused(database_url, ds_name, leaky_corpus, tokenizer):
    """The build records the screen; the gate and ``python -m research.hf_bench replay`` refuse to score HumanEval on
    it,
    naming the item and the file; Spec-Bench, which it does not hold, is scored."""
    from evaluation import Contaminated, require_clean
    from evaluation.prompts import load_prompts
    from ingest.build import BuildConfig, build_datastore

    root, task = leaky_corpus
    result = build_datastore(BuildConfig(name=ds_name, source="code", path=root, top_t=500,
                                         database_url=database_url), progress=False)
    screen = result.report["contamination"]["parts"]["humaneval"]
    assert screen["contaminated"] == 1 and task in screen["overlaps"]
    ids = [p.id for p in load_prompts("humaneval", tokenizer, half="report")]
    with pytest.raises(Contaminated, match=re.escape(task)) as refused:
        require_clean(database_url, ds_name, "humaneval", ids)
    assert "copied.py" in str(refused.value)
    assert require_clean(database_url, ds_name, "humaneval", [i for i in ids if i != task])["humaneval"][
        "contaminated"] == 0
    chat = require_clean(database_url, ds_name, "spec_bench", ["writing-81"])
    assert chat["spec_bench"]["contaminated"] == 0
    cmd = [sys.executable, "-m", "research.hf_bench", "replay", "--set", "humaneval", "--drafter", "datastore",
           "--datastore", ds_name, "--database-url", database_url, "--limit", "2", "--budget", "4"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    assert task in out.stderr and "copied.py" in out.stderr


def test_an_unscreened_datastore_is_refused(database_url, ds_name, code_sample):
    from evaluation import NotScreened, require_clean
    from ingest.build import BuildConfig, build_datastore

    build_datastore(BuildConfig(name=ds_name, source="code", path=code_sample, top_t=200, database_url=database_url,
                                screen=False), progress=False)
    with pytest.raises(NotScreened, match="--engine duckdb"):
        require_clean(database_url, ds_name, "humaneval", ["HumanEval/1"])


def test_items_the_screen_did_not_cover_are_refused(database_url, ds_name, code_sample, tmp_path):
    """The gate passes only items the build screened, text for text: another copy of the sets, with another text
    under a scored id or an id the build never saw, is refused, naming the items; the copy the build screened
    passes."""
    from evaluation import NotScreened, require_clean
    from ingest.build import BuildConfig, build_datastore
    from toolkit.eval_sets import PACKAGED

    build_datastore(BuildConfig(name=ds_name, source="code", path=code_sample, top_t=200, database_url=database_url),
                    progress=False)
    rows = read_rows("humaneval")
    ids = [rows[1]["task_id"], rows[3]["task_id"]]
    assert require_clean(database_url, ds_name, "humaneval", ids, PACKAGED)["humaneval"]["contaminated"] == 0
    other = tmp_path / "eval"
    shutil.copytree(PACKAGED, other)
    rows[3]["prompt"] += "    # another item under the same id\n"
    rows.append(rows[5] | {"task_id": "HumanEval/new"})
    (other / "humaneval" / "problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(NotScreened, match=re.escape(f"{rows[3]['task_id']} (humaneval)")) as refused:
        require_clean(database_url, ds_name, "humaneval", ids, other)
    assert rows[1]["task_id"] + " " not in str(refused.value)  # the item it screened is not named
    with pytest.raises(NotScreened, match="HumanEval/new"):
        require_clean(database_url, ds_name, "humaneval", ["HumanEval/new"], other)
