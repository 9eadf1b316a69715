"""What the cluster tests share: the operator as a subprocess that logs its API calls, and
probes on the example AutoGLMDeployment's objects."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from autoglm_api.profiles import MODE_PATH
from autoglm_operator.reconcile.children import serving
from testkit.localcluster import LocalCluster, free_port
from testkit.paths import REPO
from testkit.waiting import eventually

EXAMPLE = yaml.safe_load((REPO / "examples" / "autoglm.yaml").read_text())
NAME = EXAMPLE["metadata"]["name"]
HASH_ANNOTATION = "autoglm.io/template-hash"
MODE_LABEL = "autoglm.io/mode"
# The serving objects of the example (the router's carry app.kubernetes.io/name=autoglm-router).
INSTANCE = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/name=autoglm"

# Runs the console script's main() after wrapping both HTTP stacks the operator uses (kopf's
# aiohttp, which also carries the runtime admin calls, and the kubernetes client's urllib3) so
# each request is logged with its time. A failpoint, DIE_AFTER_ENV = "METHOD url-part body-part",
# SIGKILLs the process the moment the first matching request has been answered.
DIE_AFTER_ENV = "OPERATOR_KIT_DIE_AFTER"
COUNTING_WRAPPER = r"""
import json, os, signal, sys, time
import aiohttp, urllib3
log = open(sys.argv[1], "a", buffering=1)
die_after = os.environ.get("OPERATOR_KIT_DIE_AFTER", "").split(" ")
def note(client, method, url):
    row = {"t": time.time(), "client": client, "method": str(method).upper(), "url": str(url)}
    log.write(json.dumps(row) + "\n")
def maybe_die(method, url, body):
    if len(die_after) == 3 and str(method).upper() == die_after[0] and die_after[1] in str(url) \
            and die_after[2] in str(body):
        os.kill(os.getpid(), signal.SIGKILL)
aio_request = aiohttp.ClientSession._request
async def _request(self, method, url, *args, **kwargs):
    params = kwargs.get("params")
    note("kopf", method, f"{url}?{params}" if params else url)
    response = await aio_request(self, method, url, *args, **kwargs)
    maybe_die(method, url, kwargs.get("json") or kwargs.get("data"))
    return response
aiohttp.ClientSession._request = _request
pool_urlopen = urllib3.PoolManager.urlopen
def urlopen(self, method, url, *args, **kwargs):
    agent = (kwargs.get("headers") or {}).get("User-Agent", "")
    note(agent if agent.startswith("autoglm-operator") else "kubernetes-client", method, url)
    response = pool_urlopen(self, method, url, *args, **kwargs)
    maybe_die(method, url, kwargs.get("body"))
    return response
urllib3.PoolManager.urlopen = urlopen
from autoglm_operator.cli import main
main(sys.argv[2:])
"""

# For eventually(..., ignoring=KUBECTL_FAILED): a probe's kubectl failing (the object not there
# yet, the apiserver restarting) is a "not yet"; the last failure, its stderr included, is what a
# timeout reports.
KUBECTL_FAILED = (subprocess.CalledProcessError,)


@dataclass
class Operator:
    cluster: LocalCluster
    namespace: str
    workdir: Path
    args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    metrics_port: int = 0  # the operator's own /metrics, on 127.0.0.1

    @property
    def calls_file(self) -> Path:
        return self.workdir / "api-calls.jsonl"

    @property
    def log_file(self) -> Path:
        return self.workdir / f"operator-{self.starts}.log"

    def start(self, *extra: str, die_after: str = "") -> Operator:
        """Start the operator; `die_after` ("METHOD url-part body-part") arms the failpoint."""
        self.starts += 1
        wrapper = self.workdir / "run_counted.py"
        wrapper.write_text(COUNTING_WRAPPER)
        argv = ["run", "--namespace", self.namespace, "--lease-seconds", "15", *self.args, *extra]
        self.metrics_port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, str(wrapper), str(self.calls_file), *argv],
            env={
                **self.cluster.env,
                "PYTHONUNBUFFERED": "1",
                "AUTOGLM_OPERATOR_METRICS_PORT": str(self.metrics_port),
                "AUTOGLM_OPERATOR_METRICS_ADDR": "127.0.0.1",
                DIE_AFTER_ENV: die_after,
            },
            stdout=self.log_file.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.workdir.glob("operator-*.log"))
        )

    def calls(self, since: float, until: float) -> list[dict[str, Any]]:
        """Requests the operator sent to the apiserver in [since, until). A missing log is an
        error, not an empty list: a test that asserts no calls must not pass on no record."""
        if not self.calls_file.exists():
            raise AssertionError(f"no API call log at {self.calls_file}: did the operator start?")
        api = urlparse(self.cluster.server).netloc
        rows = [json.loads(line) for line in self.calls_file.read_text().splitlines() if line]
        return [r for r in rows if since <= r["t"] < until and api in r["url"]]


# -- helpers ---------------------------------------------------------------------------------


def agd_object(**spec: Any) -> dict[str, Any]:
    obj = json.loads(json.dumps(EXAMPLE))
    obj["spec"].update(spec)
    return obj


def get(cluster: LocalCluster, ns: str, *what: str) -> dict[str, Any]:
    return cluster.get_json(*what, "-n", ns)


def status(cluster: LocalCluster, ns: str) -> dict[str, Any]:
    return get(cluster, ns, "agd", NAME).get("status") or {}


def condition(st: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions") or [] if c["type"] == kind), {})


def live_pods(cluster: LocalCluster, ns: str) -> list[dict[str, Any]]:
    items = get(cluster, ns, "pods", "-l", INSTANCE)["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def pod_modes(cluster: LocalCluster, ns: str) -> dict[str, str]:
    """Each live pod's mode label ("" while it has none)."""
    return {
        p["metadata"]["name"]: (p["metadata"].get("labels") or {}).get(MODE_LABEL, "")
        for p in live_pods(cluster, ns)
    }


