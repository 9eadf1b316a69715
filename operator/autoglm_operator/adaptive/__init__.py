"""The adaptive pass's planning, pure: the metric signals it reads (signals), the mode policy
(policy: demand sizing with its capacity learning in demand, the threshold rules as fallback),
and the pass's plan of flips and repairs (planning) and its status and Events (report).

May import only `autoglm_operator.resource` (and the runtime's profiles): no kopf, no Kubernetes
or HTTP client. The loop that runs it is handlers.adaptive_pass; replay and the benchmarks run
the same policy.
"""
