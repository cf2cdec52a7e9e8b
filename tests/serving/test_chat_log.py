"""The request log (:mod:`serving.chat_log`): whole OpenAI-format lines, rotation by size with nothing lost while the
backups last, the ASGI middleware on JSON and streamed responses (what is logged, what is not), and the options of
``python -m serving`` that turn it on. The served run itself is logged in tests/serving/test_server.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from serving.chat_log import ChatLog, ChatLogMiddleware
from serving.server import build_parser, log_env, vllm_argv


def _lines(log: ChatLog) -> list[str]:
    files = sorted(log.path.parent.glob(log.path.name + "*"), key=lambda p: -int(p.suffix[1:] or 0)
                   if p.suffix[1:].isdigit() else 0)
    return [line for f in files for line in f.read_text(encoding="utf-8").splitlines()]


def test_lines_are_whole_and_rotation_keeps_every_chat(tmp_path):
    log = ChatLog(tmp_path / "requests.jsonl", max_bytes=2048, backups=50)
    sent = []
    for i in range(60):
        messages = [{"role": "user", "content": f"question {i} é" + "x" * (i * 7)}]
        log.write(messages, f"answer {i}")
        sent.append({"messages": [*messages, {"role": "assistant", "content": f"answer {i}"}]})
    log.close()
    files = list(tmp_path.glob("requests.jsonl*"))
    assert len(files) > 5 and all(f.stat().st_size <= 2048 for f in files)
    got = [json.loads(line) for line in _lines(log)]  # every line parses: none cut by a rotation
    assert got == sent and log.written == 60


def test_bad_settings_and_a_missing_folder_are_refused(tmp_path):
    with pytest.raises(ValueError, match="max_bytes=10 must be >= 1024"):
        ChatLog(tmp_path / "x.jsonl", max_bytes=10)
    with pytest.raises(FileNotFoundError, match="create it or log elsewhere"):
        ChatLog(tmp_path / "missing" / "x.jsonl")
    with pytest.raises(ValueError, match="CREST_LOG_BACKUPS"):
        ChatLog.from_env({"CREST_LOG_REQUESTS": str(tmp_path / "x.jsonl"), "CREST_LOG_BACKUPS": "many"})
    assert ChatLog.from_env({}) is None  # off by default


def _app(status: int, body: list[bytes], content_type: bytes):
    async def app(scope, receive, send) -> None:
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]})
        for i, chunk in enumerate(body):
            await send({"type": "http.response.body", "body": chunk, "more_body": i < len(body) - 1})
    return app


def _call(middleware, request: dict, path: str = "/v1/chat/completions") -> None:
    raw = json.dumps(request).encode()
    parts = [raw[:10], raw[10:]]  # the body in two messages

    async def receive():
        return {"type": "http.request", "body": parts.pop(0), "more_body": bool(parts)}

    async def send(message) -> None:
        pass

    asyncio.run(middleware({"type": "http", "method": "POST", "path": path}, receive, send))


def _sse(*events) -> list[bytes]:
    text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    data = text.encode()
    return [data[i:i + 7] for i in range(0, len(data), 7)]  # events cut anywhere


def test_middleware_logs_finished_chats_only(tmp_path):
    log = ChatLog(tmp_path / "r.jsonl")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    ok = {"choices": [{"index": 1, "message": {"role": "assistant", "content": "Second."}},
                      {"index": 0, "message": {"role": "assistant", "content": "First."}}]}
    _call(ChatLogMiddleware(_app(200, [json.dumps(ok).encode()], b"application/json"), log), {"messages": messages})
    stream = _sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
                  {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
                  {"choices": [{"index": 0, "delta": {"content": "lo."}, "finish_reason": "stop"}]})
    _call(ChatLogMiddleware(_app(200, stream, b"text/event-stream"), log), {"messages": messages, "stream": True})
    # not logged: a refused request, a stream cut before [DONE], a tool call with no text, another endpoint
    _call(ChatLogMiddleware(_app(400, [b'{"error": "bad"}'], b"application/json"), log), {"messages": messages})
    _call(ChatLogMiddleware(_app(200, stream[:-3], b"text/event-stream"), log), {"messages": messages})
    tool = {"choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [{}]}}]}
    _call(ChatLogMiddleware(_app(200, [json.dumps(tool).encode()], b"application/json"), log), {"messages": messages})
    _call(ChatLogMiddleware(_app(200, [json.dumps(ok).encode()], b"application/json"), log), {"prompt": "x"},
          path="/v1/completions")
    log.close()
    got = [json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert [g["messages"][-1]["content"] for g in got] == ["First.", "Second.", "Hello."]
    assert all(g["messages"][:2] == messages and g["messages"][-1]["role"] == "assistant" for g in got)


def test_serving_options_turn_the_log_on(tmp_path):
    args, rest = build_parser().parse_known_args(["--model", str(tmp_path), "--log-requests", str(tmp_path / "r.jsonl"),
                                                  "--port", "1"])
    argv = vllm_argv(args, rest)
    assert argv[argv.index("--middleware") + 1] == "serving.chat_log.ChatLogMiddleware" and argv[-2:] == ["--port", "1"]
    assert log_env(args) == {"CREST_LOG_REQUESTS": str((tmp_path / "r.jsonl").resolve()),
                             "CREST_LOG_MAX_BYTES": "100000000", "CREST_LOG_BACKUPS": "10"}
    off, rest = build_parser().parse_known_args(["--model", str(tmp_path)])
    assert "--middleware" not in vllm_argv(off, rest) and log_env(off) == {}
