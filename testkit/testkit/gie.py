"""GIE's own endpoint picker as a peer of ours: the Gateway API Inference Extension's EPP
(sigs.k8s.io/gateway-api-inference-extension cmd/epp, built by hack/gie-epp.sh at the release
of the InferencePool CRD hack/gie-crds.sh installs) on the local control plane, behind real Envoy.

`epp_pool` starts what a GIE user runs, on loopback: the control plane with the InferencePool
CRD; a Deployment of serving pods (the pod runner plays the kubelet: a `sim` at each pod's IP);
the InferencePool the operator publishes for them (spec.gateway's builder); the EPP pointed at
that pool, which finds the pods through it (controller-runtime watches of the pool and its pods,
with a kubeconfig from KUBECONFIG) and scrapes each pod's `vllm:*` metrics; and Envoy in front
of the EPP with the ext_proc settings GIE's own Envoy configuration uses (both bodies
FULL_DUPLEX_STREAMED, response headers and trailers sent). The EPP runs its default plugins,
which are also its Helm chart's: queue-scorer (weight 2), kv-cache-utilization-scorer (2),
prefix-cache-scorer (3), max-score picker.

The EPP listens on every interface (`net.Listen("tcp", ":<port>")` for its gRPC, health and
metrics ports; no flag binds loopback), so whoever starts it does so in a network namespace of
its own that holds only loopback: `isolated(argv)` runs a command there, and `own_network()`,
called first thing in that command, brings loopback up and refuses to go on with any other
interface in sight. Nothing reaches the EPP, or anything else started there, from outside.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from autoglm_operator.reconcile.children import gateway as gateway_children
from autoglm_operator.reconcile.children import serving as serving_children
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec
from testkit.gateway import EXT_PROC_SERVICE, EnvoyProcess
from testkit.localcluster import LocalCluster, ensure_binaries, loopback_pod_cidr, running_cluster
from testkit.paths import HACK
from testkit.podrunner import PodRunner
from testkit.processes import ServerProcess, free_port
from testkit.waiting import eventually

EPP_ENV = "AUTOGLM_GIE_EPP"  # the EPP binary, built beforehand (no module proxy in the namespace)
CRD_ENV = "AUTOGLM_GIE_CRD"  # the InferencePool CRD file, likewise
POOL = "sessions"
NAMESPACE = "gie"
ADMIN_TOKEN = "gie-peer"
# What GIE's own Envoy configuration (test/testdata/envoy.yaml at the pinned release) sends the
# EPP: the request's headers, body and trailers, and the response's, bodies in full duplex.
EPP_PROCESSING = {"request_body_mode": "FULL_DUPLEX_STREAMED", "response_header_mode": "SEND",
                  "response_body_mode": "FULL_DUPLEX_STREAMED"}  # fmt: skip


def _script_output(script: str) -> Path:
    out = subprocess.run(["bash", str(HACK / script)], check=True, stdout=subprocess.PIPE,
                         text=True).stdout  # fmt: skip
    return Path(out.strip().splitlines()[-1])


def prepare() -> dict[str, str]:
    """Build (once, cached) what `epp_pool` needs and return it as the environment for the
    isolated command: the control plane's binaries, the EPP and the InferencePool CRD."""
    return {"AUTOGLM_BIN_DIR": str(ensure_binaries()), EPP_ENV: str(_script_output("gie-epp.sh")),
            CRD_ENV: str(_script_output("gie-crds.sh"))}  # fmt: skip


# -- a network namespace with loopback only -------------------------------------------------

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_IFREQ = "16sH22x"  # struct ifreq: the name, then ifr_flags in the union


