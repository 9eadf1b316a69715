"""What routing needs from a request, read once from its body and headers (pure).

The body is the parsed JSON or `scan.scan_request`'s bounded skeleton of it: both have the same
shape for every field read here."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from autoglm_api.engine_args import DEFAULT_MAX_TOKENS
from autoglm_api.image_budget import (
    IMAGE_DELIMITER_TOKENS,
    RefusedImage,
    image_tokens,
    max_pixels_for,
    tokens_per_max_pixels,
)
from autoglm_api.image_size import data_url_size
from autoglm_api.paths import CHAT_PATH, COMPLETIONS_PATH
from autoglm_api.traffic import TrafficClass
from autoglm_api.traffic import traffic_class as classify

# Checked in this order; the runtime reads the body field and its own header the same way.
SESSION_HEADERS = ("x-session-id", "x-autoglm-session-id")
MAX_SESSION_KEY_CHARS = 256
# The engine's pixel budget per image at the runtime's default context; the operator passes its
# own (--image-max-pixels). An image is priced as the engine's processor will scale it, from
# the dimensions in its first bytes; one whose head does not say costs the most it can.
DEFAULT_IMAGE_MAX_PIXELS = max_pixels_for(2048, DEFAULT_MAX_TOKENS)
CHARS_PER_TOKEN = 4
# One unit of load is one request with this much prefill on top of its fixed cost.
TOKENS_PER_LOAD_UNIT = 1024


class KeyKind(StrEnum):
    SESSION = "session"  # a session id the client sent
    # A chat without one: its system prompt and first user message (the phone agent's task)
    # stand for the conversation, kept on its replica as a session is.
    CONVERSATION = "conversation"
    PREFIX = "prefix"  # a completion's prompt head
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
    # Prompt tokens the replica that served this conversation's previous turn holds in its
    # prefix cache: the messages before the previous user message (the phone agent rewrites
    # that one, stripping its screenshot, so the shared prefix ends there).
    cached_tokens: float = 0.0
    streamed: bool = False  # `stream: true`: a held one hears heartbeats (proxy.HeldStream)

    @property
    def home_cost(self) -> float:
        """The cost on the replica holding the conversation's cache: its uncached prefill."""
        return self.cost - self.fanout * self.cached_tokens / TOKENS_PER_LOAD_UNIT


MAX_FANOUT = 1024  # past this the replica answers 400; it is counted as one meanwhile

NEUTRAL = RequestFeatures(TrafficClass.OTHER, None, KeyKind.NONE, 1.0)


def request_features(
    path: str, body: Any, headers: Mapping[str, str], prefix_chars: int,
    image_max_pixels: int = DEFAULT_IMAGE_MAX_PIXELS,
) -> RequestFeatures:
    """Features of one request; `body` is the parsed JSON (anything, when it did not parse)."""
    if not isinstance(body, dict):
        return NEUTRAL
    n = body.get("n")
    fanout = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_FANOUT else 1
    tokens, cached = prompt_tokens(path, body, image_max_pixels)
    cost = fanout * (1.0 + tokens / TOKENS_PER_LOAD_UNIT)
    session = session_key(body, headers)
    traffic_class = classify(path, body, headers)
    new = path == CHAT_PATH and not _has_answer(body.get("messages"))
    streamed = body.get("stream") is True
    if session is not None:
        return RequestFeatures(traffic_class, session, KeyKind.SESSION, cost, new, fanout,
                               cached, streamed)
    prefix = prefix_key(path, body, prefix_chars)
    if prefix is None:
        return RequestFeatures(traffic_class, None, KeyKind.NONE, cost, fanout=fanout,
                               streamed=streamed)
    kind = KeyKind.CONVERSATION if path == CHAT_PATH else KeyKind.PREFIX
    return RequestFeatures(traffic_class, prefix, kind, cost, new, fanout, cached, streamed)


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
    """A digest of the system prompt and the first user turn, each cut at `prefix_chars`.

    Each part is cut on its own: the phone agent's system prompt (2.7 KB) is the same for every
    task and its task is the first user message, so one cut of the whole would give every task
    one key. Only text is hashed: the agent replaces each turn's screenshot, so hashing image
    parts would scatter one conversation over the ring.
    """
    if path == CHAT_PATH:
        head = _chat_head(body.get("messages"), prefix_chars)
    elif path == COMPLETIONS_PATH:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt:
            prompt = prompt[0]
        head = prompt[:prefix_chars] if isinstance(prompt, str) else ""
    else:
        head = ""
    if not head:
        return None
    return "p:" + hashlib.blake2b(head.encode(), digest_size=16).hexdigest()


def _chat_head(messages: Any, chars: int) -> str:
    """Leading system messages and the first user message, text parts only, each message's
    text cut at `chars`."""
    if not isinstance(messages, list):
        return ""
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            break
        role = message.get("role")
        text, _ = _content_parts(message.get("content"))
        parts.append(f"{role}\x00{''.join(text)[:chars]}\x00")
        if role not in ("system", "developer"):
            break
    return "".join(parts)


def _has_answer(messages: Any) -> bool:
    return isinstance(messages, list) and any(
        isinstance(m, dict) and m.get("role") in ("assistant", "tool") for m in messages)


def prefill_tokens(path: str, body: Mapping[str, Any], image_max_pixels: int) -> float:
    """The prompt's estimated tokens: its text at CHARS_PER_TOKEN, its images as the engine
    will count them."""
    return prompt_tokens(path, body, image_max_pixels)[0]


def prompt_tokens(path: str, body: Mapping[str, Any],
                  image_max_pixels: int) -> tuple[float, float]:
    """(prefill_tokens, cached): `cached` is a chat's tokens before its previous user message
    (RequestFeatures.cached_tokens), 0 for a first or second turn. Each message is priced once:
    an image's size is read from its data once per request."""
    if path == COMPLETIONS_PATH:
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            return _tokens([p for p in prompt if isinstance(p, str)], [], image_max_pixels), 0.0
        return _tokens([prompt] if isinstance(prompt, str) else [], [], image_max_pixels), 0.0
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 0.0, 0.0
    per_message = [_tokens(*_content_parts(m.get("content")), image_max_pixels)
                   if isinstance(m, dict) else 0.0 for m in messages]
    users = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"]
    cached = sum(per_message[:users[-2]]) if path == CHAT_PATH and len(users) >= 2 else 0.0
    return sum(per_message), cached


def _tokens(text: list[str], images: list[Any], image_max_pixels: int) -> float:
    chars = sum(len(part) for part in text)
    return chars / CHARS_PER_TOKEN + sum(_image_tokens(i, image_max_pixels) for i in images)


def _image_tokens(image: Any, max_pixels: int) -> int:
    url = image.get("url") if isinstance(image, dict) else image
    size = data_url_size(url) if isinstance(url, str) else None
    try:
        tokens = image_tokens(*size, max_pixels) if size else tokens_per_max_pixels(max_pixels)
    except RefusedImage:
        # The engine refuses it at once; a header claiming 28 x 10^11 pixels must not price
        # the request at millions of tokens while it lasts.
        tokens = tokens_per_max_pixels(max_pixels)
    return tokens + IMAGE_DELIMITER_TOKENS


def _content_parts(content: Any) -> tuple[list[str], list[Any]]:
    if isinstance(content, str):
        return [content], []
    if not isinstance(content, list):
        return [], []
    text: list[str] = []
    images: list[Any] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            text.append(part["text"])
        elif part.get("type") in ("image_url", "image"):
            images.append(part.get("image_url"))
    return text, images
