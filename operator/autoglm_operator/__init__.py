"""Kubernetes operator for AutoGLM-Phone-9B on vLLM.

The packages, each importing only those below it (pyproject.toml's layers contract):

- `cli`, `replay`: the `autoglm-operator` commands (run the operator, print the CRD, replay
  the adaptive policy over past load).
- `handlers`: the kopf handlers and the two passes they run per AutoGLMDeployment (reconcile,
  and the adaptive pass inside it), with kopf's settings.
- `io`: everything that talks to something outside the process: the Kubernetes API (the
  executor, leader election, the client under both), Prometheus, each runtime's admin API, and
  the operator's own metrics server.
- `reconcile`: pure planning of a reconcile pass: the children as they should be, the plan
  against what the cluster holds, the status.
- `adaptive`: pure planning of the adaptive pass: the metric signals, the mode policy (demand
  sizing, the threshold fallback, capacity learning), the pass's mode plan and its report.
- `resource`: the AutoGLMDeployment resource itself (the spec the CRD is generated from, the
  images it defaults to), the names and labels its children carry, the one view of a pod.
"""
