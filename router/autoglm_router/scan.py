"""A bounded scan of a request body for what routing reads, without building its JSON tree (pure).

A full parse of a 16 MiB body of `{},{},...` builds millions of objects (hundreds of MB); this
scan keeps only the fields routing reads and gives up after a fixed number of tokens, so its
memory and time are bounded for any body up to the size limit. What it returns mirrors the body's
shape (a dict with only those fields), so `features.request_features` reads it as it would the
parsed body. A body it cannot read, or one past its budget, gives what was read so far: the
replica still validates the whole body.
"""

from __future__ import annotations

import json
import re
from typing import Any

# A real chat (system prompt, turns, one screenshot) is a few hundred tokens; this is far more,
# and still a few tens of milliseconds of the event loop at worst.
MAX_TOKENS = 20_000
MAX_DEPTH = 64
# Enough of a data: URL for the PNG header (IHDR: width and height) and a JPEG's first segments.
IMAGE_HEAD_CHARS = 4096
MAX_SCALAR_CHARS = 1024  # a session_id, role, type or service tier longer than this is dropped
TOP_LEVEL_SCALARS = frozenset({"stream", "session_id", "service_tier", "n"})

_TOKEN = re.compile(
    rb'[ \t\r\n]*(?:("[^"\\]*(?:\\.[^"\\]*)*")|([{}\[\]:,])|(true|false|null)'
    rb"|(-?[0-9][0-9.eE+-]*|NaN|-?Infinity))",
    re.DOTALL,
)
_LITERALS: dict[bytes, Any] = {b"true": True, b"false": False, b"null": None}


class _Stop(Exception):
    """The body is malformed, nests too deeply, or the token budget is spent."""


class _Scanner:
    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self.data = bytes(data) if isinstance(data, memoryview) else data
        self.pos = 0
        self.left = MAX_TOKENS

    def next(self) -> tuple[int, bytes]:
        """(kind, token): kind 1 string, 2 punctuation, 3 literal, 4 number."""
        self.left -= 1
        if self.left < 0:
            raise _Stop
        match = _TOKEN.match(self.data, self.pos)
        if match is None:
            raise _Stop
        self.pos = match.end()
        kind = match.lastindex or 0
        return kind, match.group(kind)

    def expect(self, punctuation: bytes) -> None:
        if self.next() != (2, punctuation):
            raise _Stop

    def skip(self, first: tuple[int, bytes], depth: int) -> None:
        """Consume one value that begins with `first`, keeping nothing."""
        kind, token = first
        if kind != 2:
            return
        if token not in (b"{", b"["):
            raise _Stop
        if depth > MAX_DEPTH:
            raise _Stop
        close = b"}" if token == b"{" else b"]"
        item = self.next()
        if item == (2, close):
            return
        while True:
            if token == b"{":
                if item[0] != 1:
                    raise _Stop
                self.expect(b":")
                item = self.next()
            self.skip(item, depth + 1)
            item = self.next()
            if item == (2, close):
                return
            if item != (2, b","):
                raise _Stop
            item = self.next()

    def members(self, depth: int) -> Any:
        """Yield (key, first token of its value) of the object just opened."""
        item = self.next()
        if item == (2, b"}"):
            return
        while True:
            if item[0] != 1:
                raise _Stop
            key = _string(item[1])
            self.expect(b":")
            yield key, self.next()
            item = self.next()
            if item == (2, b"}"):
                return
            if item != (2, b","):
                raise _Stop
            item = self.next()

    def elements(self) -> Any:
        """Yield the first token of each element of the array just opened."""
        item = self.next()
        if item == (2, b"]"):
            return
        while True:
            yield item
            item = self.next()
            if item == (2, b"]"):
                return
            if item != (2, b","):
                raise _Stop
            item = self.next()


def _string(token: bytes) -> str:
    if b"\\" not in token:
        # No escape: the string is the UTF-8 between the quotes (a fifth of json.loads' time).
        try:
            return token[1:-1].decode()
        except UnicodeDecodeError:
            raise _Stop from None
    try:
        value = json.loads(token)
    except (ValueError, RecursionError):
        raise _Stop from None
    assert isinstance(value, str)
    return value


def _scalar(scanner: _Scanner, first: tuple[int, bytes]) -> Any:
    """A short scalar's value; None for anything else (which is consumed)."""
    kind, token = first
    if kind == 1:
        return _string(token) if len(token) <= MAX_SCALAR_CHARS + 2 else None
    if kind == 3:
        return _LITERALS[token]
    if kind == 4:
        return int(token) if token.isdigit() and len(token) <= 9 else None
    scanner.skip(first, 1)
    return None


def scan_request(body: bytes | bytearray) -> dict[str, Any] | None:
    """The routing fields of a JSON object body; None when it is no object at all."""
    scanner = _Scanner(body)
    found: dict[str, Any] = {}
    try:
        if scanner.next() != (2, b"{"):
            return None
        for key, first in scanner.members(0):
            if key in TOP_LEVEL_SCALARS:
                found[key] = _scalar(scanner, first)
            elif key == "messages" and first == (2, b"["):
                found[key] = messages = []
                for item in scanner.elements():
                    messages.append(_message(scanner, item))
            elif key == "prompt":
                found[key] = _prompt(scanner, first)
            else:
                scanner.skip(first, 1)
    except _Stop:
        pass  # what was read so far
    return found


def _message(scanner: _Scanner, first: tuple[int, bytes]) -> Any:
    if first != (2, b"{"):
        scanner.skip(first, 2)
        return None
    message: dict[str, Any] = {}
    for key, value in scanner.members(2):
        if key == "role":
            message[key] = _scalar(scanner, value)
        elif key == "content":
            message[key] = _content(scanner, value)
        else:
            scanner.skip(value, 3)
    return message


def _content(scanner: _Scanner, first: tuple[int, bytes]) -> Any:
    if first[0] == 1:
        return _string(first[1])
    if first != (2, b"["):
        scanner.skip(first, 3)
        return None
    parts: list[Any] = []
    for item in scanner.elements():
        if item != (2, b"{"):
            scanner.skip(item, 4)
            parts.append(None)
            continue
        part: dict[str, Any] = {}
        for key, value in scanner.members(4):
            if key == "type":
                part[key] = _scalar(scanner, value)
            elif key == "text" and value[0] == 1:
                part[key] = _string(value[1])
            elif key == "image_url":
                part[key] = _image_url(scanner, value)
            else:
                scanner.skip(value, 5)
        parts.append(part)
    return parts


def _image_url(scanner: _Scanner, first: tuple[int, bytes]) -> Any:
    """`{"url": <head>}` or the head of a bare string: only the URL's leading characters."""
    if first[0] == 1:
        return _head(first[1])
    if first != (2, b"{"):
        scanner.skip(first, 5)
        return None
    image: dict[str, Any] = {}
    for key, value in scanner.members(5):
        if key == "url" and value[0] == 1:
            image[key] = _head(value[1])
        else:
            scanner.skip(value, 6)
    return image


def _head(token: bytes) -> str:
    # A data: URL is ASCII (base64); cutting inside an escape only loses the tail.
    return token[1:-1][:IMAGE_HEAD_CHARS].decode("latin-1")


def _prompt(scanner: _Scanner, first: tuple[int, bytes]) -> Any:
    if first[0] == 1:
        return _string(first[1])
    if first != (2, b"["):
        scanner.skip(first, 1)
        return None
    prompts: list[Any] = []
    for item in scanner.elements():
        if item[0] == 1:
            prompts.append(_string(item[1]))
        else:
            scanner.skip(item, 2)
    return prompts
