"""The live stack as one context manager: a control plane with the CRD and namespaces of its
own, Prometheus and the operator, all stopped in reverse on leaving; and what the benchmarks
that drive it share (progress lines, namespaces, deleting a deployment, a polling thread)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from autoglm_operator.resource import spec
from testkit.localcluster import LocalCluster, loopback_pod_cidr, running_cluster
from testkit.localprom import LocalPrometheus
from testkit.operator_kit import KUBECTL_FAILED, Operator
from testkit.paths import CRD_FILE
from testkit.waiting import eventually


def progress(message: str, started: float = 0.0) -> None:
    stamp = f"[{time.monotonic() - started:6.0f}s] " if started else ""
    print(f"{stamp}{message}", flush=True)


def install_crd(cluster: LocalCluster) -> None:
    cluster.kubectl("apply", "--server-side", "-f", str(CRD_FILE))
    jsonpath = '{.status.conditions[?(@.type=="Established")].status}'
    eventually(
        lambda: cluster.kubectl(
            "get", "crd", f"{spec.PLURAL}.{spec.GROUP}", "-o", f"jsonpath={jsonpath}"
        ).stdout == "True",
        60, every=0.5, what="the CRD to be Established", ignoring=KUBECTL_FAILED,
    )  # fmt: skip


def create_namespace(cluster: LocalCluster, name: str) -> None:
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")


def delete_and_wait(cluster: LocalCluster, namespace: str, name: str) -> None:
    """Delete while the operator runs (its finalizer comes off), then wait for the pods to go,
    so the next phase's pod runner starts no runtime for them."""
    cluster.kubectl("delete", "agd", name, "-n", namespace, "--timeout=60s", check=False)
    eventually(
        lambda: not cluster.get_json("pods", "-n", namespace)["items"],
        60, every=0.5, what=f"the pods of {name} to go", ignoring=KUBECTL_FAILED,
    )


@dataclass(frozen=True)
class LiveStack:
    cluster: LocalCluster
    prometheus: LocalPrometheus
    operator: Operator
    namespaces: tuple[str, ...]


@contextlib.contextmanager
def live_stack(workdir: Path, namespaces: Sequence[str], gpu_nodes: int = 2) -> Iterator[LiveStack]:
    """The control plane (loopback pod IPs, so a pod runner can serve each pod's address) with
    the CRD and `namespaces`, Prometheus, and one operator watching those namespaces."""
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(running_cluster(
            gpu_nodes=gpu_nodes, pod_cidr=loopback_pod_cidr(), workdir=workdir / "cluster"
        ))  # fmt: skip
        install_crd(cluster)
        for namespace in namespaces:
            create_namespace(cluster, namespace)
        prom = LocalPrometheus(workdir / "prometheus").start()
        stack.callback(prom.stop)
        first, *others = namespaces
        operator = Operator(cluster, first, workdir).start(
            *(arg for namespace in others for arg in ("--namespace", namespace))
        )
        stack.callback(operator.stop)
        yield LiveStack(cluster, prom, operator, tuple(namespaces))


class Poller:
    """Calls `poll` every `every` seconds in a daemon thread, from entering the context to
    leaving it; a failed poll is reported and the next one tries again."""

    def __init__(self, name: str, every: float) -> None:
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def poll(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.poll()
            except Exception as error:  # the next poll tries again; say why meanwhile
                progress(f"{self._thread.name}: {type(error).__name__}: {error}")
