"""One chat record -> one document: the role table and the rule every chat format is rendered by.

Every chat record (OpenAI ``messages``, ShareGPT ``conversations``; as :mod:`ingest.chat_files` reads them) becomes text
through :func:`chat_document`, which renders its kept turns with :func:`toolkit.tokenizer.render_chat` (the function the
decoder renders prompts with). The turns are under the chat field (:data:`CHAT_FIELDS`: ``messages``, else
``conversations``, or ``--chat-field``); each is ``{"role", "content"}`` or ShareGPT's ``{"from", "value"}``. Roles:
system, developer (-> system), user, assistant and ShareGPT's human, gpt, chatgpt, bing, bard, model, in any case.
Content is a string or a list of parts whose text parts are joined with newlines. Empty turns are dropped.

A record that cannot be rendered is refused, counted by reason in :attr:`ingest.sources.SourceReport.malformed`:
``record is not an object``, ``missing field: F``, ``wrong type: F``, ``unknown role``, ``empty text``,
``empty messages``, ``chat template error``. A turn that cannot be rendered as text is skipped, its record kept, and
counted in the same counter: ``tool turn skipped`` (role ``tool``/``function``), ``tool_calls turn skipped``
(``tool_calls`` or ``function_call``), ``non-text content skipped`` (an image, audio).
"""

from __future__ import annotations

from typing import NamedTuple

from toolkit.tokenizer import render_chat

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
          "bard": "assistant", "assistant": "assistant", "model": "assistant", "system": "system",
          "developer": "system"}
_TOOL_ROLES = frozenset({"tool", "function"})
CHAT_FIELDS = ("messages", "conversations")
"""The chat field a JSON Lines record or a Parquet file is read from, in order (``--chat-field`` overrides)."""
SHAREGPT_FIELDS = ("conversations",)
"""The chat field of a ``--source sharegpt`` record."""


class ChatDocument(NamedTuple):
    """What :func:`chat_document` made of one record.

    Attributes:
        text: the rendered conversation, or ``None`` when the record is refused.
        reason: why the record was refused (``None`` for a document).
        skipped: the reason for each turn skipped in a kept record (``"tool turn skipped"`` ...).
    """

    text: str | None
    reason: str | None = None
    skipped: tuple[str, ...] = ()


class _Turn(NamedTuple):
    """One turn judged: a message to keep, nothing (an empty turn), a turn to skip, or a refused record."""

    message: dict | None = None
    skip: str | None = None
    refuse: str | None = None


def _content_text(content) -> _Turn | str:
    """A turn's content as text, or the verdict on the turn (skipped, refused, empty)."""
    if content is None:
        return _Turn()
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return _Turn(refuse="wrong type: content")
    texts: list[str] = []
    other = False
    for part in content:
        if not isinstance(part, dict):
            return _Turn(refuse="wrong type: content")
        if part.get("type") == "text":
            if not isinstance(part.get("text"), str):
                return _Turn(refuse="wrong type: content")
            texts.append(part["text"])
        else:
            other = True
    return _Turn(skip="non-text content skipped") if other else "\n".join(texts)


def _role(name: str) -> _Turn | str:
    """A speaker's role through the role table, or the verdict on its turn (a tool turn, an unknown role)."""
    if name.lower() in _TOOL_ROLES:
        return _Turn(skip="tool turn skipped")
    role = _ROLES.get(name.lower())
    return _Turn(refuse="unknown role") if role is None else role


def _judge_turn(turn, sharegpt: bool) -> _Turn:
    """One turn of a chat list: ShareGPT's ``{from, value}`` or ``{role, content}``. ``sharegpt``: the list is
    ShareGPT's ``conversations`` (it names the keys that a turn with neither ``from`` nor ``role`` lacks)."""
    if isinstance(turn, dict) and "from" in turn and turn.get("role") is None:  # Parquet structs may carry both
        if "value" not in turn:
            return _Turn(refuse="missing field: from/value")
        if not isinstance(turn["from"], str) or not isinstance(turn["value"], str):
            return _Turn(refuse="wrong type: from/value")
        role = _role(turn["from"])
        if isinstance(role, _Turn):
            return role
        text: _Turn | str = turn["value"]
    elif isinstance(turn, dict) and "role" in turn:
        if not isinstance(turn["role"], str):
            return _Turn(refuse="wrong type: role")
        role = _role(turn["role"])
        if isinstance(role, _Turn):
            return role
        if turn.get("tool_calls") or turn.get("function_call"):
            return _Turn(skip="tool_calls turn skipped")
        if "content" not in turn:
            return _Turn(refuse="missing field: role/content")
        text = _content_text(turn["content"])
    else:
        return _Turn(refuse="missing field: from/value" if sharegpt else "missing field: role/content")
    if isinstance(text, _Turn):
        return text
    return _Turn({"role": role, "content": text}) if text.strip() else _Turn()


