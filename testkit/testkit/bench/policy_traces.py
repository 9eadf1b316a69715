"""Traffic traces for the policy benchmark: request arrivals, generated from a seed.

Each trace is a per-second rate of requests (the pool's total), a chat share that may change
over time, and request shapes. Chats are interactive and streamed (Poisson); batch jobs arrive
in groups of `BATCH_GROUP` at once (a pipeline submitting a batch of screenshots), groups
Poisson. Rates are written per replica of the default 4-replica pool, so the figures read
against the policy's thresholds (default high 3 req/s per replica, low 1.5) and the published
capacity (streaming 4.1 req/s per replica, batching 7.2).

Shapes (output is the workload's 64 tokens per chat, 40 per batch job):

- `agent`, every chat unless a trace says otherwise: a step of AutoGLM-Phone-9B's own phone
  agent (`AgentPrompt`, the request testkit.agent sends): its system prompt, the task and the
  earlier steps as text with their answers kept, and this step's 1080x2400 screenshot at the
  default pixel budget. The trace's chat arrivals are numbered into conversations by
  `agent_steps` (below), so the arrivals, and each class's demand, are the trace's own.
- `SHAPES`, fixed (prompt text tokens, images of the calibration's 256 tokens): `screenshot`
  60 text tokens + 1 screenshot (the calibration workload: every batch job), `text` 200 text
  tokens and no image (a chat that is not the agent's), `long` 3000 text tokens + 1 screenshot
  (a batch job with a long instruction and history).

How chat arrivals become agent steps (`agent_steps`, open loop: no arrival moves): each chat
continues the conversation whose last step is the oldest, once that step is at least
`STEP_CYCLE_SECONDS` old (the agent's cycle: the answer, the phone's action, the next
screenshot); when no conversation is that far along, the chat is the first step of a new one,
of 2 to `AgentPrompt.steps_that_fit(2048)` steps (6: every step fits the default context,
uniformly drawn). So the number of conversations open follows the chat rate (about rate x
cycle), and a burst of chats is a burst of new conversations.

The traces (rates per replica; chat share 0.5 unless written):

- diurnal, 24 h: 0.3 at night, peaks of 5.0 at 10:00 and 5.7 at 20:00, 1.5 at 15:00.
- flash-crowd, 40 min: 0.6, 10x within one minute at 10 min, held 10 min, 5 min decay.
- steady-low, 30 min: 1.0. steady-overload, 30 min: 8.5.
- noise, 1 h: a new level every 20-60 s, uniform in 1.2-3.6.
- day-night, 4 h (a day compressed 6x): total 2.0 +- 1.0 sinusoidal; chat share 0.85 in the
  "day" half (peak chat), 0.15 at "night" (batch pipelines), smooth 10-min transitions.
- chat-flash-on-batch, 40 min: batch jobs steady at 2.5; chats 0.3, rising within one minute at
  10 min to 3.5, held 10 min, 5 min decay.
- batch-dump, 40 min: chats steady at 2.0 (chat share 1.0) and, at 10 min, `DUMP_JOBS` = 2000
  `long` batch jobs submitted within 10 s.
- text-vs-screenshot, 40 min: 2.5 steady, chat share 0.7; chats are `text` in the first and
  third 10 min, `screenshot` in the second and fourth.
- weekly-drift, 2 h (a week compressed 84x): total 1.2-3.6 following seven slow daily cycles
  and a rising weekly trend; chat share drifting from 0.8 to 0.2 over the week.

    python bench/traces/policy_traces.py   # writes out/bench/traces/<name>.csv (second, rate)
"""

from __future__ import annotations

import csv
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from autoglm_api.image_budget import AGENT_SYSTEM_TOKENS, AGENT_TEXT_TOKENS, image_tokens
from autoglm_router.features import DEFAULT_IMAGE_MAX_PIXELS
from testkit.paths import OUT_DIR

