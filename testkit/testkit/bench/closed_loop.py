"""Closed-loop users against one OpenAI-compatible server (a real engine or the sim), and the
figures the engine benchmarks report.

Each user sends its next request when its last one ends. A chat streams `CHAT_TOKENS` tokens
and a job (non-streamed) `JOB_TOKENS`; `min_tokens` holds the end of turn off, so every answer
has its length. Per class: TTFT p50 and p95 (the first streamed delta, reasoning or content, as
the client sees it), TPOT p50 ((end - first) / (tokens - 1)), requests per second, and goodput
per second (the policy benchmark's SLOs: a chat's TTFT <= 0.5 s and its TPOT <= 0.1 s; a job
done within 30 s).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import io
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from openai import AsyncOpenAI

from autoglm_api.profiles import MODE_PATH
from testkit.admin import bearer, set_mode_async
from testkit.engine import ADMIN_TOKEN, CLIENT_TIMEOUT, MODEL, OPENAI_TIMEOUT
from testkit.stats import percentile

CHAT_TOKENS, JOB_TOKENS = 64, 40
CHAT_TTFT_SLO, CHAT_TPOT_SLO, JOB_SLO = 0.5, 0.1, 30.0
# A phone screenshot at the size the agent's own client sends after scaling (540x1200).
SCREENSHOT_SIZE = (540, 1200)


@dataclass(frozen=True)
class Load:
    name: str
    chats: int
    jobs: int = 0
    screenshots: bool = False  # each chat carries one screenshot


@dataclass
class Sample:
    chat: bool
    started: float
    first: float | None
    ended: float | None
    tokens: int
    error: str = ""

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.started

    @property
    def tpot(self) -> float | None:
        if self.first is None or self.ended is None:
            return None
        return (self.ended - self.first) / max(1, self.tokens - 1)

    @property
    def e2e(self) -> float | None:
        return None if self.ended is None else self.ended - self.started


@functools.cache
def screenshot_url(width: int, height: int) -> str:
    """A plain phone screen (a status bar on a light background) as a PNG data URL."""
    from PIL import Image

    image = Image.new("RGB", (width, height), (236, 239, 241))
    image.paste((33, 150, 243), (0, 0, width, height // 12))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def messages(text: str, screenshot: bool = False) -> list[dict[str, Any]]:
    if not screenshot:
        return [{"role": "user", "content": text}]
    return [{"role": "user", "content": [
        {"type": "text", "text": text},
        {"type": "image_url", "image_url": {"url": screenshot_url(*SCREENSHOT_SIZE)}},
    ]}]  # fmt: skip


def is_first_token(part: Any) -> bool:
    delta = part.choices[0].delta if part.choices else None
    if delta is None:
        return False
    extra = delta.model_extra or {}
    return bool(delta.content or extra.get("reasoning_content") or extra.get("reasoning"))


async def one(client: AsyncOpenAI, chat: bool, i: int, screenshot: bool = False) -> Sample:
    tokens = CHAT_TOKENS if chat else JOB_TOKENS
    body = {"model": MODEL, "max_tokens": tokens, "temperature": 0,
            "messages": messages(f"Step {i}: tap the search box.", screenshot and chat),
            "extra_body": {"min_tokens": tokens}}
    started = time.monotonic()
    try:
        if not chat:
            done = await client.chat.completions.create(**body)
            used = done.usage.completion_tokens if done.usage else tokens
            return Sample(chat, started, None, time.monotonic(), used)
        first, used = None, 0
        stream = await client.chat.completions.create(
            **body, stream=True, stream_options={"include_usage": True})
        async for part in stream:
            if first is None and is_first_token(part):
                first = time.monotonic()
            if part.usage is not None:
                used = part.usage.completion_tokens
        return Sample(chat, started, first, time.monotonic(), used)
    except Exception as exc:  # a failed request is data
        return Sample(chat, started, None, None, 0, f"{type(exc).__name__}: {exc}")


def openai_client(base_url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", max_retries=0,
                       timeout=OPENAI_TIMEOUT)


async def drive(base_url: str, load: Load, seconds: float) -> list[Sample]:
    """Closed-loop users for `seconds`; the requests they started then are waited for."""
    client = openai_client(base_url)
    stop_at = time.monotonic() + seconds
    samples: list[Sample] = []

    async def user(chat: bool, u: int) -> None:
        i = 0
        while time.monotonic() < stop_at:
            samples.append(await one(client, chat, u * 10_000 + i, load.screenshots))
            i += 1

    users = [user(True, u) for u in range(load.chats)]
    users += [user(False, load.chats + u) for u in range(load.jobs)]
    await asyncio.gather(*users)
    await client.close()
    return samples


def figures(samples: Sequence[Sample], seconds: float) -> dict[str, float | None]:
    chats = [(s.ttft, s.tpot) for s in samples if s.chat]
    done_chats = [(t, p) for t, p in chats if t is not None and p is not None]
    ttft = [t for t, _ in done_chats]
    tpot = [p for _, p in done_chats]
    jobs = [e for s in samples if not s.chat and (e := s.e2e) is not None]
    chat_met = sum(1 for t, p in done_chats if t <= CHAT_TTFT_SLO and p <= CHAT_TPOT_SLO)
    job_met = sum(1 for e in jobs if e <= JOB_SLO)
    return {
        "errors": float(sum(1 for s in samples if s.error)),
        "chat_ttft_p50": percentile(ttft, 0.5), "chat_ttft_p95": percentile(ttft, 0.95),
        "chat_tpot_p50": percentile(tpot, 0.5),
        "chat_rps": len(done_chats) / seconds, "job_rps": len(jobs) / seconds if jobs else None,
        "goodput": (chat_met + job_met) / seconds,
    }


async def set_mode(admin_url: str, mode: str) -> None:
    """Set the mode through the admin API (its own port), as the operator does, and wait until
    the last load's requests have left the middleware."""
    await set_mode_async(admin_url, ADMIN_TOKEN, mode, timeout=CLIENT_TIMEOUT)
    async with httpx.AsyncClient(base_url=admin_url, timeout=CLIENT_TIMEOUT,
                                 headers=bearer(ADMIN_TOKEN)) as admin:
        while (state := (await admin.get(MODE_PATH)).json())["inflight"] or state["queued"]:
            await asyncio.sleep(0.2)
