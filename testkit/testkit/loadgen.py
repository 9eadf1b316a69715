"""A bounded open-loop load generator using the official `openai` client.

Requests start on a schedule (QPS as a function of time), stream their answer, and record
time-to-first-token, total latency and failures. Bounded in count and time; loopback only.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import openai

PROMPTS = [
    "Open the settings app and turn on dark mode.",
    "Find the cheapest flight from Beijing to Shanghai tomorrow morning.",
    "Reply to the last message from Mom saying I will be late.",
    "Describe what is on this screen and which button starts a new chat.",
]

WAIT_SECONDS = 180  # for the requests in flight once the last one is sent
UNFINISHED = f"unfinished: still open {WAIT_SECONDS} s after the load ended"


@dataclass
class RequestResult:
    started: float
    ttft: float | None
    latency: float | None
    error: str | None = None
    target: str = ""
    output_tokens: int | None = None  # the server's usage count, where it was asked for


@dataclass
class LoadReport:
    results: list[RequestResult] = field(default_factory=list)

    @property
    def failures(self) -> list[RequestResult]:
        return [r for r in self.results if r.error is not None]

    def window(self, start: float, end: float) -> list[RequestResult]:
        return [r for r in self.results if start <= r.started < end]


async def one_request(
    client: openai.AsyncOpenAI,
    model: str,
    max_tokens: int,
    extra_body: dict[str, Any] | None = None,
    stream: bool = True,
    usage: bool = False,
) -> RequestResult:
    """One request; `usage` asks a stream for its token counts (stream_options.include_usage)."""
    started = time.monotonic()
    first: float | None = None
    tokens: int | None = None
    try:
        if not stream:  # a batch job: the whole answer at once, no time to first token
            answer = await client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": random.choice(PROMPTS)}],
                max_tokens=max_tokens,
                stream=False,
                extra_body=extra_body,
            )
            tokens = answer.usage.completion_tokens if answer.usage else None
            return RequestResult(started, None, time.monotonic() - started, output_tokens=tokens)
        chunks = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": random.choice(PROMPTS)}],
            max_tokens=max_tokens,
            stream=True,
            extra_body=extra_body,
            stream_options={"include_usage": True} if usage else openai.omit,
        )
        async for chunk in chunks:
            if first is None and chunk.choices and (chunk.choices[0].delta.content or ""):
                first = time.monotonic()
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        done = time.monotonic()
        return RequestResult(started, (first or done) - started, done - started,
                             output_tokens=tokens)  # fmt: skip
    except Exception as exc:  # a failed request is data, not a crash
        return RequestResult(started, None, None, error=f"{type(exc).__name__}: {exc}")


async def run_load(
    base_urls: Sequence[str] | Callable[[], Sequence[str]],
    qps_at: Callable[[float], float],
    duration: float,
    model: str = "autoglm-phone-9b",
    max_tokens: int = 64,
    max_requests: int = 20000,
    report: LoadReport | None = None,
    extra_body: dict[str, Any] | None = None,
    max_retries: int = 0,
    stream: bool = True,
    usage: bool = False,
    stop: asyncio.Event | None = None,
) -> LoadReport:
    """Send requests for `duration` seconds at `qps_at(elapsed)` spread over `base_urls`
    (a list, or a callable returning the current list, e.g. each ready replica). `extra_body`
    goes into every request, as vLLM's own sampling fields (`min_tokens`, ...). `max_retries` is
    the client's own (the `openai` default is 2); 0 counts every refused attempt as a failure.
    `stream` False sends non-streamed requests (batch jobs) instead of streamed chats; `usage`
    asks streams for their token counts. `stop`, once set, ends the sending before `duration`
    (what is in flight is still awaited and recorded, unlike a cancel). A request still open
    WAIT_SECONDS after the last one was sent is recorded as a failure ("unfinished"), not
    dropped; requests the caller cuts by cancelling the load are not recorded."""
    report = report or LoadReport()
    clients: dict[str, openai.AsyncOpenAI] = {}
    tasks: set[asyncio.Task[None]] = set()
    start = time.monotonic()
    sent = 0
    credit = 0.0
    last = start
    waited_out = False  # set once the wait for the last requests is over

    async def send(url: str) -> None:
        started = time.monotonic()
        try:
            result = await one_request(clients[url], model, max_tokens, extra_body, stream, usage)
        except asyncio.CancelledError:
            if waited_out:
                report.results.append(RequestResult(started, None, None, UNFINISHED, url))
            raise
        result.target = url
        report.results.append(result)

    while (now := time.monotonic()) - start < duration and sent < max_requests \
            and not (stop is not None and stop.is_set()):
        credit += qps_at(now - start) * (now - last)
        last = now
        urls = list(base_urls() if callable(base_urls) else base_urls)
        while credit >= 1 and urls and sent < max_requests:
            url = urls[sent % len(urls)]
            if url not in clients:
                clients[url] = openai.AsyncOpenAI(
                    base_url=url, api_key="EMPTY", max_retries=max_retries, timeout=120
                )
            task = asyncio.create_task(send(url))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
            credit -= 1
        await asyncio.sleep(0.02)
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=WAIT_SECONDS)
        waited_out = True
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for c in clients.values():
        await c.close()
    return report

