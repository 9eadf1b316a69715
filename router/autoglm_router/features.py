"""What routing needs from a request, read once from its body and headers (pure).

The body is the parsed JSON or `scan.scan_request`'s bounded skeleton of it: both have the same
shape for every field read here."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from autoglm_runtime.profiles import Mode

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
# Checked in this order; the runtime reads the body field and its own header the same way.
SESSION_HEADERS = ("x-session-id", "x-autoglm-session-id")
MAX_SESSION_KEY_CHARS = 256
# A screenshot costs about as much prefill as a page of text; counted without decoding it.
IMAGE_PREFILL_TOKENS = 1024
CHARS_PER_TOKEN = 4
# One unit of load is one request with this much prefill on top of its fixed cost.
TOKENS_PER_LOAD_UNIT = 1024


class TrafficClass(StrEnum):
    STREAMED_CHAT = "streamed_chat"
    OTHER = "other"

    @property
    def preferred_mode(self) -> Mode:
        return Mode.STREAMING if self is TrafficClass.STREAMED_CHAT else Mode.BATCHING


class KeyKind(StrEnum):
    SESSION = "session"
    PREFIX = "prefix"
    NONE = "none"


@dataclass(frozen=True)
class RequestFeatures:
    traffic_class: TrafficClass
    key: str | None
    key_kind: KeyKind
    cost: float  # 1 + estimated prefill tokens / TOKENS_PER_LOAD_UNIT
    # A chat whose history holds no answer yet: a conversation's first turn, with no cache
    # anywhere to lose (completions cannot tell, so they are never new).
    new_conversation: bool = False
    # Sequences the request asks for (its `n`): each takes a replica slot, so each counts.
    fanout: int = 1


MAX_FANOUT = 1024  # past this the replica answers 400; it is counted as one meanwhile

NEUTRAL = RequestFeatures(TrafficClass.OTHER, None, KeyKind.NONE, 1.0)


def request_features(
    path: str, body: Any, headers: Mapping[str, str], prefix_chars: int
) -> RequestFeatures:
    """Features of one request; `body` is the parsed JSON (anything, when it did not parse)."""
    if not isinstance(body, dict):
        return NEUTRAL
    stream = body.get("stream") is True
    traffic_class = (
        TrafficClass.STREAMED_CHAT if path == CHAT_PATH and stream else TrafficClass.OTHER
    )
    text, images = _prompt_parts(path, body)
    chars = sum(len(part) for part in text)
    n = body.get("n")
    fanout = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_FANOUT else 1
    cost = fanout * (
        1.0 + (chars / CHARS_PER_TOKEN + images * IMAGE_PREFILL_TOKENS) / TOKENS_PER_LOAD_UNIT)
    session = session_key(body, headers)
    if session is not None:
        return RequestFeatures(traffic_class, session, KeyKind.SESSION, cost,
                               path == CHAT_PATH and not _has_answer(body.get("messages")),
                               fanout)
    prefix = prefix_key(path, body, prefix_chars)
    kind = KeyKind.PREFIX if prefix is not None else KeyKind.NONE
    return RequestFeatures(traffic_class, prefix, kind, cost, fanout=fanout)


def session_key(body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """Body `session_id`, else `X-Session-ID`, else `x-autoglm-session-id`."""
    candidates: list[Any] = [body.get("session_id")]
    candidates += [headers.get(name) for name in SESSION_HEADERS]
    for value in candidates:
        if isinstance(value, bool) or not isinstance(value, str | int):
            continue
        key = str(value)
        if key and len(key) <= MAX_SESSION_KEY_CHARS:
            return "s:" + key
    return None


def prefix_key(path: str, body: Mapping[str, Any], prefix_chars: int) -> str | None:
    """A digest of the system prompt and the first user turn, cut at `prefix_chars`.

    Only text is hashed: the phone agent replaces each turn's screenshot, so hashing image
    parts would scatter one conversation over the ring.
    """
    if path == CHAT_PATH:
        head = _chat_head(body.get("messages"))
    elif path == COMPLETIONS_PATH:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt:
            prompt = prompt[0]
        head = prompt if isinstance(prompt, str) else ""
    else:
        head = ""
    if not head:
        return None
    return "p:" + hashlib.blake2b(head[:prefix_chars].encode(), digest_size=16).hexdigest()


def _chat_head(messages: Any) -> str:
    """Leading system messages and the first user message, text parts only."""
    if not isinstance(messages, list):
        return ""
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            break
        role = message.get("role")
        text, _ = _content_parts(message.get("content"))
        parts.append(f"{role}\x00{''.join(text)}\x00")
        if role not in ("system", "developer"):
            break
    return "".join(parts)


def _has_answer(messages: Any) -> bool:
    return isinstance(messages, list) and any(
        isinstance(m, dict) and m.get("role") in ("assistant", "tool") for m in messages)


def _prompt_parts(path: str, body: Mapping[str, Any]) -> tuple[list[str], int]:
    if path == COMPLETIONS_PATH:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return [prompt], 0
        if isinstance(prompt, list):
            return [p for p in prompt if isinstance(p, str)], 0
        return [], 0
    messages = body.get("messages")
    text: list[str] = []
    images = 0
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                t, i = _content_parts(message.get("content"))
                text += t
                images += i
    return text, images


def _content_parts(content: Any) -> tuple[list[str], int]:
    if isinstance(content, str):
        return [content], 0
    if not isinstance(content, list):
        return [], 0
    text: list[str] = []
    images = 0
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            text.append(part["text"])
        elif part.get("type") in ("image_url", "image"):
            images += 1
    return text, images
