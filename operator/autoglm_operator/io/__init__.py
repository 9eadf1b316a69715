"""The operator's I/O: every module here talks to something outside the process.

- kube: the Kubernetes client (idempotent writes, classified errors); only executor and leader
  import it.
- executor: carries out a pass's plan on the API server and the runtimes; the writer.
- leader: leader election on a Lease, before kopf starts.
- prom: the Prometheus queries, into adaptive signals.
- runtime_client: each runtime pod's admin API (read and set its live mode).
- metrics: the operator's own Prometheus metrics and their HTTP server.

May import `autoglm_operator.reconcile`, `autoglm_operator.adaptive` and
`autoglm_operator.resource`, never `handlers`; kube, prom, runtime_client and metrics import no
other module of this package.
"""
