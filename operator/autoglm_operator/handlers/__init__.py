"""The kopf handlers and the passes they run: indexes of the children and one reconcile daemon
per AutoGLMDeployment (reconcile), the adaptive pass that daemon runs on its interval, with its
observe step and I/O wiring (adaptive_pass), and kopf's settings (settings).

The top of the operator below the CLI: may import every other package; talks to the API server
only through io.executor (never io.kube or the Kubernetes client directly).
"""
