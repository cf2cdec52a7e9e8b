"""Sources: the truncated ShareGPT file, malformed records of every kind, code trees, JSONL, Parquet."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ingest.sources import SourceError, default_sharegpt_path, iter_documents


def _texts(report_and_batches):
    report, batches = report_and_batches
    texts = [t for b in batches for t in b.column(0).to_pylist()]
    return report, texts


def test_truncated_sharegpt_recovers_every_complete_record(sharegpt_sample, tokenizer):
    raw = sharegpt_sample.read_bytes()
    report, texts = _texts(iter_documents("sharegpt", sharegpt_sample, tokenizer=tokenizer))
    # count the complete records independently: the records a strict parser accepts from the text
    # up to the last complete one
    complete = raw[: raw.rfind(b'\n  },\n  {') + 4] + b"\n]"
    records = json.loads(complete)
    assert report.documents == len(texts) == len(records) - sum(report.malformed.values())
    assert len(texts) > 50
    assert any("cut off" in note and "dropped" in note for note in report.notes)
    assert texts[0].startswith("<|im_start|>system\n")  # flattened with the target's chat template


def test_packaged_corpus_is_found():
    assert default_sharegpt_path().stat().st_size > 100_000_000


def test_malformed_sharegpt_records_are_counted_by_reason(tmp_path, tokenizer):
    records = [
        {"id": "ok", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]},
        {"id": "no-conv"},
        {"id": "bad-type", "conversations": "text"},
        {"id": "bad-turn", "conversations": [{"from": "human"}]},
        {"id": "bad-role", "conversations": [{"from": "robot", "value": "x"}]},
        {"id": "empty", "conversations": [{"from": "human", "value": "   "}]},
        {"id": "turn-type", "conversations": [{"from": "human", "value": 3}]},
        "not an object",
    ]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(records))
    report, texts = _texts(iter_documents("sharegpt", path, tokenizer=tokenizer))
    assert len(texts) == 1 and "hello" in texts[0]
    assert dict(report.malformed) == {
        "missing field: conversations": 1, "wrong type: conversations": 1, "missing field: from/value": 1,
        "unknown role": 1, "empty text": 1, "wrong type: from/value": 1, "record is not an object": 1}


def test_code_tree_dedupes_and_counts_bad_files(code_sample):
    report, texts = _texts(iter_documents("code", code_sample))
    assert report.duplicates == 1
    assert report.malformed == {"undecodable bytes": 1, "empty text": 1}
    assert len(texts) == len(list(code_sample.glob("*.py"))) - 3


def test_jsonl_malformed_lines(tmp_path):
    path = tmp_path / "stack.jsonl"
    lines = [json.dumps({"content": "def f():\n    return 1\n"}), "{not json", json.dumps({"text": "x"}),
             json.dumps({"content": 5}), json.dumps({"content": ""}), json.dumps([1, 2]),
             json.dumps({"content": "def f():\n    return 1\n"})]
    path.write_text("\n".join(lines) + "\n")
    report, texts = _texts(iter_documents("jsonl", path))
    assert texts == ["def f():\n    return 1\n"]
    assert report.duplicates == 1
    assert dict(report.malformed) == {"invalid JSON": 1, "missing field: content": 1, "wrong type: content": 1,
                                      "empty text": 1, "record is not an object": 1}


def test_parquet_source_and_column_errors(tmp_path):
    path = tmp_path / "stack.parquet"
    pq.write_table(pa.table({"content": ["a = 1\n", None, "", "b = 2\n"], "n": [1, 2, 3, 4]}), path)
    report, texts = _texts(iter_documents("parquet", path))
    assert texts == ["a = 1\n", "b = 2\n"]
    assert dict(report.malformed) == {"missing field: content": 1, "empty text": 1}
    with pytest.raises(SourceError, match="no column 'body'"):
        _texts(iter_documents("parquet", path, text_field="body"))
    with pytest.raises(SourceError, match="is int64, not text"):
        _texts(iter_documents("parquet", path, text_field="n"))


def test_bad_paths_name_the_input(tmp_path):
    with pytest.raises(SourceError, match="does not exist"):
        iter_documents("code", tmp_path / "missing")
    with pytest.raises(SourceError, match="needs --path"):
        iter_documents("jsonl", None)
    with pytest.raises(SourceError, match="unknown --source"):
        iter_documents("csv", tmp_path)


def test_limit_stops_early(sharegpt_sample, tokenizer):
    report, texts = _texts(iter_documents("sharegpt", sharegpt_sample, tokenizer=tokenizer, limit=7))
    assert len(texts) == report.documents == 7


def test_code_reads_several_roots_and_each_site_packages_once(tmp_path):
    lib = tmp_path / "lib"
    (lib / "site-packages" / "pkg").mkdir(parents=True)
    (lib / "os_like.py").write_text("import sys\n")
    (lib / "site-packages" / "pkg" / "mod.py").write_text("VALUE = 1\n")
    other = tmp_path / "venv-site"
    other.mkdir()
    (other / "tool.py").write_text("def tool():\n    return 2\n")

    def texts(paths):
        return sorted(_texts(iter_documents("code", paths))[1])

    # the stdlib-like root skips its own site-packages unless that folder is a root too
    assert texts((lib, other)) == ["def tool():\n    return 2\n", "import sys\n"]
    assert texts((lib, lib / "site-packages", other)) == ["VALUE = 1\n", "def tool():\n    return 2\n", "import sys\n"]
    with pytest.raises(SourceError, match="reads one --path"):
        iter_documents("jsonl", (lib, other))


def test_code_defaults_to_this_interpreters_python_source():
    import sysconfig

    from ingest.sources import python_source_roots

    roots = python_source_roots()
    assert Path(sysconfig.get_paths()["stdlib"]).resolve() in roots
    assert Path(sysconfig.get_paths()["purelib"]).resolve() in roots
    report, batches = iter_documents("code", None, limit=3)
    docs = [t for b in batches for t in b.column(0).to_pylist()]
    assert len(docs) == 3 and report.documents == 3 and str(roots[0]) in report.path
