"""Async client for one runtime pod's admin API: read and set its live mode; sleep and wake.

`GET|PUT http://<podIP>:8001/autoglm/v1/mode` (the admin port, which the pod's launcher serves
apart from the engine's API) with `Authorization: Bearer <token>`, the token of the pod's
template; the body is `{"mode": "streaming"|"batching"}`. PUT is idempotent, so a retry after a
lost answer is safe. set_mode() is only done when a fresh GET reports the new mode: the operator
never trusts a PUT's answer alone, because the label it writes next to it must match what the
runtime really does.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from autoglm_api.profiles import ADMIN_PORT, MODE_PATH, Mode
from autoglm_api.standby import SLEEP_PATH, WAKE_PATH

_RETRIED_STATUS = {500, 502, 503, 504}


class RuntimeAdminError(Exception):
    """A mode call to one pod failed; the message names the pod's address."""

    retriable = True


class RuntimeUnreachable(RuntimeAdminError):
    pass


class RuntimeUnauthorized(RuntimeAdminError):
    retriable = False


class RuntimeRejected(RuntimeAdminError):
    retriable = False


class RuntimeModeMismatch(RuntimeAdminError):
    pass


@dataclass(frozen=True)
class RuntimeMode:
    mode: Mode
    since: str | None = None
    switches: int | None = None
    raw: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SetModeResult:
    state: RuntimeMode
    attempts: int
    seconds: float


def _host(address: str) -> str:
    try:
        if ipaddress.ip_address(address).version == 6:
            return f"[{address}]"
    except ValueError:
        pass
    return address


class RuntimeClient:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        token: str,
        *,
        port: int = ADMIN_PORT,
        timeout_seconds: float = 2.0,
        attempts: int = 3,
        backoff_seconds: float = 0.2,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if not token:
            raise ValueError("the runtime admin token is empty")
        self.session = session
        self.port = port
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self.attempts = max(1, attempts)
        self.backoff_seconds = backoff_seconds
        self.sleep = sleep
        self._headers = {"Authorization": f"Bearer {token}"}

    def url(self, address: str, path: str = MODE_PATH) -> str:
        return f"http://{_host(address)}:{self.port}{path}"

    async def _call(self, method: str, address: str, body: dict[str, Any] | None,
                    path: str = MODE_PATH) -> RuntimeMode:  # fmt: skip
        url = self.url(address, path)
        try:
            async with self.session.request(
                method, url, json=body, headers=self._headers, timeout=self.timeout
            ) as response:
                text = await response.text()
                if response.status in (401, 403):
                    raise RuntimeUnauthorized(
                        f"{method} {url}: HTTP {response.status}, token refused"
                    )
                if response.status in _RETRIED_STATUS:
                    raise RuntimeUnreachable(f"{method} {url}: HTTP {response.status} {text[:200]}")
                if response.status >= 400:
                    raise RuntimeRejected(f"{method} {url}: HTTP {response.status} {text[:200]}")
                try:
                    data = await response.json(content_type=None)
                    mode = Mode(data["mode"])
                except (ValueError, KeyError, TypeError) as error:
                    raise RuntimeRejected(
                        f"{method} {url}: answer is not a mode document: {text[:200]!r}"
                    ) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise RuntimeUnreachable(f"{method} {url}: {type(error).__name__}: {error}") from error
        switches = data.get("switches")
        return RuntimeMode(
            mode=mode,
            since=data.get("since"),
            switches=switches if isinstance(switches, int) else None,
            raw=data,
        )

    async def _retrying(
        self, action: Callable[[], Awaitable[RuntimeMode]]
    ) -> tuple[RuntimeMode, int]:
        last: RuntimeAdminError | None = None
        for attempt in range(1, self.attempts + 1):
            try:
                return await action(), attempt
            except RuntimeAdminError as error:
                if not error.retriable:
                    raise
                last = error
                if attempt < self.attempts:
                    await self.sleep(self.backoff_seconds * 2 ** (attempt - 1))
        assert last is not None
        raise last

    async def get_mode(self, address: str) -> RuntimeMode:
        state, _ = await self._retrying(lambda: self._call("GET", address, None))
        return state

    async def set_mode(self, address: str, mode: Mode) -> SetModeResult:
        """PUT the mode, then GET until the runtime reports it; raise if it never does."""
        started = time.perf_counter()

        async def put_and_verify() -> RuntimeMode:
            await self._call("PUT", address, {"mode": mode.value})
            state = await self._call("GET", address, None)
            if state.mode is not mode:
                raise RuntimeModeMismatch(
                    f"{self.url(address)} reports {state.mode.value} after PUT {mode.value}"
                )
            return state

        state, attempts = await self._retrying(put_and_verify)
        return SetModeResult(state, attempts, time.perf_counter() - started)

    async def sleep_engine(self, address: str, level: int) -> RuntimeMode:
        """Put the engine to sleep (vLLM sleep mode); refused while it serves requests."""
        state, _ = await self._retrying(
            lambda: self._call("POST", address, {"level": level}, SLEEP_PATH))
        return state

    async def wake_engine(self, address: str) -> RuntimeMode:
        """Wake the engine; a no-op when it is awake."""
        state, _ = await self._retrying(lambda: self._call("POST", address, None, WAKE_PATH))
        return state
