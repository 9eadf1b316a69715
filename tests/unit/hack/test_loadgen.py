"""testkit.loadgen keeps every request it sent in its report, answered or not."""

from __future__ import annotations

import asyncio

import pytest

from testkit import loadgen


async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read(65536)
    await asyncio.sleep(30)


async def test_a_request_still_open_when_the_wait_ends_is_a_failure_not_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    received: list[bytes] = []

    async def count_and_never_answer(reader: asyncio.StreamReader,
                                     writer: asyncio.StreamWriter) -> None:
        received.append(await reader.read(65536))
        await asyncio.sleep(30)

    server = await asyncio.start_server(count_and_never_answer, "127.0.0.1", 0)
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
        server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            url = f"http://127.0.0.1:{port}/v1"
            load = asyncio.create_task(loadgen.run_load([url], lambda _: 10, 5.0, report=report))
            await asyncio.sleep(0.5)
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)

    asyncio.run(scenario())
    assert report.results == []