def ready_as(cluster: LocalCluster, ns: str, ready: str) -> Callable[[], dict[str, Any] | None]:
    """A probe: the status once it says Ready=True, `ready` replicas, rollout settled."""

    def probe() -> dict[str, Any] | None:
        st = status(cluster, ns)
        settled = (
            st.get("ready") == ready
            and condition(st, "Ready").get("status") == "True"
            and condition(st, "Progressing").get("status") == "False"
            and len(live_pods(cluster, ns)) == int(ready.split("/")[1])
            # every pod labelled with a mode
            and st.get("streamingReplicas", 0) + st.get("batchingReplicas", 0) == st.get("replicas")
        )
        return st if settled else None

    return probe


def deploy(cluster: LocalCluster, ns: str, obj: dict[str, Any], ready: str) -> dict[str, Any]:
    cluster.apply(obj, namespace=ns)
    return eventually(ready_as(cluster, ns, ready), 60, every=0.5, what=f"status {ready} Ready",
                      ignoring=KUBECTL_FAILED)


def patch_agd(cluster: LocalCluster, ns: str, patch: dict[str, Any]) -> None:
    cluster.kubectl("patch", "agd", NAME, "-n", ns, "--type=merge", "-p", json.dumps(patch))


def events(cluster: LocalCluster, ns: str) -> list[dict[str, Any]]:
    return get(cluster, ns, "events", "--field-selector", f"involvedObject.name={NAME}")["items"]


def agd_events(cluster: LocalCluster, ns: str, reason: str) -> list[dict[str, Any]]:
    """The AutoGLMDeployment's own Events of `reason` (not its Deployment's, which shares its
    name)."""
    return [e for e in events(cluster, ns)
            if e["involvedObject"]["kind"] == "AutoGLMDeployment" and e["reason"] == reason]


def deployment_replicas(cluster: LocalCluster, ns: str) -> int:
    """spec.replicas of the serving Deployment."""
    return int(get(cluster, ns, "deployment", NAME)["spec"]["replicas"])


OPERATOR_RESOURCES = {
    "autoglmdeployments", "deployments", "services", "configmaps", "secrets",
    "poddisruptionbudgets", "pods", "events",
}  # fmt: skip


def apiserver_requests(cluster: LocalCluster) -> dict[tuple[str, str], float]:
    """apiserver_request_total by (resource, verb), for the kinds the operator touches."""
    totals: dict[tuple[str, str], float] = {}
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(
            part.split("=", 1) for part in line[line.index("{") + 1 : line.rindex("}")].split(",")
        )
        resource, verb = labels.get("resource", "").strip('"'), labels.get("verb", "").strip('"')
        if resource in OPERATOR_RESOURCES and verb != "WATCH":
            key = (resource, verb)
            totals[key] = totals.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals




def admin_tokens(cluster: LocalCluster, ns: str) -> dict[str, str]:
    """The admin Secret's tokens, by pod template digest (one per rollout)."""
    data = get(cluster, ns, "secret", f"{NAME}-admin").get("data") or {}
    return {template: base64.b64decode(value).decode() for key, value in data.items()
            if (template := serving.template_of_token_key(key))}  # fmt: skip


def admin_token(cluster: LocalCluster, ns: str, pod: str) -> str:
    """The admin token `pod` holds: its pod template's."""
    template = get(cluster, ns, "pod", pod)["metadata"]["annotations"][HASH_ANNOTATION]
    return admin_tokens(cluster, ns)[template]


def runtime_state(admin_url: str, token: str) -> dict[str, Any]:
    """A runtime's own account of its mode, from its admin port: GET /autoglm/v1/mode (mode,
    switches, inflight)."""
    request = urllib.request.Request(
        f"{admin_url}{MODE_PATH}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]
