"""What the operator writes over a lifecycle, as the apiserver's audit log records it.

The lifecycle of test_scale_up_down_and_delete_cascades (create, scale up, scale down, delete),
with the operator run under a ServiceAccount of its own so that the audit log (which logs
ServiceAccount requests only, testkit.localcluster) records every request it makes. Each
phase's writes (verb, resource, subresource) must be exactly the kinds listed here: a change to
the control loop that writes something new, or stops writing something, shows up as a diff.
How many of each a phase makes depends on how fast kwok starts pods, so counts are printed
(and, with WRITE_SEQUENCE_OUT set, saved as JSON for a before/after comparison), not asserted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from testkit.localcluster import LocalCluster
from testkit.operator_kit import EXAMPLE, INSTANCE, KUBECTL_FAILED, NAME, ready_as
from testkit.waiting import eventually

pytestmark = pytest.mark.timeout(300)

WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
Write = tuple[str, str, str]  # (verb, resource, subresource)

# The kinds of write each phase makes. Leases (leader election) renew on a timer and belong to
# every phase; they are kept apart.
EXPECTED: dict[str, set[Write]] = {
    "create": {
        ("patch", "autoglmdeployments", ""),  # kopf's finalizer
        ("patch", "deployments", ""),  # server-side apply of each child
        ("patch", "services", ""),
        ("patch", "configmaps", ""),
        ("patch", "poddisruptionbudgets", ""),
        # The router's own account (spec.router is on by default); its Deployment and PDB are
        # among the deployments and poddisruptionbudgets above.
        ("patch", "serviceaccounts", ""),
        ("patch", "roles", ""),
        ("patch", "rolebindings", ""),
        ("create", "secrets", ""),  # the admin token, once
        ("patch", "pods", ""),  # a new pod's mode label
        ("patch", "autoglmdeployments", "status"),  # the one status writer
        ("create", "events", ""),
    },
    "scale up": {
        ("patch", "deployments", ""),
        ("patch", "pods", ""),
        ("patch", "autoglmdeployments", "status"),
        ("create", "events", ""),
    },
    "scale down": {
        ("patch", "deployments", ""),
        ("patch", "autoglmdeployments", "status"),
        ("create", "events", ""),
    },
    "delete": {
        ("patch", "autoglmdeployments", ""),  # kopf takes its finalizer off
    },
}


def _service_account(cluster: LocalCluster, namespace: str, workdir: Path) -> tuple[str, Path]:
    """A ServiceAccount with every permission (what it may do is test_chart's business; what it
    does is this test's), and a kubeconfig that authenticates as it."""
    account = "lifecycle-operator"
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    cluster.kubectl(
        "create", "clusterrolebinding", f"{namespace}-{account}", "--clusterrole=cluster-admin",
        f"--serviceaccount={namespace}:{account}",
    )  # fmt: skip
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration=1h")
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {"server": cluster.server, "certificate-authority": cluster.ca_file},
            }
        ],
        "users": [{"name": account, "user": {"token": token.stdout.strip()}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": account}}],
        "current-context": "sa",
    }
    path = workdir / "sa.kubeconfig"
    path.write_text(json.dumps(config))
    return f"system:serviceaccount:{namespace}:{account}", path


def _writes(events: list[dict[str, Any]], namespace: str) -> list[tuple[float, Write, str]]:
    """The user's writes in this namespace, in the order the apiserver answered them."""
    rows = []
    for event in events:
        ref = event.get("objectRef") or {}
        if event.get("verb") not in WRITE_VERBS or ref.get("namespace") != namespace:
            continue
        at = str(event.get("stageTimestamp") or event.get("requestReceivedTimestamp"))
        when = datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
        write = (str(event["verb"]), str(ref.get("resource")), str(ref.get("subresource") or ""))
        rows.append((when, write, str(ref.get("name") or "")))
    return sorted(rows, key=lambda r: r[0])


def test_the_lifecycle_writes_what_it_always_wrote(
    cluster: LocalCluster, crd: str, namespace: str, tmp_path: Path
) -> None:
    user, kubeconfig = _service_account(cluster, namespace, tmp_path)
    log = tmp_path / "operator.log"
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("autoglm-operator")), "run",
         "--namespace", namespace, "--lease-seconds", "15"],
        env={**cluster.env, "KUBECONFIG": str(kubeconfig), "PYTHONUNBUFFERED": "1",
             "AUTOGLM_OPERATOR_METRICS_PORT": "0"},
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    marks: list[tuple[str, float]] = []
    try:
        marks.append(("create", time.time()))
        cluster.apply(EXAMPLE, namespace=namespace)
        eventually(ready_as(cluster, namespace, "2/2"), 90, every=0.5, what="2/2",
                   ignoring=KUBECTL_FAILED)
        marks.append(("scale up", time.time()))
        cluster.kubectl("scale", "agd", NAME, "-n", namespace, "--replicas=3")
        eventually(ready_as(cluster, namespace, "3/3"), 90, every=0.5, what="3/3",
                   ignoring=KUBECTL_FAILED)
        marks.append(("scale down", time.time()))
        cluster.kubectl("scale", "agd", NAME, "-n", namespace, "--replicas=1")
        eventually(ready_as(cluster, namespace, "1/1"), 90, every=0.5, what="1/1",
                   ignoring=KUBECTL_FAILED)
        time.sleep(3)  # the status after the last pod went
        marks.append(("delete", time.time()))
        cluster.kubectl("delete", "agd", NAME, "-n", namespace, "--timeout=60s")

        def all_gone() -> bool:
            kinds = "deploy,rs,pods,svc,pdb,cm,secret"
            left = cluster.kubectl("get", kinds, "-n", namespace, "-l", INSTANCE, "-o", "name")
            return not left.stdout.split()

        eventually(all_gone, 60, every=0.5, what="every child deleted", ignoring=KUBECTL_FAILED)
        time.sleep(2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        print(log.read_text(errors="replace")[-3000:])
        # Cluster-scoped: the namespace's deletion would leave it behind.
        binding = f"clusterrolebinding/{user.rsplit(':', 2)[1]}-{user.rsplit(':', 1)[1]}"
        cluster.kubectl("delete", binding, "--ignore-not-found", check=False)

    phases: dict[str, list[tuple[float, Write, str]]] = {name: [] for name, _ in marks}
    for when, write, name in _writes(cluster.audit_events(user), namespace):
        phase = next((p for p, start in reversed(marks) if start <= when), "create")
        phases[phase].append((when, write, name))
    record = {
        phase: [[*write, name] for _, write, name in rows if write[1] != "leases"]
        for phase, rows in phases.items()
    }
    for phase, rows in record.items():
        counts = Counter(tuple(r[:3]) for r in rows)
        print(f"{phase}: " + ", ".join(f"{'/'.join(k)} x{n}" for k, n in sorted(counts.items())))
    if os.environ.get("WRITE_SEQUENCE_OUT"):
        # The Events' reasons too: the audit log names neither an Event nor its reason.
        posted = cluster.get_json("events", "-n", namespace)["items"]
        reasons = Counter(str(e.get("reason")) for e in posted for _ in range(e.get("count") or 1))
        out = {**record, "event reasons": sorted(reasons.items())}
        Path(os.environ["WRITE_SEQUENCE_OUT"]).write_text(json.dumps(out, indent=1))
    for phase, expected in EXPECTED.items():
        assert {tuple(r[:3]) for r in record[phase]} == expected, phase