def isolated(argv: list[str]) -> list[str]:
    """`argv` in a new network namespace (util-linux `unshare`): only a loopback interface,
    down until `own_network()` brings it up."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise RuntimeError("util-linux `unshare` is missing: the EPP binds every interface and "
                           "runs only in a network namespace of its own")
    return [unshare, "--net", "--", *argv]


def own_network() -> None:
    """Bring loopback up in this process's network namespace; fail if any other interface is
    there (then this is not the namespace `isolated` made, and the EPP would be reachable)."""
    names = {name for _, name in socket.if_nameindex()}
    if names != {"lo"}:
        raise RuntimeError(f"not in a network namespace of its own: interfaces {sorted(names)}")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack(_IFREQ, b"lo", 0)
        flags = struct.unpack(_IFREQ, fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


# -- the EPP ----------------------------------------------------------------------------------


class EppProcess(ServerProcess):
    """The EPP for InferencePool `pool` in `namespace`, plaintext gRPC (ext_proc and gRPC health,
    `--health-checking`, on `port`), its readiness on `health_port`, Prometheus on
    `metrics_port`; the default plugin configuration unless `config_text` is given."""

    kind = "gie-epp"

    def __init__(self, binary: str, *, pool: str, namespace: str, kubeconfig: str,
                 config_text: str | None = None, log_path: Path | None = None) -> None:
        super().__init__(env={"KUBECONFIG": kubeconfig}, log_path=log_path)
        self.binary = binary
        self.pool, self.namespace = pool, namespace
        self.config_text = config_text
        self.health_port, self.metrics_port = free_port(), free_port()

    def command(self) -> list[str]:
        argv = [self.binary, "--pool-name", self.pool, "--pool-namespace", self.namespace,
                "--grpc-port", str(self.port), "--grpc-health-port", str(self.health_port),
                "--metrics-port", str(self.metrics_port), "--secure-serving=false",
                "--health-checking", "--metrics-endpoint-auth=false", "--enable-pprof=false",
                "--tracing=false", "--v", "1"]  # fmt: skip
        if self.config_text is not None:
            argv += ["--config-text", self.config_text]
        return argv

    def health(self, service: str = "readiness", port: int | None = None) -> str:
        """The gRPC health status of `service` on the health port (SERVING once the pool has
        synced) or on `port`, or the RPC's error code."""
        with grpc.insecure_channel(f"127.0.0.1:{port or self.health_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
            except grpc.RpcError as error:
                return str(error.code().name)  # type: ignore[attr-defined]
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    def start(self, timeout: float = 60.0) -> EppProcess:
        out = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(self.command(), env=self.env, stdout=out,
                                        stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the EPP exited with {self.process.returncode} at start:\n"
                                   f"{self.log()[-3000:]}")  # fmt: skip
            if self.health() == "SERVING":
                return self
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"the EPP not ready within {timeout} s:\n{self.log()[-3000:]}")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=5) as response:  # fmt: skip
            return str(response.read().decode())

    def ready_pods(self) -> int:
        """How many of the pool's pods the EPP holds (its inference_pool_ready_pods gauge)."""
        for line in self.metrics().splitlines():
            if line.startswith("inference_pool_ready_pods{"):
                return int(float(line.rsplit(" ", 1)[1]))
        return 0


# -- the pool ---------------------------------------------------------------------------------


def _owner() -> serving_children.Owner:
    return serving_children.Owner(POOL, NAMESPACE, "0")