class ChatMessages(NamedTuple):
    """One chat record's turns, normalized (:func:`chat_messages`).

    Attributes:
        messages: ``[{"role", "content"}]`` (roles through the role table, content as text), or ``None``.
        reason: why the record is refused (a reason of the module docstring), or ``None``.
        skipped: the reasons of the turns skipped in a kept record.
    """

    messages: list[dict] | None
    reason: str | None
    skipped: tuple[str, ...] = ()


def chat_messages(record, fields: tuple[str, ...] = CHAT_FIELDS) -> ChatMessages:
    """One chat record's turns as ``{"role", "content"}`` messages: the one reading of every chat format (OpenAI
    ``messages``, ShareGPT ``conversations``; JSON Lines, JSON arrays, Parquet rows), which :func:`chat_document`
    renders and ``python -m evaluation distill`` takes its prompts from.

    Each turn is ``{"role", "content"}`` (content a string, a list of parts, or ``null``) or ShareGPT's
    ``{"from", "value"}``; roles go through one table (see the module docstring). Empty turns are dropped;
    tool turns, ``tool_calls`` turns and turns with non-text parts are skipped (``skipped``).

    Args:
        record: one parsed record (a JSON object, or ``{column: value}`` for a Parquet row).
        fields: the keys the turns may be under, in order; the first is named when none is present.
    """
    if not isinstance(record, dict):
        return ChatMessages(None, "record is not an object")
    name = next((f for f in fields if record.get(f) is not None), None)
    if name is None:
        return ChatMessages(None, f"missing field: {fields[0]}")
    turns = record[name]
    if not isinstance(turns, list):
        return ChatMessages(None, f"wrong type: {name}")
    sharegpt = name == "conversations"
    messages: list[dict] = []
    skipped: list[str] = []
    for turn in turns:
        verdict = _judge_turn(turn, sharegpt)
        if verdict.refuse is not None:
            return ChatMessages(None, verdict.refuse)
        if verdict.skip is not None:
            skipped.append(verdict.skip)
        elif verdict.message is not None:
            messages.append(verdict.message)
    if not messages:
        return ChatMessages(None, "empty text" if sharegpt else "empty messages")
    return ChatMessages(messages, None, tuple(skipped))


def chat_document(record, tokenizer, fields: tuple[str, ...] = CHAT_FIELDS) -> ChatDocument:
    """Render one chat record's messages (:func:`chat_messages`) with :func:`toolkit.tokenizer.render_chat` (the one
    rule of every chat format, both engines).

    Args:
        record: one parsed record (a JSON object, or ``{column: value}`` for a Parquet row).
        tokenizer: the target tokenizer (its chat template renders the conversation).
        fields: the keys the turns may be under, in order; the first is named when none is present.

    Returns:
        A :class:`ChatDocument`: the text, or the reason the record is refused (a reason of the module
        docstring), and the reasons of the turns skipped in a kept record.
    """
    read = chat_messages(record, fields)
    if read.messages is None:
        return ChatDocument(None, read.reason)
    from jinja2.exceptions import TemplateError

    try:
        text = render_chat(tokenizer, read.messages)
    except TemplateError:
        return ChatDocument(None, "chat template error")
    return ChatDocument(text, None, read.skipped)


def flatten_conversation(record, tokenizer) -> tuple[str | None, str | None]:
    """Render one ShareGPT record as text (:func:`chat_document` on its ``conversations``).

    Args:
        record: one element of a ShareGPT JSON array.
        tokenizer: the target tokenizer.

    Returns:
        ``(text, None)`` or ``(None, reason)`` (skipped turns are not reported here; see :func:`chat_document`).
    """
    doc = chat_document(record, tokenizer, SHAREGPT_FIELDS)
    return doc.text, doc.reason
