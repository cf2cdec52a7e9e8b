"""Sources: the truncated ShareGPT file, malformed records of every kind, code trees, JSONL, Parquet, chat records
(OpenAI JSON Lines, Hugging Face Parquet, ShareGPT JSON; plain, gzip and zstd)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ingest.chats import flatten_conversation
from ingest.errors import SourceError
from ingest.sources import default_sharegpt_path, iter_documents
from toolkit.tokenizer import render_chat


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


def test_a_reader_that_stops_early_leaves_no_noise_at_exit():
    """A process that reads one batch of the packaged ShareGPT and exits with the reader still open prints nothing:
    the streaming parser's generator is closed at exit without touching what the interpreter has torn down."""
    import subprocess
    import sys

    code = ("from toolkit import load_tokenizer\nfrom ingest.sources import iter_documents\n"
            "_, batches = iter_documents('sharegpt', None, tokenizer=load_tokenizer())\nnext(iter(batches))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-2000:]


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

    from ingest.files import python_source_roots

    roots = python_source_roots()
    assert Path(sysconfig.get_paths()["stdlib"]).resolve() in roots
    assert Path(sysconfig.get_paths()["purelib"]).resolve() in roots
    report, batches = iter_documents("code", None, limit=3)
    docs = [t for b in batches for t in b.column(0).to_pylist()]
    assert len(docs) == 3 and report.documents == 3 and str(roots[0]) in report.path


# --- --source chat -------------------------------------------------------------------------------------------

def _compress(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, gzip- or zstd-compressed by its name (zstd as two frames, as a file
    concatenated from two compressed parts is)."""
    import gzip

    import zstandard

    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    elif path.name.endswith(".zst"):
        half = len(data) // 2
        cctx = zstandard.ZstdCompressor()
        data = cctx.compress(data[:half]) + cctx.compress(data[half:])
    path.write_bytes(data)


def _jsonl_bytes(records) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in records)


def _chat(path, tokenizer, **kw):
    return _texts(iter_documents("chat", path, tokenizer=tokenizer, **kw))


SYSTEM_CHAT = [{"role": "system", "content": "You answer in French."},
               {"role": "user", "content": "How do I open a file in Python?"},
               {"role": "assistant", "content": "Avec open(chemin), puis lisez-le."},
               {"role": "user", "content": "And close it?"},
               {"role": "assistant", "content": "Avec close(), ou un bloc with."}]
PLAIN_CHAT = [{"role": "user", "content": "Name a prime number."}, {"role": "assistant", "content": "Seven."}]

# one row per kind of bad record: (the line, the reason it is counted under)
BAD_CHAT_RECORDS = [
    (b"{not json", "invalid JSON"),
    (b'{"messages": [{"role": "user", "content": "caf\xe9"}]}', "undecodable bytes"),
    (b"[1, 2]", "record is not an object"),
    (b'"just text"', "record is not an object"),
    (b'{"id": "no turns"}', "missing field: messages"),
    (b'{"messages": null}', "missing field: messages"),
    (b'{"messages": "hello"}', "wrong type: messages"),
    (b'{"messages": []}', "empty messages"),
    (b'{"messages": [{"role": "user", "content": "   "}, {"role": "assistant", "content": null}]}', "empty messages"),
    (b'{"messages": [{"role": "tool", "content": "42"}]}', "empty messages"),  # nothing but a skipped turn
    (b'{"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}]}', "unknown role"),
    (b'{"messages": [{"role": 3, "content": "hi"}]}', "wrong type: role"),
    (b'{"messages": [{"content": "who is speaking?"}]}', "missing field: role/content"),
    (b'{"messages": [{"role": "user"}]}', "missing field: role/content"),
    (b'{"messages": ["hello"]}', "missing field: role/content"),
    (b'{"messages": [{"role": "user", "content": 5}]}', "wrong type: content"),
    (b'{"messages": [{"role": "user", "content": {"text": "hi"}}]}', "wrong type: content"),
    (b'{"messages": [{"role": "user", "content": ["hi"]}]}', "wrong type: content"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": 7}]}]}', "wrong type: content"),
    (b'{"conversations": [{"from": "human"}]}', "missing field: from/value"),
    (b'{"conversations": [{"from": "human", "value": 1}]}', "wrong type: from/value"),
    (b'{"conversations": [{"from": "gpt", "value": " "}]}', "empty text"),
]


@pytest.mark.parametrize("line,reason", BAD_CHAT_RECORDS, ids=[r for _, r in BAD_CHAT_RECORDS])
def test_bad_chat_record_is_counted_and_the_good_ones_kept_whole(tmp_path, tokenizer, line, reason):
    path = tmp_path / "log.jsonl"
    path.write_bytes(_jsonl_bytes([{"messages": SYSTEM_CHAT, "model": "x"}, line, {"messages": PLAIN_CHAT}]))
    report, texts = _chat(path, tokenizer)
    assert dict(report.malformed) == {reason: 1}
    assert texts == [render_chat(tokenizer, SYSTEM_CHAT), render_chat(tokenizer, PLAIN_CHAT)]
    assert report.documents == 2 and report.duplicates == 0 and report.notes == []


def test_every_bad_chat_record_at_once_compressed(tmp_path, tokenizer):
    path = tmp_path / "log.jsonl.gz"
    lines = [line for line, _ in BAD_CHAT_RECORDS]
    _compress(path, _jsonl_bytes([lines[0], {"messages": SYSTEM_CHAT}, *lines[1:], {"messages": PLAIN_CHAT}]))
    report, texts = _chat(path, tokenizer)
    want: dict[str, int] = {}
    for _, reason in BAD_CHAT_RECORDS:
        want[reason] = want.get(reason, 0) + 1
    assert dict(report.malformed) == want
    assert texts == [render_chat(tokenizer, SYSTEM_CHAT), render_chat(tokenizer, PLAIN_CHAT)]


def test_openai_jsonl_plain_gzip_and_zstd_give_the_same_documents(tmp_path, tokenizer):
    records = [{"messages": SYSTEM_CHAT, "id": "a", "usage": {"total_tokens": 40}},
               {"messages": PLAIN_CHAT},
               {"messages": [{"role": "developer", "content": "Be brief."}, *PLAIN_CHAT]},
               {"messages": SYSTEM_CHAT}]  # a duplicate of the first
    runs = {}
    for name in ("log.jsonl", "log.jsonl.gz", "log.jsonl.zst"):
        _compress(tmp_path / name, _jsonl_bytes(records * 50))  # several zstd blocks and both frames
        runs[name] = _chat(tmp_path / name, tokenizer)
    report, texts = runs["log.jsonl"]
    assert texts == [render_chat(tokenizer, SYSTEM_CHAT), render_chat(tokenizer, PLAIN_CHAT),
                     render_chat(tokenizer, [{"role": "system", "content": "Be brief."}, *PLAIN_CHAT])]
    assert report.duplicates == 4 * 50 - 3 and not report.malformed and not report.notes
    for name in ("log.jsonl.gz", "log.jsonl.zst"):
        unnamed = {"path": "", "digest": ""}  # the same records, in files of other names
        assert runs[name][1] == texts and runs[name][0].as_dict() | unnamed == report.as_dict() | unnamed
    # the rendering keeps the system prompt, every turn and the assistant's answers, in order
    first = texts[0]
    positions = [first.index(m["content"]) for m in SYSTEM_CHAT]
    assert positions == sorted(positions) and "You are a helpful AI assistant" not in first
    assert first.count("<|im_start|>assistant\n") == 2


def test_tool_turns_and_non_text_parts_are_skipped_and_counted(tmp_path, tokenizer):
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}
    messages: list[dict] = [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"},
                                     {"type": "text", "text": "In Celsius."}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 4}"},
        {"role": "assistant", "content": "It is 4 degrees in Oslo."},
        {"role": "user", "content": [{"type": "text", "text": "And this?"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [call]},
        {"role": "function", "name": "weather", "content": "{\"temp\": 5}"},
        {"role": "assistant", "content": None, "function_call": {"name": "weather", "arguments": "{}"}},
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}]},
        {"role": "assistant", "content": "Anything else?"},
    ]
    path = tmp_path / "tools.jsonl"
    path.write_bytes(_jsonl_bytes([{"messages": messages, "tools": [{"type": "function"}]}]))
    report, texts = _chat(path, tokenizer)
    kept = [messages[0], {"role": "user", "content": "Weather in Oslo?\nIn Celsius."}, messages[4], messages[10]]
    assert texts == [render_chat(tokenizer, kept)]
    assert dict(report.malformed) == {"tool turn skipped": 2, "tool_calls turn skipped": 3,
                                      "non-text content skipped": 2}
    assert report.documents == 1


def test_a_chat_template_that_refuses_a_conversation_is_counted(tmp_path, tokenizer):
    import copy

    strict = copy.copy(tokenizer)  # the real tokenizer with a template that refuses everything
    strict.chat_template = "{{ raise_exception('roles must alternate') }}"
    path = tmp_path / "log.jsonl"
    path.write_bytes(_jsonl_bytes([{"messages": PLAIN_CHAT}]))
    report, texts = _chat(path, strict)
    assert texts == [] and dict(report.malformed) == {"chat template error": 1}
    assert _chat(path, tokenizer)[1] == [render_chat(tokenizer, PLAIN_CHAT)]  # the fixture is untouched


def _turns_table(column: str, rows, keys: tuple[str, str]) -> pa.Table:
    turn = pa.struct([(keys[0], pa.string()), (keys[1], pa.string())])
    return pa.table({"id": list(range(len(rows))), column: pa.array(rows, pa.list_(turn))})


def test_parquet_messages_column(tmp_path, tokenizer):
    path = tmp_path / "train.parquet"
    rows = [SYSTEM_CHAT, None, [{"role": "alien", "content": "x"}], PLAIN_CHAT, SYSTEM_CHAT]
    pq.write_table(_turns_table("messages", rows, ("role", "content")), path)
    report, texts = _chat(path, tokenizer)
    assert texts == [render_chat(tokenizer, SYSTEM_CHAT), render_chat(tokenizer, PLAIN_CHAT)]
    assert dict(report.malformed) == {"missing field: messages": 1, "unknown role": 1}
    assert report.duplicates == 1


def test_parquet_conversations_column_is_chosen_and_chat_field_overrides(tmp_path, tokenizer):
    sharegpt = [[{"from": "system", "value": "Be terse."}, {"from": "human", "value": "2+2?"},
                 {"from": "gpt", "value": "4"}]]
    as_messages = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"},
                   {"role": "assistant", "content": "4"}]
    path = tmp_path / "sharegpt.parquet"
    pq.write_table(_turns_table("conversations", sharegpt, ("from", "value")), path)
    report, texts = _chat(path, tokenizer)
    assert texts == [render_chat(tokenizer, as_messages)] and not report.malformed
    # both columns: messages is read, unless --chat-field names the other (or any) column
    both = tmp_path / "both.parquet"
    table = _turns_table("conversations", sharegpt, ("from", "value"))
    pq.write_table(table.append_column("messages", _turns_table("m", [PLAIN_CHAT], ("role", "content")).column("m")),
                   both)
    assert _chat(both, tokenizer)[1] == [render_chat(tokenizer, PLAIN_CHAT)]
    assert _chat(both, tokenizer, chat_field="conversations")[1] == [render_chat(tokenizer, as_messages)]
    dialog = tmp_path / "dialog.parquet"
    pq.write_table(_turns_table("dialog", [PLAIN_CHAT], ("role", "content")), dialog)
    report, texts = _chat(dialog, tokenizer, chat_field="dialog")
    assert texts == [render_chat(tokenizer, PLAIN_CHAT)]
    with pytest.raises(SourceError, match=r"no column 'messages' or 'conversations' \(columns: \['id', 'dialog'\]\)"
                                          r".*--chat-field"):
        _chat(dialog, tokenizer)
    with pytest.raises(SourceError, match=r"no column 'turns'.*--chat-field"):
        _chat(dialog, tokenizer, chat_field="turns")
    with pytest.raises(SourceError, match=r"column 'id' is int64, not a list of turns"):
        _chat(dialog, tokenizer, chat_field="id")


def test_sharegpt_json_through_chat_equals_sharegpt(sharegpt_sample, tokenizer, tmp_path):
    report, texts = _texts(iter_documents("sharegpt", sharegpt_sample, tokenizer=tokenizer))
    gz = tmp_path / "sample.json.gz"
    _compress(gz, sharegpt_sample.read_bytes())  # a complete gzip stream of the cut-off JSON
    unique = list(dict.fromkeys(texts))  # chat drops exact duplicates, as the other corpus sources do
    for path in (sharegpt_sample, gz):
        chat_report, chat_texts = _chat(path, tokenizer)
        assert chat_texts == unique and len(unique) > 50
        assert chat_report.duplicates == len(texts) - len(unique)
        assert chat_report.malformed == report.malformed and chat_report.notes == report.notes
        assert any("cut off" in note for note in chat_report.notes)


def test_chat_reads_directories_globs_and_several_paths(tmp_path, tokenizer):
    root = tmp_path / "logs"
    (root / "day2").mkdir(parents=True)
    chats = [[{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
             for i in range(6)]
    _compress(root / "a.jsonl", _jsonl_bytes([{"messages": chats[0]}]))
    _compress(root / "day2" / "b.jsonl.gz", _jsonl_bytes([{"messages": chats[1]}, {"messages": chats[0]}]))
    _compress(root / "day2" / "c.json.zst", _jsonl_bytes([{"messages": chats[2]}]))  # .json, not an array: lines
    pq.write_table(_turns_table("messages", [chats[3]], ("role", "content")), root / "day2" / "d.parquet")
    (root / "e.json").write_text(json.dumps([{"id": "s", "conversations": [{"from": "human", "value": "question 4"},
                                                                           {"from": "gpt", "value": "answer 4"}]}]))
    (root / "notes.txt").write_text("not a corpus file\n")
    other = tmp_path / "other.jsonl"
    other.write_bytes(_jsonl_bytes([{"messages": chats[5]}]))
    want = [render_chat(tokenizer, chats[i]) for i in (0, 1, 2, 3, 4)]  # sorted paths: a, day2/b, day2/c, day2/d, e

    report, texts = _chat(root, tokenizer)
    assert texts == want and report.duplicates == 1 and not report.malformed
    _, texts = _chat((root, other), tokenizer)
    assert texts == [*want, render_chat(tokenizer, chats[5])]
    report, texts = _chat(Path(f"{root}/**/*.jsonl*"), tokenizer)
    assert texts == want[:2] and str(root) in report.path
    _, texts = _chat((Path(f"{root}/day2/*.parquet"), Path(f"{root}/*.json")), tokenizer)
    assert texts == [want[3], want[4]]
    with pytest.raises(SourceError, match="matches no file"):
        _chat(Path(f"{root}/*.csv"), tokenizer)
    with pytest.raises(SourceError, match="does not exist.*--source chat only"):
        iter_documents("jsonl", Path(f"{root}/*.jsonl"))


def test_cut_off_compressed_files_keep_their_complete_records(tmp_path, tokenizer):
    import gzip
    import zlib

    chats = [[{"role": "user", "content": f"question {i} " + "words " * 30}, {"role": "assistant", "content": f"{i}"}]
             for i in range(400)]
    data = _jsonl_bytes([{"messages": c} for c in chats])
    packed = gzip.compress(data)
    cut = packed[: len(packed) // 2]
    (tmp_path / "a-cut.jsonl.gz").write_bytes(cut)
    (tmp_path / "b-next.jsonl").write_bytes(_jsonl_bytes([{"messages": PLAIN_CHAT}]))
    complete = zlib.decompressobj(wbits=31).decompress(cut).count(b"\n")  # the lines whole before the cut
    report, texts = _chat(tmp_path, tokenizer)
    assert 0 < complete < len(chats)
    assert texts == [render_chat(tokenizer, c) for c in chats[:complete]] + [render_chat(tokenizer, PLAIN_CHAT)]
    assert not report.malformed  # the partial record is not a malformed one: the file is
    assert len(report.notes) == 1 and "a-cut.jsonl.gz" in report.notes[0] and "cut off" in report.notes[0]
    assert f"{complete:,} records" in report.notes[0]
    # zstd: a file cut part-way through a frame is noted too (its decoder would end quietly)
    import zstandard

    (tmp_path / "a-cut.jsonl.gz").unlink()
    packed = zstandard.ZstdCompressor().compress(data)
    (tmp_path / "a-cut.jsonl.zst").write_bytes(packed[: len(packed) - 20])
    report, texts = _chat(tmp_path, tokenizer)
    assert texts[-1] == render_chat(tokenizer, PLAIN_CHAT) and len(texts) < len(chats) + 1
    assert texts[:-1] == [render_chat(tokenizer, c) for c in chats[: len(texts) - 1]]
    assert len(report.notes) == 1 and "zstd file is cut off" in report.notes[0]
    # a cut-off gzip ShareGPT array: the complete records, and the note
    records = [{"id": str(i), "conversations": [{"from": "human", "value": f"q{i} " + "x " * 40},
                                                {"from": "gpt", "value": "ok"}]} for i in range(300)]
    packed = gzip.compress(json.dumps(records, indent=2).encode())
    array = tmp_path / "sharegpt.json.gz"
    array.write_bytes(packed[: len(packed) // 2])
    whole = zlib.decompressobj(wbits=31).decompress(packed[: len(packed) // 2]).count(b"\n  }")  # records closed
    report, texts = _chat(array, tokenizer)
    assert 0 < whole < len(records)
    assert texts == [flatten_conversation(r, tokenizer)[0] for r in records[:whole]]
    assert len(report.notes) == 1 and "gzip file is cut off" in report.notes[0]


def test_jsonl_source_reads_compressed_files(tmp_path):
    lines = [{"content": "def f():\n    return 1\n"}, {"content": 3}, {"content": "x = 2\n"}]
    results = []
    for name in ("stack.jsonl", "stack.jsonl.gz", "stack.jsonl.zst"):
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        _compress(folder / name, _jsonl_bytes(lines))
        results.append(_texts(iter_documents("jsonl", folder)))
    for report, texts in results:
        assert texts == ["def f():\n    return 1\n", "x = 2\n"]
        assert dict(report.malformed) == {"wrong type: content": 1}


# --- what a build read: document names, the digest, the packages -------------------------------------------------


def test_documents_are_named_where_they_came_from(code_sample, tmp_path):
    _, batches = iter_documents("code", code_sample)
    names = [n for b in batches for n in b.column("name").to_pylist()]
    assert names and all(Path(n).parent == code_sample and n.endswith(".py") for n in names)
    path = tmp_path / "rows.jsonl"
    path.write_text('{"content": "a"}\n{"content": 3}\n{"content": "b"}\n')
    _, batches = iter_documents("jsonl", path)
    assert [n for b in batches for n in b.column("name").to_pylist()] == [f"{path}#1", f"{path}#3"]


def test_the_digest_tells_corpora_apart(code_sample, tmp_path):
    def digest(path) -> str:
        report, batches = iter_documents("code", path)
        for _ in batches:
            pass
        return report.digest

    first = digest(code_sample)
    assert first and digest(code_sample) == first
    other = tmp_path / "more"
    other.mkdir()
    for f in sorted(code_sample.glob("*.py"))[:-1]:
        (other / f.name).write_bytes(f.read_bytes())
    assert digest(other) != first


def test_a_code_build_records_the_packages_it_read():
    import platform
    import sysconfig

    from ingest.files import python_source_roots
    from ingest.sources import installed_packages

    got = installed_packages(python_source_roots())
    assert got[str(python_source_roots()[0])] == [f"python=={platform.python_version()}"]
    site = Path(sysconfig.get_paths()["purelib"])
    assert any(p.lower().startswith("numpy==") for p in got[str(site)])
