"""Shared pieces of the runtime benchmarks: the reference workload and a closed-loop driver."""

from __future__ import annotations

import asyncio
import base64
import functools
import io
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import openai

MODEL = "autoglm-phone-9b"
# The calibration's phone screenshot (`testkit.sim.model`'s docstring): 224x896 pixels,
# which GLM-4.1V's processor makes 8x32 = IMAGE_TOKENS prompt tokens at the default pixel budget.
SCREENSHOT_SIZE = (224, 896)


@functools.cache
def screenshot() -> str:
    """The calibration screenshot as a PNG data URL (a status bar on a light background)."""
    from PIL import Image

    width, height = SCREENSHOT_SIZE
    image = Image.new("RGB", SCREENSHOT_SIZE, (236, 239, 241))
    image.paste((33, 150, 243), (0, 0, width, height // 12))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


INSTRUCTION = (
    "You are operating an Android phone. Open the settings app, find the display section and "
    "turn on dark mode, then go back to the home screen and report what you did step by step."
)


def messages(index: int) -> Any:
    """One screenshot plus an instruction; the index keeps prompts distinct."""
    return [{
        "role": "user",
        "content": [
            {"type": "text", "text": f"[{index}] {INSTRUCTION}"},
            {"type": "image_url", "image_url": {"url": screenshot()}},
        ],
    }]


@dataclass
class Sample:
    start: float
    end: float
    ttft: float | None
    ok: bool
    error: str = ""


@dataclass
class PhaseResult:
    samples: list[Sample] = field(default_factory=list)
    window: tuple[float, float] = (0.0, 0.0)

    def in_window(self) -> list[Sample]:
        lo, hi = self.window
        return [s for s in self.samples if s.ok and s.start >= lo and s.end <= hi]

    def throughput(self) -> float:
        lo, hi = self.window
        done = [s for s in self.samples if s.ok and lo <= s.end <= hi]
        return len(done) / (hi - lo)

    def median_e2e(self) -> float:
        return statistics.median(s.end - s.start for s in self.in_window())

    def mean_e2e(self) -> float:
        return statistics.fmean(s.end - s.start for s in self.in_window())

    def mean_ttft(self) -> float:
        return statistics.fmean(s.ttft for s in self.in_window() if s.ttft is not None)

    def median_ttft(self) -> float:
        return statistics.median(s.ttft for s in self.in_window() if s.ttft is not None)

    def errors(self) -> int:
        return sum(1 for s in self.samples if not s.ok)


async def one_request(
    client: openai.AsyncOpenAI, index: int, stream: bool, max_tokens: int
) -> Sample:
    start = time.monotonic()
    ttft = None
    try:
        extra = {"ignore_eos": True}
        if stream:
            response = await client.chat.completions.create(
                model=MODEL, messages=messages(index), max_tokens=max_tokens, stream=True,
                extra_body=extra,
            )
            async for chunk in response:
                if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                    ttft = time.monotonic() - start
        else:
            await client.chat.completions.create(
                model=MODEL, messages=messages(index), max_tokens=max_tokens,
                extra_body=extra,
            )
    except Exception as exc:  # a benchmark counts failures instead of stopping
        return Sample(start, time.monotonic(), ttft, False, repr(exc))
    return Sample(start, time.monotonic(), ttft, True)


async def closed_loop(
    base_url: str, clients: int, seconds: float, warmup: float, stream: bool, max_tokens: int,
    stagger: float = 0.0,
) -> PhaseResult:
    """`clients` users each sending back to back; measure after the warm-up.

    Users start `stagger` seconds apart: real users arrive independently, and equal-length
    requests started together would stay in lockstep and prefill all at once.
    """
    result = PhaseResult()
    t0 = time.monotonic()
    result.window = (t0 + warmup, t0 + warmup + seconds)
    stop_at = result.window[1]
    counter = iter(range(10**9))
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="EMPTY",
                                  max_retries=0, timeout=120) as client:

        async def user(number: int) -> None:
            await asyncio.sleep(number * stagger)
            while time.monotonic() < stop_at:
                result.samples.append(
                    await one_request(client, next(counter), stream, max_tokens)
                )

        await asyncio.gather(*(user(n) for n in range(clients)))
    return result


def within(measured: float, published: float, tolerance: float) -> bool:
    return abs(measured - published) <= tolerance * published
