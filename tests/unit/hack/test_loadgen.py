"""testkit.loadgen keeps every request it sent in its report, answered or not."""

from __future__ import annotations

import asyncio

import pytest

from testkit import loadgen


class Silent:
    """A server that reads each request and never answers it (its handlers wait until the loop
    ends); `asked` is set once a request has arrived."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.asked = asyncio.Event()

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.received.append(await reader.read(65536))
        self.asked.set()
        await asyncio.Event().wait()


async def test_a_request_still_open_when_the_wait_ends_is_a_failure_not_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    silent = Silent()
    received = silent.received
    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setattr(loadgen, "WAIT_SECONDS", 0.5)
    async with server:
        report = await loadgen.run_load([f"http://127.0.0.1:{port}/v1"], lambda _: 10, 0.35)
    # Every request the server received is in the report (how many were sent in 0.35 s
    # depends on how busy this machine is, not on the report).
    assert len(received) >= 1
    assert len(report.results) == len(received)
    assert {r.error for r in report.results} == {loadgen.UNFINISHED}


def test_requests_the_caller_cuts_by_cancelling_the_load_are_not_failures() -> None:
    # Tests stop the load once they have seen what they wait for (asyncio.run then cancels what
    # it had in flight): those requests were cut by the test, not failed by the server.
    report = loadgen.LoadReport()

    async def scenario() -> None:
        silent = Silent()
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            url = f"http://127.0.0.1:{port}/v1"
            load = asyncio.create_task(loadgen.run_load([url], lambda _: 10, 5.0, report=report))
            await asyncio.wait_for(silent.asked.wait(), 10)  # a request is in flight: cut it
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)

    asyncio.run(scenario())
    assert report.results == []
