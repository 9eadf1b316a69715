"""Write diurnal.csv: one synthetic day of load on a 4-replica AutoGLMDeployment, every minute.

    python examples/traces/generate.py > examples/traces/diurnal.csv

A quiet night, a morning peak (10:00) and a larger evening peak (21:00), with noise, and a
10-minute Prometheus outage at 14:00 (empty cells) to show the loop holding on missing data.
Per-replica capacity follows DESIGN.md's reference figures: about 4.1 req/s streaming, so the
queue and TTFT grow once QPS per replica passes it. Deterministic (seeded).
"""

from __future__ import annotations

import csv
import math
import random
import sys
from datetime import UTC, datetime, timedelta

REPLICAS = 4
STREAMING_CAPACITY = 4.1  # req/s per replica


def load(minute: int) -> float:
    hour = minute / 60
    night = 0.8
    morning = 11.0 * math.exp(-(((hour - 10.0) / 1.6) ** 2))
    evening = 17.0 * math.exp(-(((hour - 21.0) / 1.3) ** 2))
    return night + morning + evening


def main() -> None:
    rng = random.Random(20260115)
    start = datetime(2026, 1, 15, tzinfo=UTC)
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["timestamp", "qps", "vram_percent", "queue", "ttft_p95", "kv_cache_percent"])
    for minute in range(24 * 60):
        when = (start + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%SZ")
        if 14 * 60 <= minute < 14 * 60 + 10:
            out.writerow([when, "", "", "", "", ""])
            continue
        qps = max(0.0, load(minute) * (1 + rng.gauss(0, 0.06)))
        per_replica = qps / REPLICAS
        pressure = per_replica / STREAMING_CAPACITY
        queue = max(0.0, (pressure - 0.8) * 20 * REPLICAS + rng.gauss(0, 0.5))
        kv = min(98.0, 8 + 70 * pressure + rng.gauss(0, 2))
        vram = min(97.0, 58 + 28 * min(pressure, 1.2) + rng.gauss(0, 1))
        ttft = 0.30 * (1 + 0.4 * pressure) + 0.6 * max(0.0, pressure - 0.85) * 4
        out.writerow(
            [when, f"{qps:.3f}", f"{vram:.1f}", f"{queue:.0f}", f"{ttft:.3f}", f"{kv:.1f}"]
        )


if __name__ == "__main__":
    main()