CHAT, BATCH = 0, 1
BATCH_GROUP = 8
CHAT_SHARE = 0.5
# Request shapes, the index is an arrival's `shape`: SHAPES holds the fixed ones as (text
# tokens, images); an AGENT step's prompt depends on its step (AgentPrompt).
SCREENSHOT, TEXT, LONG, AGENT = 0, 1, 2, 3
SHAPES: tuple[tuple[int, int], ...] = ((60, 1), (200, 0), (3000, 1))
DUMP_JOBS = 2000
STEP_CYCLE_SECONDS = 3.0
DEFAULT_MAX_MODEL_LEN = 2048


class Arrival(NamedTuple):
    time: float
    kind: int
    shape: int = SCREENSHOT
    conversation: int = -1  # an agent step's task, numbered in the order they start
    step: int = 0


@dataclass(frozen=True)
class AgentPrompt:
    """One phone-agent step's prompt in tokens, by the arithmetic of
    docs/reference/resource-notes.md ("The phone agent's loop"): step k carries the system
    prompt, the first step's text (the task), k earlier steps as text with their answers kept,
    and its own screenshot; the agent strips the screenshots of earlier steps."""

    system: int = AGENT_SYSTEM_TOKENS  # the English system prompt (~2.6 KB)
    # The task and first screen info, the chat template, the image's delimiters (766 in all
    # with the system prompt).
    first_text: int = AGENT_TEXT_TOKENS - AGENT_SYSTEM_TOKENS
    step_text: int = 20  # a later step's screen info and turn markers
    answer: int = 64  # what the model writes a step (50-80 tokens): the chat's output
    # A native 1080x2400 screenshot, scaled to the default budget (738 tokens).
    image: int = image_tokens(1080, 2400, DEFAULT_IMAGE_MAX_PIXELS)

    def prompt(self, step: int) -> int:
        return self.system + self.first_text + self.image + step * (self.step_text + self.answer)

    def shared_with_later_steps(self, step: int) -> int:
        """The leading tokens of this step's prompt that the conversation's later steps send
        again: everything before its user message, whose screenshot they strip."""
        if step == 0:
            return self.system
        return (self.system + self.first_text + self.answer
                + (step - 1) * (self.step_text + self.answer))  # fmt: skip

    def steps_that_fit(self, max_model_len: int) -> int:
        """Steps whose prompt and answer fit in `max_model_len`."""
        return 1 + (max_model_len - self.prompt(0) - self.answer) // (self.step_text + self.answer)


Curve = Callable[[np.ndarray], np.ndarray]


def _half(t: np.ndarray) -> np.ndarray:
    return np.full_like(t, CHAT_SHARE)


def _screenshots(t: np.ndarray) -> np.ndarray:
    return np.zeros_like(t)


@dataclass(frozen=True)
class Trace:
    name: str
    seconds: int
    per_replica: Curve  # seconds -> req/s per replica (chats and batch jobs)
    description: str
    chat_share: Curve = _half  # seconds -> share of requests that are chats
    text_chats: Curve = _screenshots  # seconds -> share of chats without a screenshot
    dump: tuple[float, int, float] | None = None  # (start, jobs, spread s): long batch jobs


def _diurnal(t: np.ndarray) -> np.ndarray:
    hour = t / 3600.0

    def bump(center: float, width: float, height: float) -> np.ndarray:
        return height * np.exp(-0.5 * ((hour - center) / width) ** 2)

    # Quiet night (~0.3/replica), a morning peak at 10:00 and a higher evening peak at 20:00.
    return 0.3 + bump(10.0, 1.5, 4.7) + bump(15.0, 2.5, 1.2) + bump(20.0, 1.2, 5.4)


def _flash(t: np.ndarray) -> np.ndarray:
    base = 0.6
    start, ramp, hold, decay = 600.0, 60.0, 600.0, 300.0
    up = np.clip((t - start) / ramp, 0.0, 1.0)
    down = np.clip((t - (start + ramp + hold)) / decay, 0.0, 1.0)
    return base * (1.0 + 9.0 * up * (1.0 - down))  # 10x within one minute, held 10 minutes


