"""A tiny kubelet for kwok pods: runs a `sim` runtime for each AutoGLM serving pod, and an
`autoglm-router` for each router pod.

With `engines` set, the first serving pods (up to its count) run a real vLLM engine on the CPU
instead: the pod's own command and argv (`autoglm-runtime serve -- <vLLM argv>`) in the engine
environment, with testkit.engine's CPU changes (the tiny model, tensor parallel 1).

kwok marks pods Running without running anything. With a loopback pod CIDR each pod's IP is a
127.x address, so this runner starts the sim (`python -m testkit.sim` under this process's
Python, the dev environment's) bound to that IP, with the pod's ConfigMap, Secret and
downward-API volumes written to a local folder and the pod's env pointed at them, the way the
kubelet would mount them; its admin API on the pod IP's admin port, as the launcher serves it.
A pod that is deleted goes the kubelet's way down: its preStop exec hook runs, then SIGTERM (the
runtime drains), then SIGKILL once the termination grace period is over. A label change rewrites
the downward-API labels file.

A router pod (`<name>-router`, app.kubernetes.io/name=autoglm-router) runs its container's own
args, bound to the pod IP, with its ServiceAccount's credentials as the kubelet would mount
them: a token from the TokenRequest API, bound to the pod, in a kubeconfig given with
--kubeconfig. So the router's pod watch runs under the RBAC the operator gave it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch  # type: ignore[import-untyped]

from autoglm_operator.reconcile.children import router as router_children
from autoglm_operator.reconcile.children import serving as serving_children
from autoglm_operator.resource.names import TEMPLATE_HASH_ANNOTATION
from testkit.engine import cpu_argv, cpu_engine_env, yield_to_other_sessions
from testkit.localcluster import LocalCluster, log

SELECTOR = "app.kubernetes.io/name in (autoglm,autoglm-router)"
ROUTER_APP = "autoglm-router"
RUNTIME_PORT = serving_children.HTTP_PORT
ADMIN_PORT = serving_children.ADMIN_PORT
# How long a pod waits for a Secret key its volume names, as the kubelet retries the mount.
SECRET_WAIT_SECONDS = 10.0
# A router pod's /metrics: on its ops port, apart from the API.
ROUTER_METRICS_PORT = router_children.METRICS_PORT
TOKEN_SECONDS = 3600  # a projected ServiceAccount token's default life


@dataclass
class RunningPod:
    uid: str
    name: str
    namespace: str
    ip: str
    folder: Path
    process: subprocess.Popen[bytes]
    labels_file: Path | None
    instance: str
    mounts: dict[str, Path]  # the container's mount paths, as local folders
    sigterm_at: float | None = None  # time.time() of the kubelet's SIGTERM, once deleted
    router: bool = False  # an autoglm-router pod, not a serving one
    engine: bool = False  # a real vLLM engine, not a sim
    template: str | None = None  # its pod template's digest: which admin token it holds


@dataclass(frozen=True)
class Engines:
    """Real engines for serving pods: the engine environment's python, the model, how many."""

    python: str
    model_dir: Path
    count: int = 1


