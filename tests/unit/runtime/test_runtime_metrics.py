from __future__ import annotations

from prometheus_client import CollectorRegistry

from autoglm_runtime.metrics import GpuMemoryCollector, nvml_source, runtime_metrics


def test_metrics_register_once_per_registry() -> None:
    registry = CollectorRegistry()
    assert runtime_metrics(registry) is runtime_metrics(registry)
    assert runtime_metrics(CollectorRegistry()) is not runtime_metrics(registry)
    names = {m.name for m in registry.collect()}
    assert {"autoglm_mode", "autoglm_requests_admitted", "autoglm_requests_queued",
            "autoglm_requests_rejected", "autoglm_queue_wait_seconds",
            "autoglm_mode_switches"} <= names


def test_gpu_memory_absent_without_a_source() -> None:
    registry = CollectorRegistry()
    metrics = runtime_metrics(registry)
    metrics.gpu.source = None
    assert registry.get_sample_value("autoglm_gpu_memory_used_bytes", {"gpu": "0"}) is None


def test_gpu_memory_from_a_source() -> None:
    registry = CollectorRegistry()
    runtime_metrics(registry).gpu.source = lambda: [(0, 5, 10), (1, 6, 10)]
    assert registry.get_sample_value("autoglm_gpu_memory_used_bytes", {"gpu": "1"}) == 6
    assert registry.get_sample_value("autoglm_gpu_memory_total_bytes", {"gpu": "0"}) == 10


def test_a_failing_driver_does_not_break_scrapes() -> None:
    collector = GpuMemoryCollector()

    def broken() -> list[tuple[int, int, int]]:
        raise RuntimeError("driver gone")

    collector.source = broken
    assert list(collector.collect()) == []


def test_nvml_without_a_gpu_is_none() -> None:
    # This machine has no NVIDIA driver: the runtime must carry on without GPU metrics.
    source = nvml_source()
    assert source is None or all(len(sample) == 3 for sample in source())


def test_a_new_registry_never_gets_the_metrics_of_a_collected_one() -> None:
    # CPython hands a new object the id of one just freed: metrics cached by id() would go to
    # the dead registry, and the new one would serve none.
    for _ in range(50):
        registry = CollectorRegistry()
        runtime_metrics(registry).gpu.source = lambda: [(0, 5, 10)]
        assert registry.get_sample_value("autoglm_gpu_memory_used_bytes", {"gpu": "0"}) == 5
        del registry