def _steady_low(t: np.ndarray) -> np.ndarray:
    return np.full_like(t, 1.0)


def _steady_overload(t: np.ndarray) -> np.ndarray:
    return np.full_like(t, 8.5)


def _noise(t: np.ndarray, seed: int = 7) -> np.ndarray:
    # Load that wanders across both thresholds (low 1.5, high 3.0 req/s per replica): a new
    # level every 20-60 s, uniformly between 1.2 and 3.6.
    rng = np.random.default_rng(seed)
    out = np.empty_like(t)
    i = 0
    n = len(t)
    while i < n:
        span = int(rng.integers(20, 61))
        out[i : i + span] = rng.uniform(1.2, 3.6)
        i += span
    return out


def _smoothstep(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3 - 2 * x)


def _day_night_total(t: np.ndarray) -> np.ndarray:
    return 2.0 + 1.0 * np.sin(2 * np.pi * t / 14400.0)


def _day_night_share(t: np.ndarray) -> np.ndarray:
    # Day (first half of the 4 h): 0.85 chats; night: 0.15; 10-minute transitions.
    day = _smoothstep((t - 0.0) / 600.0) * (1 - _smoothstep((t - 7200.0) / 600.0))
    return 0.15 + 0.7 * np.where(t < 600.0, 1.0, day)


_FLASH_START, _FLASH_RAMP, _FLASH_HOLD, _FLASH_DECAY = 600.0, 60.0, 600.0, 300.0


def _flash_shape(t: np.ndarray) -> np.ndarray:
    up = np.clip((t - _FLASH_START) / _FLASH_RAMP, 0.0, 1.0)
    down = np.clip((t - (_FLASH_START + _FLASH_RAMP + _FLASH_HOLD)) / _FLASH_DECAY, 0.0, 1.0)
    return up * (1.0 - down)


def _chat_flash_total(t: np.ndarray) -> np.ndarray:
    return 2.5 + 0.3 + 3.2 * _flash_shape(t)


def _chat_flash_share(t: np.ndarray) -> np.ndarray:
    return (0.3 + 3.2 * _flash_shape(t)) / _chat_flash_total(t)


