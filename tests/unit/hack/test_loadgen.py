"""hack/loadgen.py keeps every request it sent in its report, answered or not."""

from __future__ import annotations

import asyncio

import pytest

import loadgen


async def test_a_request_still_open_when_the_wait_ends_is_a_failure_not_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        await asyncio.sleep(30)

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setattr(loadgen, "WAIT_SECONDS", 0.5)
    async with server:
        report = await loadgen.run_load([f"http://127.0.0.1:{port}/v1"], lambda _: 10, 0.35)
    assert len(report.results) >= 3
    assert {r.error for r in report.results} == {loadgen.UNFINISHED}
