"""What several benchmarks share: the policy simulator and its traces, the runtime workload,
the operator-scale and reaction books, and vLLM's own router."""
