"""The bounded body scan gives routing what a full parse gives it, for bounded time and memory."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoglm_api.paths import CHAT_PATH, COMPLETIONS_PATH
from autoglm_router.features import request_features
from autoglm_router.scan import IMAGE_HEAD_CHARS, scan_request

PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAABDgAAAlg" + "A" * 200_000
BODIES = [
    (CHAT_PATH, {"model": "m", "stream": True, "messages": [
        {"role": "system", "content": "You are a phone agent. \u00e9\u4e2d"},
        {"role": "user", "content": [{"type": "text", "text": "open settings"},
                                     {"type": "image_url", "image_url": {"url": PNG}}]},
        {"role": "assistant", "content": "<think>x</think><answer>tap</answer>"},
    ], "tools": [{"type": "function", "function": {"parameters": {"a": [1, {"b": None}]}}}]}),
    (CHAT_PATH, {"messages": [{"role": "user", "content": "hi"}], "session_id": "s-1", "n": 3,
                 "service_tier": "flex"}),
    (CHAT_PATH, {"messages": [{"role": "user", "content": "hi"}], "session_id": 42}),
    (COMPLETIONS_PATH, {"prompt": ["first prompt", "second"], "stream": False}),
    (CHAT_PATH, {"messages": "not a list", "stream": "yes"}),
]


@pytest.mark.parametrize(("path", "body"), BODIES)
def test_the_scan_gives_the_same_features_as_a_full_parse(path: str,
                                                          body: dict[str, object]) -> None:
    raw = json.dumps(body).encode()
    assert request_features(path, scan_request(raw), {}, 1024) == request_features(
        path, json.loads(raw), {}, 1024)


def test_the_scan_keeps_the_head_of_an_image_and_the_routing_scalars() -> None:
    found = scan_request(json.dumps(BODIES[0][1] | {"n": 2}).encode())
    assert found is not None and found["stream"] is True and found["n"] == 2
    url = found["messages"][1]["content"][1]["image_url"]["url"]
    assert PNG.startswith(url) and len(url) == IMAGE_HEAD_CHARS


def test_a_body_of_millions_of_objects_is_scanned_in_bounded_time() -> None:
    raw = b'{"x":[' + b"{}," * 5_000_000 + b'{}], "stream": true}'
    start = time.monotonic()
    assert scan_request(raw) == {}  # the budget ran out first: what was read, nothing
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"", b"\xff\xfe"])
def test_a_body_that_is_no_object_gives_nothing(raw: bytes) -> None:
    assert scan_request(raw) in (None, {})


@given(text=st.text(), ascii_only=st.booleans())
def test_every_string_reads_as_a_full_parse_reads_it(text: str, ascii_only: bool) -> None:
    """Escaped (\\uXXXX, \\n) or raw UTF-8, with the fast path for strings with no escape."""
    body = json.dumps({"messages": [{"content": text}]}, ensure_ascii=ascii_only).encode()
    assert scan_request(body) == {"messages": [{"content": text}]}
