"""An ASGI app served by uvicorn on a loopback port, in a thread: the tests' fake replicas."""

from __future__ import annotations

import threading
import time
from typing import Any, Self

import uvicorn


class ServedOnLoopback:
    """Mixin: `start` serves `self.app` on 127.0.0.1:`self.port` until `stop`."""

    port: int
    app: Any

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="error",
                                lifespan="off", interface="asgi3")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, f"{type(self).__name__} did not start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
