"""The vllm:* metrics of vLLM 0.32 (vllm/v1/metrics/loggers.py): same names, labels and buckets.

Each sim has its own registry so several sims in one test process do not share counters;
labels are `model_name` (the served name) and `engine` ("0"), as vLLM sets them.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def _one_two_five(max_value: int) -> list[float]:
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return out
            out.append(value)
        exponent += 1


@dataclass
class SimMetrics:
    registry: CollectorRegistry
    running: Gauge
    waiting: Gauge
    kv_usage: Gauge
    preemptions: Counter
    prompt_tokens: Counter
    generation_tokens: Counter
    success: Counter
    ttft: Histogram
    itl: Histogram
    e2e: Histogram
    queue_time: Histogram
    inference_time: Histogram
    prefill_time: Histogram
    decode_time: Histogram
    prompt_tokens_request: Histogram
    generation_tokens_request: Histogram
    iteration_tokens: Histogram
    prefix_cache_queries: Counter
    prefix_cache_hits: Counter
    sleep_state: Gauge
    labels: tuple[str, str]

    @classmethod
    def create(cls, model_name: str, max_model_len: int) -> SimMetrics:
        # Long, but only declarations: one vllm:* series each, named as vLLM names them.
        registry = CollectorRegistry()
        names = ["model_name", "engine"]
        token_buckets = _one_two_five(max_model_len)

        def hist(name: str, doc: str, buckets: tuple[float, ...] | list[float]) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=registry)

        metrics = cls(
            registry=registry,
            running=Gauge("vllm:num_requests_running",
                          "Number of requests in model execution batches.", names,
                          registry=registry),
            waiting=Gauge("vllm:num_requests_waiting",
                          "Number of requests waiting to be processed.", names,
                          registry=registry),
            kv_usage=Gauge("vllm:kv_cache_usage_perc",
                           "KV-cache usage. 1 means 100 percent usage.", names,
                           registry=registry),
            preemptions=Counter("vllm:num_preemptions",
                                "Cumulative number of preemption from the engine.", names,
                                registry=registry),
            prompt_tokens=Counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                  names, registry=registry),
            generation_tokens=Counter("vllm:generation_tokens",
                                      "Number of generation tokens processed.", names,
                                      registry=registry),
            success=Counter("vllm:request_success", "Count of successfully processed requests.",
                            [*names, "finished_reason"], registry=registry),
            ttft=hist("vllm:time_to_first_token_seconds",
                      "Histogram of time to first token in seconds.",
                      TIME_TO_FIRST_TOKEN_BUCKETS),
            itl=hist("vllm:inter_token_latency_seconds",
                     "Histogram of inter-token latency in seconds.", INTER_TOKEN_LATENCY_BUCKETS),
            e2e=hist("vllm:e2e_request_latency_seconds",
                     "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS),
            queue_time=hist("vllm:request_queue_time_seconds",
                            "Histogram of time spent in WAITING phase for request.",
                            REQUEST_LATENCY_BUCKETS),
            inference_time=hist("vllm:request_inference_time_seconds",
                                "Histogram of time spent in RUNNING phase for request.",
                                REQUEST_LATENCY_BUCKETS),
            prefill_time=hist("vllm:request_prefill_time_seconds",
                              "Histogram of time spent in PREFILL phase for request.",
                              REQUEST_LATENCY_BUCKETS),
            decode_time=hist("vllm:request_decode_time_seconds",
                             "Histogram of time spent in DECODE phase for request.",
                             REQUEST_LATENCY_BUCKETS),
            prompt_tokens_request=hist("vllm:request_prompt_tokens",
                                       "Number of prefill tokens processed.", token_buckets),
            generation_tokens_request=hist("vllm:request_generation_tokens",
                                           "Number of generation tokens processed.",
                                           token_buckets),
            iteration_tokens=hist("vllm:iteration_tokens_total",
                                  "Histogram of number of tokens per engine_step.",
                                  ITERATION_TOKENS_BUCKETS),
            prefix_cache_queries=Counter(
                "vllm:prefix_cache_queries",
                "Prefix cache queries, in terms of number of queried tokens.", names,
                registry=registry),
            prefix_cache_hits=Counter(
                "vllm:prefix_cache_hits",
                "Prefix cache hits, in terms of number of cached tokens.", names,
                registry=registry),
            sleep_state=Gauge(
                "vllm:engine_sleep_state",
                "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine "
                "is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means "
                "sleep level 2.", [*names, "sleep_state"], registry=registry),
            labels=(model_name, "0"),
        )
        # vLLM creates every labelled child up front, so series exist at zero from the start.
        for reason in FINISHED_REASONS:
            metrics.success.labels(*metrics.labels, reason)
        for metric in (metrics.running, metrics.waiting, metrics.kv_usage, metrics.preemptions,
                       metrics.prompt_tokens, metrics.generation_tokens,
                       metrics.prefix_cache_queries, metrics.prefix_cache_hits):
            metric.labels(*metrics.labels)
        return metrics