def _text_halves(t: np.ndarray) -> np.ndarray:
    return ((t // 600.0) % 2 == 0).astype(float)


def _weekly_total(t: np.ndarray) -> np.ndarray:
    day = 7200.0 / 7
    return 1.8 + 1.2 * t / 7200.0 + 0.6 * np.sin(2 * np.pi * t / day - np.pi / 2)


def _weekly_share(t: np.ndarray) -> np.ndarray:
    return 0.8 - 0.6 * t / 7200.0


TRACES: dict[str, Trace] = {
    t.name: t
    for t in (
        Trace("diurnal", 86400, _diurnal, "24 h: quiet night, peaks at 10:00 and 20:00"),
        Trace("flash-crowd", 2400, _flash, "0.6/replica, 10x within one minute for 10 min"),
        Trace("steady-low", 1800, _steady_low, "1.0 req/s per replica for 30 min"),
        Trace("steady-overload", 1800, _steady_overload, "8.5 req/s per replica for 30 min"),
        Trace("noise", 3600, _noise, "1.2-3.6 req/s per replica, new level every 20-60 s"),
        Trace(
            "day-night",
            14400,
            _day_night_total,
            "4 h: chat-heavy day, batch-heavy night",
            chat_share=_day_night_share,
        ),
        Trace(
            "chat-flash-on-batch",
            2400,
            _chat_flash_total,
            "batch 2.5/replica steady; chats 0.3 -> 3.5 within a minute for 10 min",
            chat_share=_chat_flash_share,
        ),
        Trace(
            "batch-dump",
            2400,
            lambda t: np.full_like(t, 2.0),
            f"chats 2.0/replica; {DUMP_JOBS} long-prompt batch jobs within 10 s at 10 min",
            chat_share=lambda t: np.ones_like(t),
            dump=(600.0, DUMP_JOBS, 10.0),
        ),
        Trace(
            "text-vs-screenshot",
            2400,
            lambda t: np.full_like(t, 2.5),
            "2.5/replica, 70% chats: text-only and screenshot chats alternating every 10 min",
            chat_share=lambda t: np.full_like(t, 0.7),
            text_chats=_text_halves,
        ),
        Trace(
            "weekly-drift",
            7200,
            _weekly_total,
            "a week in 2 h: daily cycles, rising load, chat share 0.8 -> 0.2",
            chat_share=_weekly_share,
        ),
    )
}


def rates(trace: Trace, replicas: int) -> np.ndarray:
    t = np.arange(trace.seconds, dtype=float)
    return trace.per_replica(t) * replicas


def shaped_arrivals(trace: Trace, replicas: int, seed: int = 1) -> list[Arrival]:
    """Sorted arrivals: chats Poisson (agent steps, numbered into conversations, unless the
    trace makes them text chats), batch jobs in Poisson groups."""
    rng = np.random.default_rng(seed)
    t = np.arange(trace.seconds, dtype=float)
    lam = rates(trace, replicas)
    share = trace.chat_share(t)
    text = trace.text_chats(t)
    chats = rng.poisson(lam * share)
    groups = rng.poisson(lam * (1.0 - share) / BATCH_GROUP)
    out: list[Arrival] = []
    for second in range(trace.seconds):
        for x, y in zip(rng.random(chats[second]), rng.random(chats[second]), strict=True):
            out.append(Arrival(second + float(x), CHAT, TEXT if y < text[second] else AGENT))
        for x in rng.random(groups[second]):
            at = second + float(x)
            out.extend(Arrival(at, BATCH, SCREENSHOT) for _ in range(BATCH_GROUP))
    if trace.dump is not None:
        start, jobs, spread = trace.dump
        out.extend(Arrival(start + float(x) * spread, BATCH, LONG) for x in rng.random(jobs))
    out.sort(key=lambda item: item.time)
    return agent_steps(out, rng)


def agent_steps(arrivals: Sequence[Arrival], rng: np.random.Generator,
                longest: int = AgentPrompt().steps_that_fit(DEFAULT_MAX_MODEL_LEN),
                cycle: float = STEP_CYCLE_SECONDS) -> list[Arrival]:  # fmt: skip
    """The AGENT arrivals numbered into conversations and steps (the module docstring's rule);
    the others as they are."""
    waiting: deque[tuple[float, int, int, int]] = deque()  # (last step, conversation, step, of)
    started = 0
    out: list[Arrival] = []
    for arrival in arrivals:
        if arrival.shape != AGENT:
            out.append(arrival)
            continue
        if waiting and waiting[0][0] + cycle <= arrival.time:
            _, conversation, step, steps = waiting.popleft()
            step += 1
        else:
            conversation, step, steps = started, 0, int(rng.integers(2, longest + 1))
            started += 1
        out.append(arrival._replace(conversation=conversation, step=step))
        if step + 1 < steps:
            waiting.append((arrival.time, conversation, step, steps))  # the newest: last
    return out


def arrivals(trace: Trace, replicas: int, seed: int = 1) -> list[tuple[float, int]]:
    """Sorted (time, kind) arrivals, shapes dropped (for engines that take one shape)."""
    return [(a.time, a.kind) for a in shaped_arrivals(trace, replicas, seed)]


def main() -> int:
    out = OUT_DIR / "traces"
    out.mkdir(parents=True, exist_ok=True)
    for trace in TRACES.values():
        path = out / f"{trace.name}.csv"
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["second", "qps_total_4_replicas"])
            for second, rate in enumerate(rates(trace, 4)):
                writer.writerow([second, f"{rate:.3f}"])
        print(f"wrote {path} ({trace.description}; mean {rates(trace, 4).mean():.2f} req/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
