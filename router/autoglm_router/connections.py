"""Limits on every client connection, below the ASGI app: uvicorn has no header-read deadline,
no header size or count limit with httptools, and no connection cap that answers before a
request's headers are in (its `limit_concurrency` 503 comes only after them, with no
Retry-After). So a connection that sends nothing, or sends headers a byte at a time, would hold
a file descriptor for good.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# In each request's ASGI scope: drops the connection at once, unsent bytes and all. A response
# cut because its client stopped reading cannot end with a close, which waits for the client to
# take what is buffered: that client would keep its connection (and a connection slot) for good.
ABORT_SCOPE_KEY = "autoglm.abort"


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 2048
    max_header_bytes: int = 32 * 1024  # request line and headers of one request
    max_headers: int = 100
    header_timeout: float = 10.0  # from connect (or a request's first byte) to its last header
    retry_after_seconds: int = 1


def _response(status: bytes, message: str, extra: bytes = b"") -> bytes:
    body = message.encode()
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n"
            + extra + b"\r\n" + body)


class _HeadersRefused(Exception):
    pass


def guarded_protocol(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with `limits` applied to each connection."""

    class GuardedProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._header_bytes = 0  # of the headers parsed so far
            self._pending_bytes = 0  # received since the request began, headers incomplete
            self._header_count = 0
            self._in_headers = True
            self._header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                retry = f"retry-after: {limits.retry_after_seconds}\r\n".encode()
                self._refuse(b"503 Service Unavailable",
                             "The router has too many open connections.", retry)
                return
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_header_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._in_headers:
                self._pending_bytes += len(data)
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                # As uvicorn does: a WebSocket goes to the app (which refuses it, 403).
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
                return
            except (_HeadersRefused, httptools.HttpParserError):
                if self._header_count > limits.max_headers:
                    self._too_many_headers()
                elif self._header_bytes > limits.max_header_bytes:
                    self._too_large_headers()
                else:
                    self.send_400_response("Invalid HTTP request received.")
                return
            # Headers still incomplete after this much: one header too long to finish.
            if self._in_headers and self._pending_bytes > limits.max_header_bytes:
                self._too_large_headers()

        def _too_many_headers(self) -> None:
            self._refuse(b"431 Request Header Fields Too Large",
                         f"The request has more than {limits.max_headers} headers.")

        def _too_large_headers(self) -> None:
            self._refuse(b"431 Request Header Fields Too Large",
                         f"The request's headers exceed {limits.max_header_bytes} bytes.")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_headers = True
            self._header_count = 0
            self._header_bytes = 0
            if self._header_timer is None:
                self._arm_header_timer()

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_count += 1
            self._header_bytes += len(name) + len(value) + 4
            if (self._header_count > limits.max_headers
                    or self._header_bytes > limits.max_header_bytes):
                raise _HeadersRefused
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_headers = False
            self._cancel_header_timer()
            self.scope[ABORT_SCOPE_KEY] = self.transport.abort  # type: ignore[literal-required]
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._in_headers = True  # the next request's headers, after the keep-alive wait
            self._pending_bytes = 0

        def _arm_header_timer(self) -> None:
            self._header_timer = self.loop.call_later(limits.header_timeout, self._too_slow)

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _too_slow(self) -> None:
            self._header_timer = None
            if self._in_headers and (self.cycle is None or self.cycle.response_complete):
                self._refuse(b"408 Request Timeout",
                             f"The request's headers took over {limits.header_timeout:g} s.")

        def _refuse(self, status: bytes, message: str, extra: bytes = b"") -> None:
            self._cancel_header_timer()
            if not self.transport.is_closing():
                self.transport.write(_response(status, message, extra))
                self.transport.close()

    return GuardedProtocol
