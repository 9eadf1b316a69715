"""An ASGI request body, read whole from `receive` within a size limit: the router's proxy and
the runtime's middleware both read it so.

Pure ASGI (messages are mappings), so neither a server nor a framework is imported. A client
that disconnects before the last chunk raises `ClientDisconnected`: what arrived is dropped, as
a shorter body could pass for a whole request (a JSON object cut at a chunk boundary parses).
Each caller turns the two exceptions into its own answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]


class BodyTooLarge(Exception):
    """More than `limit` bytes of body arrived."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is larger than {limit} bytes")
        self.limit = limit


class ClientDisconnected(Exception):
    """The client disconnected (`http.disconnect`) before the body's last chunk."""


async def read_body(receive: Receive, limit: int) -> bytearray:
    """The whole body: `http.request` messages until one without `more_body`, in one buffer
    that is never copied (bytes.join would hold it twice).

    Raises BodyTooLarge as soon as more than `limit` bytes arrived (the rest is left unread),
    ClientDisconnected on `http.disconnect` before the last chunk, whatever arrived before it.
    """
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        body += message.get("body", b"")
        if len(body) > limit:
            raise BodyTooLarge(limit)
        if not message.get("more_body", False):
            return body
