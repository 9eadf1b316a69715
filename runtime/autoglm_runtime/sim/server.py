"""Run the sim under uvicorn with the production drain: SIGTERM drains, then the server exits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Generator

import uvicorn

from autoglm_runtime.config import RuntimeSettings
from autoglm_runtime.keepalive import SERVER_KEEP_ALIVE_SECONDS
from autoglm_runtime.middleware import drain_all
from autoglm_runtime.sim.app import SimSettings, create_app

log = logging.getLogger("autoglm_runtime.sim")


class _DrainingServer(uvicorn.Server):
    """Uvicorn without its own signal handlers: ours drain before asking it to exit."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve_sim(host: str, port: int, settings: SimSettings) -> None:
    app = create_app(settings)
    server = _DrainingServer(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                            timeout_keep_alive=SERVER_KEEP_ALIVE_SECONDS))
    runtime = settings.runtime or RuntimeSettings()
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
