"""The adaptive pass's planning, pure, top-down:

- planning: one pass's plan: repairs (label and runtime agree), the pass's decision, the flips
  in place or the Rolling share; pass_data holds the types it passes around.
- report: what the pass did, as the status fields and conditions it owns and its Events.
- policy: the mode policy's one entry (decide) and its public names; it runs
  capacity (what a replica of each mode serves: seeds, learning, in one place), then demand
  (sizing the split by per-class demand) or threshold (the fallback rules without it), over
  decision (what their steps share: replicas, hysteresis state, reasons, cooldown).
- signals: what the pass reads from Prometheus (Samples, Reading), as pure data.

May import only `autoglm_operator.resource` (and the runtime's profiles): no kopf, no Kubernetes
or HTTP client. handlers.adaptive_pass runs it; replay and the benchmarks run the same policy.
"""
