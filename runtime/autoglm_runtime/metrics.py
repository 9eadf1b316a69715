"""autoglm_* metrics, registered once per registry so vLLM's /metrics shows them next to vllm:*.

vLLM builds its middleware stack once, but tests build many apps in one process, so the
collectors are shared per registry instead of being created per middleware instance.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from autoglm_api.profiles import Mode
from autoglm_api.standby import SLEEPING_METRIC
from autoglm_api.traffic import TrafficClass

log = logging.getLogger(__name__)

REJECT_REASONS = (
    "queue_full", "queue_timeout", "draining", "bad_request", "client_gone", "unauthorized",
    "not_served", "wake_failed",
)
# The traffic classes (traffic.py), as the router sends them: the operator's policy reads
# demand per class.
TRAFFIC_CLASSES = tuple(c.value for c in TrafficClass)
# Queue waits run from milliseconds to the longest queue timeout.
QUEUE_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# A level-1 wake takes about 0.1 to 1 s for small models and 3 to 6 s for large ones; a level-2
# wake reloads the weights from disk (vLLM's sleep mode figures, docs/runtime/sim.md).
WAKE_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60)

# (gpu index, used bytes, total bytes)
GpuMemorySample = tuple[int, int, int]
GpuMemorySource = Callable[[], Iterable[GpuMemorySample]]


@dataclass(frozen=True)
class RuntimeMetrics:
    mode: Gauge
    admitted: Counter
    received: Counter
    queued: Gauge
    inflight: Gauge
    rejected: Counter
    queue_wait: Histogram
    switches: Counter
    draining: Gauge
    sleeping: Gauge
    sleeps: Counter
    wake_seconds: Histogram
    gpu: GpuMemoryCollector


_lock = threading.Lock()
# Keyed by the registry itself, not its id(): a new registry may reuse a collected one's id.
_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, RuntimeMetrics] = (
    weakref.WeakKeyDictionary()
)


def runtime_metrics(registry: CollectorRegistry = REGISTRY) -> RuntimeMetrics:
    with _lock:
        found = _by_registry.get(registry)
        if found is not None:
            return found
        rejected = Counter(
            "autoglm_requests_rejected",
            "Requests the mode middleware turned away, by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in REJECT_REASONS:
            rejected.labels(reason)
        mode = Gauge(
            "autoglm_mode", "1 for the replica's active mode.", ["mode"], registry=registry
        )
        for m in Mode:
            mode.labels(m.value)
        received = Counter(
            "autoglm_requests_received",
            "Valid requests offered for admission (admitted, queued or turned away), by traffic "
            "class: the demand the operator sizes each mode for.",
            ["traffic_class"],
            registry=registry,
        )
        for traffic_class in TRAFFIC_CLASSES:
            received.labels(traffic_class)
        gpu = GpuMemoryCollector()
        registry.register(gpu)
        metrics = RuntimeMetrics(
            mode=mode,
            admitted=Counter(
                "autoglm_requests_admitted", "Requests admitted to the engine.", registry=registry
            ),
            received=received,
            queued=Gauge(
                "autoglm_requests_queued", "Requests waiting for admission.", registry=registry
            ),
            inflight=Gauge(
                "autoglm_requests_inflight", "Requests admitted and not finished.",
                registry=registry,
            ),
            rejected=rejected,
            queue_wait=Histogram(
                "autoglm_queue_wait_seconds",
                "Time from arrival to admission.",
                buckets=QUEUE_WAIT_BUCKETS,
                registry=registry,
            ),
            switches=Counter(
                "autoglm_mode_switches", "Live mode switches applied.", registry=registry
            ),
            draining=Gauge(
                "autoglm_draining", "1 while the replica drains.", registry=registry
            ),
            sleeping=Gauge(
                SLEEPING_METRIC,
                "1 from the start of a sleep (vLLM sleep mode) until the engine is awake again.",
                registry=registry,
            ),
            sleeps=Counter(
                "autoglm_sleeps", "Times the engine went to sleep.", registry=registry
            ),
            wake_seconds=Histogram(
                "autoglm_wake_seconds",
                "Time each wake of the engine took (a level-2 wake reloads the weights too).",
                buckets=WAKE_BUCKETS,
                registry=registry,
            ),
            gpu=gpu,
        )
        _by_registry[registry] = metrics
        return metrics


class GpuMemoryCollector(Collector):
    """Per-GPU memory, read at scrape time from whatever source is installed (NVML or sim)."""

    def __init__(self) -> None:
        self.source: GpuMemorySource | None = None

    def collect(self) -> Iterator[Metric]:
        if self.source is None:
            return
        try:
            samples = list(self.source())
        except Exception:  # a flaky driver must not break /metrics
            log.exception("reading GPU memory failed")
            return
        if not samples:
            return
        used = GaugeMetricFamily(
            "autoglm_gpu_memory_used_bytes", "GPU memory in use.", labels=["gpu"]
        )
        total = GaugeMetricFamily(
            "autoglm_gpu_memory_total_bytes", "GPU memory in total.", labels=["gpu"]
        )
        for index, used_bytes, total_bytes in samples:
            used.add_metric([str(index)], used_bytes)
            total.add_metric([str(index)], total_bytes)
        yield used
        yield total


def nvml_source() -> GpuMemorySource | None:
    """An NVML reader when a driver and at least one GPU are present, else None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:
        return None
    if count == 0:
        return None

    def read() -> list[GpuMemorySample]:
        out = []
        for index in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            out.append((index, int(info.used), int(info.total)))
        return out

    return read
