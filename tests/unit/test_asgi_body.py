"""The one ASGI body reader the router's proxy and the runtime's middleware share."""

from __future__ import annotations

from typing import Any

import pytest

from autoglm_api.asgi_body import BodyTooLarge, ClientDisconnected, Receive, read_body


def messages(*items: dict[str, Any]) -> tuple[Receive, list[dict[str, Any]]]:
    """A `receive` that returns `items` in turn (a test fails if it asks for one more), and the
    list of those not yet taken."""
    left = list(items)

    async def receive() -> dict[str, Any]:
        assert left, "read past the last message"
        return left.pop(0)

    return receive, left


def chunks(parts: list[bytes]) -> list[dict[str, Any]]:
    """`parts` as `http.request` messages, `more_body` on all but the last."""
    return [{"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
            for i, part in enumerate(parts)]


async def test_a_complete_body_in_one_message() -> None:
    receive, left = messages({"type": "http.request", "body": b'{"a": 1}'})  # no more_body
    body = await read_body(receive, 1024)
    assert body == b'{"a": 1}' and isinstance(body, bytearray)
    assert left == []


async def test_an_empty_body() -> None:
    receive, _ = messages({"type": "http.request"})
    assert await read_body(receive, 0) == b""


async def test_a_chunked_body_is_joined_up_to_the_last_chunk() -> None:
    receive, left = messages(*chunks([b'{"model": ', b"", b'"m", "n": 2}']),
                             {"type": "http.disconnect"})
    assert await read_body(receive, 1024) == b'{"model": "m", "n": 2}'
    assert left == [{"type": "http.disconnect"}]  # not read: left for the disconnect watcher


async def test_a_body_of_exactly_the_limit_is_read() -> None:
    receive, _ = messages(*chunks([b"12345", b"67890"]))
    assert await read_body(receive, 10) == b"1234567890"


async def test_a_body_over_the_limit_stops_at_the_chunk_that_passes_it() -> None:
    receive, left = messages(*chunks([b"12345", b"67890", b"1", b"never read"]))
    with pytest.raises(BodyTooLarge) as raised:
        await read_body(receive, 10)
    assert raised.value.limit == 10
    assert len(left) == 1  # the rest is left unread


async def test_a_disconnect_mid_body_raises_instead_of_a_shorter_body() -> None:
    # The first chunk alone is valid JSON: handed on, it would pass for a whole request.
    receive, _ = messages({"type": "http.request", "body": b'{"a": 1}', "more_body": True},
                          {"type": "http.disconnect"})
    with pytest.raises(ClientDisconnected):
        await read_body(receive, 1024)


async def test_a_disconnect_before_any_chunk_raises() -> None:
    receive, _ = messages({"type": "http.disconnect"})
    with pytest.raises(ClientDisconnected):
        await read_body(receive, 1024)
