"""The served chats, logged in the OpenAI chat format: ``python -m serving --log-requests PATH``.

Each chat completion the server finishes is appended to ``PATH`` as one JSON line, the request's messages followed by
the response::

    {"messages": [{"role": "system", ...}, {"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]}

which ``python -m ingest build --source chat --path PATH`` reads, so a deployment builds a datastore from its own
traffic. One line per choice; not logged: a refused request (any status but 200), a streamed response cut short, a
choice with no text, and every endpoint but ``/v1/chat/completions``. Lines are written whole by
:class:`logging.handlers.RotatingFileHandler` (rotated past ``max_bytes`` to ``PATH.1`` ..., ``backups`` kept); a file
that cannot be written is warned about once. :class:`ChatLogMiddleware` is the ASGI middleware vLLM's server loads
(``--middleware``), set by ``CREST_LOG_REQUESTS``, ``CREST_LOG_MAX_BYTES`` and ``CREST_LOG_BACKUPS``; one API server
process writes a log (with ``--api-server-count`` above 1, give each its own server).
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
from collections.abc import Mapping
from pathlib import Path

from toolkit.settings import DEFAULTS, Settings

__all__ = ["ChatLog", "ChatLogMiddleware"]

log = logging.getLogger(__name__)

CHAT_PATH = "/v1/chat/completions"


class _Lines(logging.handlers.RotatingFileHandler):
    """A rotating file of whole lines whose write errors are warned about once (not printed as tracebacks)."""

    warned = False

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        if not self.warned:
            self.warned = True
            log.warning("the request log %s cannot be written; serving goes on without it", self.baseFilename)


class ChatLog:
    """An append-only, size-rotated file of chats in the OpenAI format (one JSON object per line). Thread-safe.

    Args:
        path: the file (created when missing; its folder must exist).
        max_bytes: the size in bytes at which the file is rotated (>= 1024; default 100 MB).
        backups: rotated files kept, ``PATH.1`` the newest (>= 1; default 10).

    Attributes:
        written: chats written.

    Raises:
        ValueError: when ``max_bytes < 1024`` or ``backups < 1``.
        FileNotFoundError: when the folder of ``path`` does not exist.
    """

    def __init__(self, path: str | os.PathLike, *, max_bytes: int = DEFAULTS.log_max_bytes,
                 backups: int = DEFAULTS.log_backups) -> None:
        if max_bytes < 1024 or backups < 1:
            raise ValueError(f"max_bytes={max_bytes} must be >= 1024 and backups={backups} >= 1")
        self.path = Path(path).expanduser().resolve()
        if not self.path.parent.is_dir():
            raise FileNotFoundError(f"{path}: the folder {self.path.parent} does not exist; create it or log "
                                    "elsewhere")
        self._file = _Lines(self.path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=True)
        self._file.setFormatter(logging.Formatter("%(message)s"))
        self.written = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ChatLog | None:
        """The log ``python -m serving --log-requests`` asked for (``CREST_LOG_REQUESTS`` ...), or ``None``.

        Raises:
            ValueError: naming the variable, when one is malformed.
        """
        s = Settings.from_env(env)
        if s.log_requests is None:
            return None
        return cls(s.log_requests, max_bytes=s.log_max_bytes, backups=s.log_backups)

    def write(self, messages: list, answer: str) -> None:
        """Append one chat: the request's ``messages`` (as the client sent them) and the assistant's ``answer``."""
        line = json.dumps({"messages": [*messages, {"role": "assistant", "content": answer}]}, ensure_ascii=False)
        self._file.handle(logging.makeLogRecord({"msg": line, "levelno": logging.INFO}))
        self.written += 1

    def close(self) -> None:
        """Flush and close the file."""
        self._file.close()


class _Exchange:
    """One chat completion's request body and response, as they pass through the middleware."""

    def __init__(self) -> None:
        self.request: list[bytes] = []
        self.status = 0
        self.stream = False
        self.body: list[bytes] = []
        self._pending = b""
        self.done = False
        self.texts: dict[int, list[str]] = {}

    def on_send(self, message: Mapping) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            headers = {bytes(k).lower(): bytes(v) for k, v in message.get("headers", [])}
            self.stream = headers.get(b"content-type", b"").startswith(b"text/event-stream")
        elif message["type"] == "http.response.body" and self.status == 200:
            chunk = bytes(message.get("body", b""))
            if self.stream:
                self._events(chunk)
            else:
                self.body.append(chunk)

    def _events(self, chunk: bytes) -> None:
        """Fold server-sent events' ``data:`` lines into each choice's text as they arrive."""
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                self.done = True
                continue
            try:
                event = json.loads(data)
            except json.JSONDecodeError:
                continue
            for choice in event.get("choices") or []:
                content = (choice.get("delta") or {}).get("content")
                if isinstance(content, str):
                    self.texts.setdefault(int(choice.get("index", 0)), []).append(content)

    def chats(self) -> tuple[list, list[str]] | None:
        """``(request messages, one answer per choice)`` of a completed 200 exchange, else ``None``."""
        if self.status != 200:
            return None
        try:
            request = json.loads(b"".join(self.request))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        messages = request.get("messages") if isinstance(request, dict) else None
        if not isinstance(messages, list) or not messages:
            return None
        if self.stream:
            if not self.done:
                return None
            answers = ["".join(self.texts[i]) for i in sorted(self.texts)]
        else:
            try:
                response = json.loads(b"".join(self.body))
            except (json.JSONDecodeError, UnicodeDecodeError):
                return None
            answers = [c.get("message", {}).get("content") for c in sorted(response.get("choices") or [],
                                                                         key=lambda c: c.get("index", 0))]
        return messages, [a for a in answers if isinstance(a, str) and a]


class ChatLogMiddleware:
    """ASGI middleware that appends every finished chat completion to the request log (see the module docstring).

    Args:
        app: the ASGI app it wraps (vLLM's server).
        chat_log: where to write (default :meth:`ChatLog.from_env`; ``None`` there: pass everything through).
    """

    def __init__(self, app, chat_log: ChatLog | None = None) -> None:
        self.app = app
        self.chat_log = chat_log if chat_log is not None else ChatLog.from_env()

    async def __call__(self, scope, receive, send) -> None:
        """Pass the exchange through; log it once the response is complete."""
        if (self.chat_log is None or scope["type"] != "http" or scope.get("method") != "POST"
                or not scope.get("path", "").endswith(CHAT_PATH)):
            await self.app(scope, receive, send)
            return
        exchange = _Exchange()

        async def receive_request():
            message = await receive()
            if message["type"] == "http.request":
                exchange.request.append(bytes(message.get("body", b"")))
            return message

        async def send_response(message) -> None:
            exchange.on_send(message)
            await send(message)

        await self.app(scope, receive_request, send_response)
        got = exchange.chats()
        if got is not None:
            messages, answers = got
            for answer in answers:
                self.chat_log.write(messages, answer)
