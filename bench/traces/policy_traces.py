"""Traffic traces for the policy benchmark: request arrivals, generated from a seed.

Each trace is a per-second rate of requests (the pool's total) and a mix: half the requests are
interactive streamed chats (Poisson), half batch jobs that arrive in groups of `BATCH_GROUP` at
once (a pipeline submitting a batch of screenshots), groups Poisson. Rates are written per
replica of the default 4-replica pool, so the figures read against the policy's thresholds
(default high 3 req/s per replica, low 1.5) and the published capacity (streaming 4.1 req/s per
replica, batching 7.2).

    python bench/traces/policy_traces.py   # writes out/bench/traces/<name>.csv (second, rate)
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CHAT, BATCH = 0, 1
BATCH_GROUP = 8
CHAT_SHARE = 0.5


@dataclass(frozen=True)
class Trace:
    name: str
    seconds: int
    per_replica: Callable[[np.ndarray], np.ndarray]  # seconds -> req/s per replica
    description: str
    judged_within_oracle: bool = False


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


TRACES: dict[str, Trace] = {
    t.name: t
    for t in (
        Trace("diurnal", 86400, _diurnal, "24 h: quiet night, peaks at 10:00 and 20:00", True),
        Trace("flash-crowd", 2400, _flash, "0.6/replica, 10x within one minute for 10 min", True),
        Trace("steady-low", 1800, _steady_low, "1.0 req/s per replica for 30 min"),
        Trace("steady-overload", 1800, _steady_overload, "8.5 req/s per replica for 30 min"),
        Trace("noise", 3600, _noise, "1.2-3.6 req/s per replica, new level every 20-60 s"),
    )
}


def rates(trace: Trace, replicas: int) -> np.ndarray:
    t = np.arange(trace.seconds, dtype=float)
    return trace.per_replica(t) * replicas


def arrivals(trace: Trace, replicas: int, seed: int = 1) -> list[tuple[float, int]]:
    """Sorted (time, kind) arrivals: chats Poisson, batch jobs in Poisson groups."""
    rng = np.random.default_rng(seed)
    lam = rates(trace, replicas)
    chats = rng.poisson(lam * CHAT_SHARE)
    groups = rng.poisson(lam * (1.0 - CHAT_SHARE) / BATCH_GROUP)
    out: list[tuple[float, int]] = []
    for second in range(trace.seconds):
        for x in rng.random(chats[second]):
            out.append((second + float(x), CHAT))
        for x in rng.random(groups[second]):
            at = second + float(x)
            out.extend((at, BATCH) for _ in range(BATCH_GROUP))
    out.sort(key=lambda item: item[0])
    return out


def main() -> int:
    out = Path(__file__).resolve().parents[2] / "out" / "bench" / "traces"
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
