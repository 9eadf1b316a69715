"""The router's SIGTERM drain, without closing kept-alive connections under a client.

uvicorn's own drain closes every idle kept-alive connection at once. A client may be sending a
request on one of them at that moment (it picked the connection from its pool before the close
reached it); that request fails and clients do not retry it (the request may have been sent).
Here the listening socket closes as before, but a kept-alive connection stays open: the next
response on it says `Connection: close` and ends it, and an idle one ends once it has been idle
for DRAINING_IDLE_SECONDS, when the clients that reach the router have stopped reusing it
(autoglm_api/keepalive.py). What is left when the drain time is over goes uvicorn's way
(closed, tasks cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from autoglm_api.keepalive import DRAINING_IDLE_SECONDS
from autoglm_router.proxy import Message, Receive, RouterApp, Scope, Send

if TYPE_CHECKING:
    from autoglm_router.picker import PickerServer

WAIT_STEP_SECONDS = 0.05

class _OpsServer(uvicorn.Server):
    """The ops port's server: it runs inside the API server's loop, whose signals stop both."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class DrainingServer(uvicorn.Server):
    def __init__(self, app: RouterApp, ops_port: int | None = None,
                 picker: PickerServer | None = None, **config: Any) -> None:
        """`config`: uvicorn.Config's keywords; the app is `app`, wrapped. With `ops_port`,
        `app.ops` (/health, /metrics) is served there, on the same host, for as long as the API
        is, drain included. `picker`, the endpoint picker, serves from the same start to the end
        of the drain."""
        super().__init__(uvicorn.Config(self._closing_when_draining, interface="asgi3", **config))
        self.draining = False
        self._app = app
        self._picker = picker
        self._ops_task: asyncio.Future[None] | None = None
        self._ops = None if ops_port is None else _OpsServer(uvicorn.Config(
            app.ops, interface="asgi3", host=config.get("host", "127.0.0.1"), port=ops_port,
            lifespan="off", log_level=config.get("log_level", "warning"), access_log=False))

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().serve(sockets)
        finally:
            if self._ops_task is not None and self._ops is not None:
                self._ops.should_exit = True
                await self._ops_task

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # The ops port opens once the API port listens: its /health may not pass before.
        if self._ops is not None and not self.should_exit:
            self._ops_task = asyncio.ensure_future(self._ops.serve())
        if self._picker is not None and not self.should_exit:
            await self._picker.start()

    async def _closing_when_draining(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_closing(message: Message) -> None:
            if self.draining and message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self._app(scope, receive, send_closing)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.draining = True
        drain = float(self.config.timeout_graceful_shutdown or 0)
        deadline = time.monotonic() + drain
        # /health fails: the API port no longer takes connections. Held requests keep waiting
        # (each is a connection in flight), and are answered before the drain ends.
        self._app.drain(deadline)
        self._close_idle_connections_sooner()
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        # The picker's gateways open new streams elsewhere; those open are requests in flight.
        picker_stopped = asyncio.ensure_future(
            self._picker.stop(drain) if self._picker is not None else asyncio.sleep(0))
        while self.server_state.connections and time.monotonic() < deadline:
            await asyncio.sleep(WAIT_STEP_SECONDS)
        await picker_stopped
        self.config.timeout_graceful_shutdown = max(1, int(deadline - time.monotonic()))
        await super().shutdown(sockets)

    def _close_idle_connections_sooner(self) -> None:
        """An idle connection's keep-alive timer moves to DRAINING_IDLE_SECONDS after its last
        answer; a busy one has none, and its answer closes it."""
        for protocol in list(self.server_state.connections):
            if not isinstance(protocol, HttpToolsProtocol | H11Protocol):
                continue
            timer = protocol.timeout_keep_alive_task
            if timer is None:
                continue
            idle_since = timer.when() - protocol.timeout_keep_alive
            timer.cancel()
            protocol.timeout_keep_alive_task = protocol.loop.call_at(
                idle_since + DRAINING_IDLE_SECONDS, protocol.timeout_keep_alive_handler
            )
