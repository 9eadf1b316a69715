"""The harness the tests, the benchmarks and the demo share (installed by `make venv`).

- `localcluster`: a real control plane on loopback (etcd, kube-*, kwok GPU nodes);
  `python -m testkit.localcluster up|down` for `make cluster-up` / `make cluster-down`.
- `localprom`, `podrunner`, `servicelb`: Debian's Prometheus, the kubelet stand-in that runs a
  `sim` or router per pod, and the kube-proxy stand-in for a Service.
- `operator_kit`: the operator as a subprocess, and probes on its objects.
- `history`: every version of an object a watch delivers (`kubectl get -w`), timed.
- `sim`: the CPU engine with vLLM's API and metrics and the runtime's middleware
  (`python -m testkit.sim`, docs/runtime/sim.md); `processes`: the sim and the router as child
  processes on free loopback ports (`SimProcess`, `RouterProcess`, `free_port`).
- `stack`: all of the above as one context manager, the live stack.
- `loadgen`: open-loop chat load from the `openai` client.
- `admin`: a replica's mode set through its admin API (PUT /mode with the token), checked.
- `stats`, `verdicts`, `report`, `plots`: percentiles, targets met (ties printed as ties), JSON
  under `OUT_DIR` and pages under docs/benchmarks/, and matplotlib set up for files.
- `bench`: what several benchmarks share (the policy simulator, its traces, the runtime
  workload, the scale and reaction books, vLLM's router).

Modules import the standard library at the top where `make cluster-down` runs them with the
system Python; the rest need the dev environment.
"""