def _downward_labels(labels: dict[str, str]) -> str:
    def quote(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "".join(f'{key}="{quote(value)}"\n' for key, value in sorted(labels.items()))


class PodRunner:
    def __init__(
        self,
        cluster: LocalCluster,
        workdir: Path,
        time_factor: float = 1.0,
        sim_args: list[str] | None = None,
        targets_file: Path | None = None,
        engines: Engines | None = None,
    ) -> None:
        self.cluster = cluster
        self.engines = engines
        self.targets_file = targets_file
        self.workdir = workdir
        self.time_factor = time_factor
        self.sim_args = sim_args or []
        self.pods: dict[str, RunningPod] = {}
        self.leaving: dict[int, RunningPod] = {}  # by process id: deleted, shutting down
        self._deferred: dict[str, Any] = {}  # by IP: pods whose IP a leaving pod still holds
        self._launching: set[str] = set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        api_client = config.new_client_from_config(config_file=cluster.kubeconfig)
        self.core = client.CoreV1Api(api_client)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> PodRunner:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._watch_forever, name="podrunner", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            pods = [*self.pods.values(), *self.leaving.values()]
            self.pods.clear()
        for pod in pods:
            self._terminate(pod)
        for pod in pods:
            self._reap(pod, timeout=15)

    def __enter__(self) -> PodRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def running(self, pod_name: str) -> RunningPod | None:
        with self._lock:
            return next((p for p in self.pods.values() if p.name == pod_name), None)

    def runtime_url(self, pod_name: str) -> str | None:
        pod = self.running(pod_name)
        return f"http://{pod.ip}:{RUNTIME_PORT}" if pod is not None else None

    def admin_url(self, pod_name: str) -> str | None:
        """The pod's admin API (its launcher's port, apart from the engine's)."""
        pod = self.running(pod_name)
        return f"http://{pod.ip}:{ADMIN_PORT}" if pod is not None else None

    def runtime_urls(self, namespace: str) -> dict[str, str]:
        """Pod name -> runtime URL of every serving pod of `namespace` running now."""
        return self._urls(namespace, router=False)

    def admin_urls(self, namespace: str) -> dict[str, str]:
        """Pod name -> admin API URL (the launcher's port) of every serving pod running now."""
        return {name: url.rsplit(":", 1)[0] + f":{ADMIN_PORT}"
                for name, url in self._urls(namespace, router=False).items()}

    def router_urls(self, namespace: str) -> dict[str, str]:
        """Pod name -> URL of every router pod of `namespace` running now."""
        return self._urls(namespace, router=True)

    def router_ops_urls(self, namespace: str) -> dict[str, str]:
        """Pod name -> URL of the /health and /metrics port of every router pod running now."""
        return {name: url.rsplit(":", 1)[0] + f":{ROUTER_METRICS_PORT}"
                for name, url in self.router_urls(namespace).items()}

    def router_requests(self, namespace: str) -> dict[tuple[str, str, str], float]:
        """What the routers of `namespace` counted (autoglm_router_requests_total), summed over
        them: (traffic class, the serving replica's mode, outcome) -> requests."""
        totals: dict[tuple[str, str, str], float] = {}
        for url in self.router_ops_urls(namespace).values():
            with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
                text = response.read().decode()
            for line in text.splitlines():
                if line.startswith("autoglm_router_requests_total{"):
                    series, value = line.rsplit(" ", 1)
                    labels = dict(re.findall(r'(\w+)="([^"]*)"', series))
                    key = (labels["traffic_class"], labels["mode"], labels["outcome"])
                    totals[key] = totals.get(key, 0.0) + float(value)
        return totals

    def router_requests_once(
        self, namespace: str, total: int, timeout: float = 10
    ) -> dict[tuple[str, str, str], float]:
        """router_requests once they add up to `total`. A router counts a request after its
        response's last byte, so a client done with the answer can read the count before it."""
        deadline = time.monotonic() + timeout
        while True:
            counts = self.router_requests(namespace)
            if sum(counts.values()) >= total or time.monotonic() > deadline:
                return counts
            time.sleep(0.2)

    def serving_processes(self, namespace: str) -> int:
        """Serving pods' processes still running in `namespace`, those of deleted pods that
        still drain included (kwok hands their addresses out again at once)."""
        with self._lock:
            return sum(1 for pod in (*self.pods.values(), *self.leaving.values())
                       if pod.namespace == namespace and not pod.router)

    def _urls(self, namespace: str, *, router: bool) -> dict[str, str]:
        with self._lock:
            return {
                pod.name: f"http://{pod.ip}:{RUNTIME_PORT}"
                for pod in self.pods.values()
                if pod.namespace == namespace and pod.router == router
            }

    # -- the watch -------------------------------------------------------------------------------

    def _watch_forever(self) -> None:
        while not self._stop.is_set():
            try:
                listing = self.core.list_pod_for_all_namespaces(label_selector=SELECTOR)
                seen = set()
                for pod in listing.items:
                    seen.add(pod.metadata.uid)
                    self._sync(pod)
                with self._lock:
                    gone = [uid for uid in self.pods if uid not in seen]
                for uid in gone:
                    self._remove(uid)
                stream = watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces, label_selector=SELECTOR,
                    resource_version=listing.metadata.resource_version, timeout_seconds=30,
                )  # fmt: skip
                for event in stream:
                    if self._stop.is_set():
                        return
                    pod = event["object"]
                    if event["type"] == "DELETED":
                        self._remove(pod.metadata.uid, pod)
                    else:
                        self._sync(pod)
            except Exception as exc:  # the apiserver may restart under us: list again
                if not self._stop.is_set():
                    log(f"podrunner: watch failed ({exc}); retrying")
                    time.sleep(1)

    def _sync(self, pod: Any) -> None:
        uid = pod.metadata.uid
        if pod.metadata.deletion_timestamp is not None:
            self._remove(uid, pod)
            return
        ip = pod.status.pod_ip
        with self._lock:
            running = self.pods.get(uid)
        if running is not None and running.ip == ip:
            if running.labels_file is not None:
                running.labels_file.write_text(_downward_labels(pod.metadata.labels or {}))
            return
        if running is not None:
            # kwok can rewrite a new pod's IP once (two renders of its ready stage race); a
            # pod's address never changes on a real node, so follow it as a new sandbox would.
            log(f"podrunner: {pod.metadata.name} moved from {running.ip} to {ip}")
            self._remove(uid)
        if not ip or pod.status.phase != "Running":
            return
        with self._lock:
            if uid in self._launching:
                return
            self._forget_deferred(uid)  # this pod's latest state decides, not an older one
            # kwok frees a pod's IP as soon as its object is deleted, while its runtime may
            # still drain; a CNI would not hand the address out yet, so the new pod waits.
            holder = next((p for p in self.leaving.values() if p.ip == ip), None)
            if holder is not None:
                self._deferred[ip] = pod
                log(f"podrunner: {pod.metadata.name} waits for {ip}, held by {holder.name}")
                return
            self._launching.add(uid)
        try:
            started = self._launch(pod)
            with self._lock:
                self.pods[uid] = started
        finally:
            with self._lock:
                self._launching.discard(uid)
        self._write_targets()

    def _write_targets(self) -> None:
        """Prometheus file-based discovery: one target per running pod, serving or router,
        labelled like the chart's PodMonitors (and scrape jobs) label them."""
        if self.targets_file is None:
            return
        with self._lock:
            groups = [
                {"targets": [f"{pod.ip}:{ROUTER_METRICS_PORT if pod.router else RUNTIME_PORT}"],
                 "labels": {"job": "autoglm-router" if pod.router else "autoglm-runtime",
                            "namespace": pod.namespace, "pod": pod.name,
                            "autoglm_deployment": pod.instance}}
                for pod in self.pods.values()
            ]  # fmt: skip
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.targets_file)  # atomic: Prometheus never reads half a file

    def _remove(self, uid: str, deleted: Any = None) -> None:
        """Stop a pod's runtime; `deleted` (the pod object) brings its preStop hook and grace."""
        with self._lock:
            pod = self.pods.pop(uid, None)
            if pod is not None:
                self.leaving[pod.process.pid] = pod
            self._forget_deferred(uid)
        if pod is not None:
            self._write_targets()
            what = "router" if pod.router else "engine" if pod.engine else "sim"
            log(f"podrunner: stopping {what} for {pod.namespace}/{pod.name}")
            threading.Thread(target=self._shut_down, args=(pod, deleted), daemon=True).start()

    def _forget_deferred(self, uid: str) -> None:
        for ip, waiting in list(self._deferred.items()):
            if waiting.metadata.uid == uid:
                del self._deferred[ip]

    def _shut_down(self, pod: RunningPod, deleted: Any) -> None:
        """The kubelet's order: preStop hook, SIGTERM, SIGKILL when the grace period is over."""
        grace, command = 30.0, None
        if deleted is not None:
            grace = float(
                deleted.metadata.deletion_grace_period_seconds
                or deleted.spec.termination_grace_period_seconds
                or grace
            )
            lifecycle = deleted.spec.containers[0].lifecycle
            hook = lifecycle.pre_stop if lifecycle is not None else None
            command = hook._exec.command if hook is not None and hook._exec is not None else None
        deadline = time.monotonic() + grace
        if command:
            started = time.monotonic()
            with contextlib.suppress(subprocess.TimeoutExpired, OSError):
                subprocess.run(
                    [self._in_pod(arg, pod) for arg in command],
                    capture_output=True, timeout=grace, check=False,
                )  # fmt: skip
            log(f"podrunner: preStop hook of {pod.namespace}/{pod.name} took "
                f"{time.monotonic() - started:.1f}s")  # fmt: skip
        pod.sigterm_at = time.time()
        self._terminate(pod)
        self._reap(pod, timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            self.leaving.pop(pod.process.pid, None)
            waiting = self._deferred.pop(pod.ip, None)
        if waiting is not None and not self._stop.is_set():
            self._sync(waiting)

    @staticmethod
    def _in_pod(arg: str, pod: RunningPod) -> str:
        """A hook argument as the container sees it: its mount paths are the pod's folders and
        its loopback is the pod's own IP (each pod has its own network namespace)."""
        places = {**pod.mounts, "127.0.0.1": pod.ip, "localhost": pod.ip}
        # One pass, longest first, so a path already rewritten is never rewritten again.
        pattern = "|".join(re.escape(k) for k in sorted(places, key=len, reverse=True))
        return re.sub(pattern, lambda m: str(places[m.group(0)]), arg)

    # -- materializing a pod ---------------------------------------------------------------------

    def _launch(self, pod: Any) -> RunningPod:
        folder = self.workdir / pod.metadata.namespace / pod.metadata.name
        folder.mkdir(parents=True, exist_ok=True)
        if (pod.metadata.labels or {}).get("app.kubernetes.io/name") == ROUTER_APP:
            return self._launch_router(pod, folder)
        container = pod.spec.containers[0]
        volumes = {v.name: v for v in pod.spec.volumes or []}
        mounts: dict[str, Path] = {}
        labels_file: Path | None = None
        for mount in container.volume_mounts or []:
            volume = volumes.get(mount.name)
            local = folder / mount.mount_path.lstrip("/")
            if volume is None:
                continue
            if volume.config_map is not None:
                data = (
                    self.core.read_namespaced_config_map(
                        volume.config_map.name, pod.metadata.namespace
                    ).data
                    or {}
                )
                self._write_items(local, {k: v.encode() for k, v in data.items()})
            elif volume.secret is not None:
                self._write_items(local, self._secret_items(volume.secret, pod.metadata.namespace))
            elif volume.downward_api is not None:
                local.mkdir(parents=True, exist_ok=True)
                for item in volume.downward_api.items or []:
                    if item.field_ref and item.field_ref.field_path == "metadata.labels":
                        labels_file = local / item.path
                        labels_file.write_text(_downward_labels(pod.metadata.labels or {}))
            elif volume.empty_dir is not None:
                local.mkdir(parents=True, exist_ok=True)  # HOME, caches: the pod's own folder
            else:
                continue
            mounts[mount.mount_path] = local

        env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOGLM_")}
        env.update(self._container_env(pod, container, mounts))
        # The runtime's default file locations, as mounted in the pod.
        for var, default in (("AUTOGLM_CONFIG_FILE", "/etc/autoglm/config.json"),
                             ("AUTOGLM_LABELS_FILE", "/etc/podinfo/labels")):  # fmt: skip
            env.setdefault(var, self._rewrite(default, mounts))
        engine = self.engines is not None and self._engines_running() < self.engines.count
        if engine:
            assert self.engines is not None
            env = cpu_engine_env(env, self.engines.python)
            vllm_argv = container.args or []
            argv = [self.engines.python, "-m", "autoglm_runtime.cli", "serve", "--",
                    *cpu_argv(vllm_argv, self.engines.model_dir, pod.status.pod_ip)]
        else:
            argv = [
                sys.executable, "-m", "testkit.sim",
                "--host", pod.status.pod_ip, "--port", str(RUNTIME_PORT),
                "--admin-port", str(ADMIN_PORT),
                "--time-factor", str(self.time_factor), *self.sim_args,
            ]  # fmt: skip
        logfile = open(folder / "runtime.log", "ab")  # noqa: SIM115 - owned by the child
        process = subprocess.Popen(
            argv, env=env, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True
        )
        logfile.close()
        if engine:  # vLLM's CPU engine spins while it serves: as in the engine tier
            yield_to_other_sessions(process.pid)
        log(f"podrunner: started {'a vLLM engine' if engine else 'sim'} for "
            f"{pod.metadata.namespace}/{pod.metadata.name} at {pod.status.pod_ip}:{RUNTIME_PORT}")
        instance = (pod.metadata.labels or {}).get("app.kubernetes.io/instance", "")
        template = (pod.metadata.annotations or {}).get(TEMPLATE_HASH_ANNOTATION)
        return RunningPod(pod.metadata.uid, pod.metadata.name, pod.metadata.namespace,
                          pod.status.pod_ip, folder, process, labels_file, instance,
                          mounts, engine=engine, template=template)  # fmt: skip

    def _engines_running(self) -> int:
        with self._lock:
            return sum(1 for p in self.pods.values() if p.engine)

    def _launch_router(self, pod: Any, folder: Path) -> RunningPod:
        """`autoglm-router` with the container's args on the pod IP, as its ServiceAccount."""
        kubeconfig = folder / "kubeconfig"
        kubeconfig.write_text(json.dumps(self._service_account_kubeconfig(pod)))
        kubeconfig.chmod(0o600)
        args = list(pod.spec.containers[0].args or [])
        if "--host" in args:
            args[args.index("--host") + 1] = pod.status.pod_ip
        else:
            args += ["--host", pod.status.pod_ip]
        argv = [str(Path(sys.executable).with_name("autoglm-router")), *args,
                "--kubeconfig", str(kubeconfig)]  # fmt: skip
        env = {k: v for k, v in os.environ.items()
               if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}  # fmt: skip
        env.update(self._container_env(pod, pod.spec.containers[0], {}))
        logfile = open(folder / "router.log", "ab")  # noqa: SIM115 - owned by the child
        process = subprocess.Popen(
            argv, env=env, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True
        )
        logfile.close()
        account = pod.spec.service_account_name
        log(f"podrunner: started router for {pod.metadata.namespace}/{pod.metadata.name} "
            f"at {pod.status.pod_ip}:{RUNTIME_PORT} as {account}")  # fmt: skip
        instance = (pod.metadata.labels or {}).get("app.kubernetes.io/instance", "")
        return RunningPod(pod.metadata.uid, pod.metadata.name, pod.metadata.namespace,
                          pod.status.pod_ip, folder, process, None, instance, {},
                          router=True)  # fmt: skip

    def _container_env(self, pod: Any, container: Any, mounts: dict[str, Path]) -> dict[str, str]:
        """The container's env as the kubelet resolves it: values, Secret keys, and the pod's
        own name and namespace (the downward API's fieldRef)."""
        env: dict[str, str] = {}
        fields = {"metadata.name": pod.metadata.name, "metadata.namespace": pod.metadata.namespace}
        for var in container.env or []:
            source = var.value_from
            if var.value is not None:
                env[var.name] = self._rewrite(var.value, mounts)
            elif source is not None and source.secret_key_ref is not None:
                ref = source.secret_key_ref
                data = self.core.read_namespaced_secret(ref.name, pod.metadata.namespace).data
                env[var.name] = base64.b64decode(data[ref.key]).decode()
            elif source is not None and source.field_ref is not None:
                env[var.name] = fields[source.field_ref.field_path]
        return env

    def _service_account_kubeconfig(self, pod: Any) -> dict[str, Any]:
        """What the kubelet mounts for a pod's ServiceAccount (a token bound to the pod, the
        cluster's CA, the namespace), as a kubeconfig."""
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[],  # the apiserver's own
                expiration_seconds=TOKEN_SECONDS,
                bound_object_ref=client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid
                ),
            )
        )
        token = self.core.create_namespaced_service_account_token(
            pod.spec.service_account_name, pod.metadata.namespace, request
        ).status.token
        namespace = pod.metadata.namespace
        return {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "local", "cluster": {
                "server": self.cluster.server, "certificate-authority": self.cluster.ca_file}}],
            "users": [{"name": "pod", "user": {"token": token}}],
            "contexts": [{"name": "pod", "context": {
                "cluster": "local", "user": "pod", "namespace": namespace}}],
            "current-context": "pod",
        }  # fmt: skip

    def _secret_items(self, volume: Any, namespace: str) -> dict[str, bytes]:
        """A Secret volume's files: each of its `items` (key -> path) or every key. A key it
        names that is not there yet is waited for a while, as the kubelet retries a mount."""
        deadline = time.monotonic() + SECRET_WAIT_SECONDS
        while True:
            data = self.core.read_namespaced_secret(volume.secret_name, namespace).data or {}
            items = {i.key: i.path for i in volume.items or []} or {k: k for k in data}
            if all(key in data for key in items) or time.monotonic() > deadline:
                return {path: base64.b64decode(data[key]) for key, path in items.items()
                        if key in data}  # fmt: skip
            time.sleep(0.2)

    @staticmethod
    def _write_items(folder: Path, items: dict[str, bytes]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for key, value in items.items():
            (folder / key).write_bytes(value)

    @staticmethod
    def _rewrite(value: str, mounts: dict[str, Path]) -> str:
        for mount_path, local in sorted(mounts.items(), key=lambda m: -len(m[0])):
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                return str(local) + value[len(mount_path.rstrip("/")) :]
        return value

    @staticmethod
    def _terminate(pod: RunningPod) -> None:
        with contextlib.suppress(ProcessLookupError):
            if pod.engine:
                # The kubelet signals the container's first process only: the launcher, which
                # drains and then stops vLLM's processes itself.
                os.kill(pod.process.pid, signal.SIGTERM)
            else:
                os.killpg(pod.process.pid, signal.SIGTERM)

    @staticmethod
    def _reap(pod: RunningPod, timeout: float) -> None:
        try:
            pod.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.process.pid, signal.SIGKILL)
            pod.process.wait()
        if pod.engine:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.process.pid, signal.SIGKILL)  # what the container's end kills
