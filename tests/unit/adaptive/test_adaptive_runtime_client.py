"""runtime_client against a fake runtime admin API served on loopback."""

from __future__ import annotations

import socket

import aiohttp
import pytest
from adaptive_fakes import TOKEN, FakeRuntime, serving

from autoglm_api.profiles import Mode
from autoglm_operator.io.runtime_client import (
    RuntimeClient,
    RuntimeModeMismatch,
    RuntimeRejected,
    RuntimeUnauthorized,
    RuntimeUnreachable,
)


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def client(
    session: aiohttp.ClientSession, port: int, token: str = TOKEN, **kwargs: object
) -> tuple[RuntimeClient, Sleeps]:
    sleeps = Sleeps()
    return RuntimeClient(session, token, port=port, sleep=sleeps, **kwargs), sleeps  # type: ignore[arg-type]


async def test_get_and_set_mode_verifies_with_a_fresh_get() -> None:
    runtime = FakeRuntime()
    async with serving(runtime) as port, aiohttp.ClientSession() as session:
        admin, sleeps = client(session, port)
        assert (await admin.get_mode("127.0.0.1")).mode is Mode.STREAMING
        result = await admin.set_mode("127.0.0.1", Mode.BATCHING)
    assert result.state.mode is Mode.BATCHING and result.state.switches == 1
    assert result.attempts == 1 and sleeps.calls == []
    assert runtime.mode is Mode.BATCHING
    assert runtime.requests == [("GET", None), ("PUT", '{"mode": "batching"}'), ("GET", None)]


async def test_transient_errors_are_retried_with_backoff() -> None:
    runtime = FakeRuntime(fail_next=[503, 502])
    async with serving(runtime) as port, aiohttp.ClientSession() as session:
        admin, sleeps = client(session, port, attempts=3, backoff_seconds=0.1)
        result = await admin.set_mode("127.0.0.1", Mode.BATCHING)
    assert result.attempts == 3 and runtime.mode is Mode.BATCHING
    assert sleeps.calls == [0.1, 0.2]


async def test_a_wrong_token_is_refused_without_retries() -> None:
    runtime = FakeRuntime()
    async with serving(runtime) as port, aiohttp.ClientSession() as session:
        admin, _ = client(session, port, token="wrong")
        with pytest.raises(RuntimeUnauthorized, match="401"):
            await admin.set_mode("127.0.0.1", Mode.BATCHING)
    assert len(runtime.requests) == 1 and runtime.mode is Mode.STREAMING


async def test_a_bad_request_is_not_retried() -> None:
    runtime = FakeRuntime(fail_next=[400])
    async with serving(runtime) as port, aiohttp.ClientSession() as session:
        admin, _ = client(session, port)
        with pytest.raises(RuntimeRejected, match="400"):
            await admin.set_mode("127.0.0.1", Mode.BATCHING)
    assert len(runtime.requests) == 1


async def test_a_runtime_that_does_not_switch_fails_verification() -> None:
    runtime = FakeRuntime(ignore_puts=True)
    async with serving(runtime) as port, aiohttp.ClientSession() as session:
        admin, _ = client(session, port, attempts=2)
        with pytest.raises(RuntimeModeMismatch, match="reports streaming after PUT batching"):
            await admin.set_mode("127.0.0.1", Mode.BATCHING)
    assert [m for m, _ in runtime.requests] == ["PUT", "GET", "PUT", "GET"]


async def test_an_answer_that_is_not_a_mode_document_is_rejected() -> None:
    runtime = FakeRuntime(garbage=True)
    async with serving(runtime) as port, aiohttp.ClientSession() as session:
        admin, _ = client(session, port)
        with pytest.raises(RuntimeRejected, match="not a mode document"):
            await admin.get_mode("127.0.0.1")


async def test_a_slow_runtime_times_out() -> None:
    runtime = FakeRuntime(hangs=True)
    async with serving(runtime) as port, aiohttp.ClientSession() as session:
        admin, _ = client(session, port, timeout_seconds=0.2, attempts=2)
        with pytest.raises(RuntimeUnreachable, match="Timeout"):
            await admin.get_mode("127.0.0.1")


async def test_a_closed_port_is_unreachable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with aiohttp.ClientSession() as session:
        admin, sleeps = client(session, port, attempts=3)
        with pytest.raises(RuntimeUnreachable):
            await admin.get_mode("127.0.0.1")
    assert len(sleeps.calls) == 2


async def test_urls_and_arguments() -> None:
    async with aiohttp.ClientSession() as session:
        admin = RuntimeClient(session, TOKEN)
        # The admin port, apart from the API's 8000: the launcher serves it, not the engine.
        assert admin.url("10.1.2.3") == "http://10.1.2.3:8001/autoglm/v1/mode"
        assert admin.url("fd00::12") == "http://[fd00::12]:8001/autoglm/v1/mode"
        with pytest.raises(ValueError, match="token"):
            RuntimeClient(session, "")
