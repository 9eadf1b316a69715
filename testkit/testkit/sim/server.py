"""Run the sim under uvicorn with the production drain (SIGTERM drains, then the server exits)
and the production admin API: on a port of its own, relayed to the middleware's socket as the
launcher relays it (admin.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
from collections.abc import Generator
from typing import Any

import uvicorn

from autoglm_api.keepalive import SERVER_KEEP_ALIVE_SECONDS
from autoglm_runtime.admin import AdminServer, relay_socket, relay_to
from autoglm_runtime.config import RuntimeSettings, read_admin_token
from autoglm_runtime.middleware import drain_all
from testkit.sim.app import create_app
from testkit.sim.settings import SimSettings

log = logging.getLogger("testkit.sim")


class _DrainingServer(uvicorn.Server):
    """Uvicorn without its own signal handlers: ours drain before asking it to exit."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve_sim(host: str, port: int, settings: SimSettings,
                    admin_port: int | None = None) -> None:
    """Serve the API on `port` and, with the middleware, the admin API on `admin_port` (None:
    AUTOGLM_ADMIN_PORT)."""
    runtime = settings.runtime or RuntimeSettings()
    if not settings.with_middleware or runtime.admin_socket is not None:
        # Run by a launcher (AUTOGLM_ADMIN_SOCKET set), as vLLM is: the launcher serves the
        # admin API and the middleware listens on its socket.
        await _serve(create_app(settings), host, port, runtime)
        return
    with relay_socket() as socket_path:
        runtime = runtime.model_copy(update={"admin_socket": socket_path})
        app = create_app(dataclasses.replace(settings, runtime=runtime))
        admin = AdminServer(lambda: read_admin_token(runtime), relay_to(socket_path))
        admin_server = await admin.start(host, admin_port or runtime.admin_port)
        try:
            await _serve(app, host, port, runtime)
        finally:
            admin_server.close()


async def _serve(app: Any, host: str, port: int, runtime: RuntimeSettings) -> None:
    server = _DrainingServer(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                            timeout_keep_alive=SERVER_KEEP_ALIVE_SECONDS))
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()

    async def drain_then_exit() -> None:
        finished = await drain_all(runtime.drain_grace_seconds)
        log.warning("Drained (%s); stopping", "all done" if finished else "grace period ended")
        server.should_exit = True

    def on_signal() -> None:
        if tasks:
            server.force_exit = True  # second signal
            server.should_exit = True
            return
        task = loop.create_task(drain_then_exit())
        tasks.add(task)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    try:
        await server.serve()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