def serving_manifests(replicas: int, runtime_config: dict[str, Any]) -> list[dict[str, Any]]:
    """The pods' ConfigMap, a Deployment of `replicas` serving pods (2 GPUs each) that carry the
    serving pods' labels, and the InferencePool the operator publishes for them (spec.gateway),
    without owner references: no AutoGLMDeployment owns them here."""
    owner = _owner()
    labels = serving_children.serving_pod_labels(POOL)
    config = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": serving_children.config_map_name(POOL), "namespace": NAMESPACE},
              "data": {serving_children.CONFIG_KEY: json.dumps(runtime_config)}}  # fmt: skip
    container = {
        "name": serving_children.CONTAINER_NAME, "image": "autoglm-runtime:sim",
        "ports": [{"name": "http", "containerPort": serving_children.HTTP_PORT}],
        "env": [{"name": "AUTOGLM_ADMIN_TOKEN", "value": ADMIN_TOKEN}],
        "resources": {"limits": {"nvidia.com/gpu": "2"}},
        "volumeMounts": [{"name": "config", "mountPath": serving_children.CONFIG_DIR},
                         {"name": "podinfo", "mountPath": serving_children.PODINFO_DIR}],
    }  # fmt: skip
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": POOL, "namespace": NAMESPACE},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [container], "volumes": [
                {"name": "config", "configMap": {"name": serving_children.config_map_name(POOL)}},
                {"name": "podinfo", "downwardAPI": {"items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]}}},
    }  # fmt: skip
    spec = AutoGLMDeploymentSpec.model_validate({"router": {"enabled": True},
                                                      "gateway": {"enabled": True}})  # fmt: skip
    pool = gateway_children.inference_pool(owner, spec)
    del pool["metadata"]["ownerReferences"]
    return [config, deployment, pool]


@dataclass
class EppPool:
    cluster: LocalCluster
    runner: PodRunner
    epp: EppProcess
    envoy: EnvoyProcess
    replicas: list[str]  # the serving pods' base URLs

    @property
    def base_url(self) -> str:
        return self.envoy.base_url


def _healthy(url: str) -> bool:
    with urllib.request.urlopen(url + "/health", timeout=2) as response:
        return bool(response.status == 200)


@contextlib.contextmanager
def epp_pool(folder: Path, *, replicas: int, time_factor: float = 1.0,
             runtime_config: dict[str, Any] | None = None,
             config_text: str | None = None) -> Iterator[EppPool]:  # fmt: skip
    """The stack in the module's docstring, in `folder`; everything it started is stopped on
    leaving. Call in the network namespace `isolated` made, after `own_network()`; the
    binaries come from `prepare()`'s environment."""
    binary, crd_file = os.environ.get(EPP_ENV), os.environ.get(CRD_ENV)
    if not binary or not crd_file:
        raise RuntimeError(f"{EPP_ENV} and {CRD_ENV} must name the EPP and the CRD (prepare())")
    config = runtime_config or {"initialMode": "streaming"}
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(running_cluster(
            gpu_nodes=max(1, (2 * replicas + 7) // 8), pod_cidr=loopback_pod_cidr(),
            workdir=folder / "cluster"))  # fmt: skip
        cluster.install_crd(Path(crd_file))
        cluster.kubectl("create", "namespace", NAMESPACE)
        runner = stack.enter_context(PodRunner(cluster, folder / "pods", time_factor=time_factor))
        for manifest in serving_manifests(replicas, config):
            cluster.apply(manifest)
        urls = eventually(lambda: (
            found if len(found := list(runner.runtime_urls(NAMESPACE).values())) == replicas
            and all(_healthy(url) for url in found) else None), 120, every=0.2,
            what=f"{replicas} serving pods answering", ignoring=(OSError,))  # fmt: skip
        epp = EppProcess(binary, pool=gateway_children.pool_name(POOL), namespace=NAMESPACE,
                         kubeconfig=cluster.kubeconfig, config_text=config_text,
                         log_path=folder / "epp.log")  # fmt: skip
        stack.callback(epp.stop)
        epp.start()
        eventually(lambda: epp.ready_pods() == replicas, 60, every=0.2,
                   what=f"the EPP holding the {replicas} pods", ignoring=(OSError,))
        envoy = EnvoyProcess(picker_port=epp.port, config_dir=folder,
                             log_path=folder / "envoy.log", **EPP_PROCESSING)  # fmt: skip
        stack.callback(envoy.stop)
        envoy.start(timeout=20.0)
        yield EppPool(cluster, runner, epp, envoy, sorted(urls))


# -- python -m testkit.gie probe ----------------------------------------------------------------


def probe(folder: Path) -> dict[str, Any]:
    """Two serving pods, the EPP and Envoy (in this process's own network namespace): the EPP's
    gRPC health, the pods it holds, and one streamed chat through Envoy, with which replica
    served it (the sims' request counters)."""
    import openai

    own_network()
    with epp_pool(folder, replicas=2, time_factor=0.05) as pool:
        before = [_requests(url) for url in pool.replicas]
        client = openai.OpenAI(base_url=pool.base_url + "/v1", api_key="EMPTY", max_retries=0,
                               timeout=30)  # fmt: skip
        stream = client.chat.completions.create(
            model=AutoGLMDeploymentSpec().model.served_name, stream=True, max_tokens=8,
            messages=[{"role": "user", "content": "Open the settings app."}])
        content = "".join(chunk.choices[0].delta.content or "" for chunk in stream
                          if chunk.choices)  # fmt: skip
        served = [after - old for old, after in
                  zip(before, (_requests(url) for url in pool.replicas), strict=True)]  # fmt: skip
        return {
            "interfaces": sorted(name for _, name in socket.if_nameindex()),
            "health": {service or "(empty)": pool.epp.health(service)
                       for service in ("liveness", "readiness", "")},
            "ext_proc_health": pool.epp.health(EXT_PROC_SERVICE, port=pool.epp.port),
            "ready_pods": pool.epp.ready_pods(),
            "served": served,
            "content": content,
        }


def _requests(url: str) -> float:
    """The sim's finished requests (vllm:request_success_total, every finish reason)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("probe", help="start the EPP on two sims and route one chat through "
                         "Envoy, in a network namespace of its own; print what it saw as JSON")
    run.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.inside:
        argv = isolated([sys.executable, "-m", "testkit.gie", "probe", "--inside"])
        sys.exit(subprocess.run(argv, env={**os.environ, **prepare()}, check=False).returncode)
    with tempfile.TemporaryDirectory(prefix="gie-probe-") as folder:
        print(json.dumps(probe(Path(folder))))


if __name__ == "__main__":
    main()
