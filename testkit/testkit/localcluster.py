"""A real Kubernetes control plane on loopback, for tests and the demo.

etcd, kube-apiserver (TLS, token auth, RBAC, ServiceAccount admission), kube-controller-manager,
kube-scheduler and kwok (fake GPU nodes that run pods without containers), all built from
upstream source by hack/k8s-bin.sh. Every process runs in its own process group and is stopped
by `stop()`; nothing outlives the fixture or the `down` command.

    python -m testkit.localcluster up      # start, print the kubeconfig path, return
    python -m testkit.localcluster down    # stop what `up` started
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit.paths import HACK
from testkit.processes import free_port
from testkit.waiting import eventually

STATE_DIR = Path(os.environ.get("AUTOGLM_CLUSTER_DIR", "/tmp/autoglm-cluster"))
SERVICE_CIDR = "10.96.0.0/16"
# Pod IPs kwok hands out. A loopback range lets a local runner bind each pod's IP (the demo and
# end-to-end tests); EndpointSlices refuse loopback addresses, so Services then have no endpoints.
DEFAULT_POD_CIDR = "10.244.0.1/16"


# Lock files of the loopback ranges this process holds; the kernel drops the locks at its exit.
_held_ranges: list[int] = []


def loopback_pod_cidr() -> str:
    """A loopback /16 no other process on this machine holds (a lock file for each range), so
    two clusters running side by side (make test's lanes) never share pod addresses."""
    for second in random.sample(range(40, 240), 200):
        lock = os.open(Path(tempfile.gettempdir()) / f"autoglm-pods-127.{second}.lock",
                       os.O_CREAT | os.O_RDWR)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            continue
        _held_ranges.append(lock)
        return f"127.{second}.0.1/16"
    raise RuntimeError("every loopback pod range is held by another process")

GPU_RESOURCE = "nvidia.com/gpu"
# The apiserver's audit log records requests made with ServiceAccount tokens (the operator run
# under the chart's account), at Metadata level: who did which verb to which resource, never a
# body. Everything else (the admin kubeconfig the tests, controllers and kwok use) goes unlogged.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.stderr}"


def log(message: str) -> None:
    print(f"[localcluster] {message}", file=sys.stderr, flush=True)


def ensure_binaries() -> Path:
    """Build (once) and return the directory holding etcd, kube-*, kubectl, kwok and helm."""
    override = os.environ.get("AUTOGLM_BIN_DIR")
    if override:
        return Path(override)
    result = subprocess.run(
        ["bash", str(HACK / "k8s-bin.sh")], check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(result.stdout.strip().splitlines()[-1])


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _write_pki(pki: Path) -> None:
    """A CA, an apiserver serving cert for loopback and the in-cluster names, a SA key pair."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
             "-keyout", str(pki / "ca.key"), "-out", str(pki / "ca.crt"),
             "-subj", "/CN=autoglm-local-ca")  # fmt: skip
    ext = pki / "apiserver.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(pki / "apiserver.key"),
             "-out", str(pki / "apiserver.csr"), "-subj", "/CN=kube-apiserver")  # fmt: skip
    _openssl("x509", "-req", "-in", str(pki / "apiserver.csr"), "-CA", str(pki / "ca.crt"),
             "-CAkey", str(pki / "ca.key"), "-CAcreateserial", "-days", "3650",
             "-extfile", str(ext), "-out", str(pki / "apiserver.crt"))  # fmt: skip
    _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
    _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


@dataclass
class LocalCluster:
    """The control plane's processes and the files clients need to reach it."""

    workdir: Path
    bin_dir: Path
    pod_cidr: str = DEFAULT_POD_CIDR
    audit: bool = True
    # kube-controller-manager controllers to leave off, e.g. the endpoint controllers, which
    # fail and retry forever on loopback pod IPs.
    disabled_controllers: tuple[str, ...] = ()
    api_port: int = 0
    etcd_port: int = 0
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> str:
        return str(self.workdir / "kubeconfig")

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def ca_file(self) -> str:
        return str(self.workdir / "pki" / "ca.crt")

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    @property
    def admin_token(self) -> str:
        return (self.workdir / "admin-token").read_text().strip()

    @property
    def env(self) -> dict[str, str]:
        path = f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
        return {**os.environ, "KUBECONFIG": self.kubeconfig, "PATH": path}

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        started = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        _write_pki(self.workdir / "pki")
        token = secrets.token_hex(24)
        (self.workdir / "admin-token").write_text(token)
        (self.workdir / "tokens.csv").write_text(f'{token},admin,admin,"system:masters"\n')
        self.api_port, self.etcd_port = free_port(), free_port()
        self._write_kubeconfig(token)
        try:
            self._start_etcd()
            self._start_apiserver()
            self._start_controllers()
            self._start_kwok()
        except BaseException:
            self.stop()
            raise
        log(f"control plane up in {time.monotonic() - started:.1f}s at {self.server}")
        return self

    def stop(self) -> None:
        # Reverse start order, so nothing restarts what was just stopped.
        for name in reversed(list(self.processes)):
            proc = self.processes.pop(name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    # -- faults ----------------------------------------------------------------------------------

    def restart(self, *names: str) -> float:
        """Crash (SIGKILL) `etcd` and/or `kube-apiserver` and start them again with the same data
        dir, ports and certificates; seconds until the apiserver is ready again. Clients keep
        their kubeconfig and token; the controllers and kwok reconnect on their own."""
        starters = {"etcd": self._start_etcd, "kube-apiserver": self._start_apiserver}
        unknown = set(names) - set(starters)
        if unknown:
            raise ValueError(f"can only restart {sorted(starters)}, not {sorted(unknown)}")
        started = time.monotonic()
        for name in names:
            proc = self.processes[name]  # the entry stays: a restart keeps its stop order
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for name, start in starters.items():
            if name in names:
                start()
        eventually(self._while_running("kube-apiserver", self._apiserver_ready), 90, every=0.2,
                   what=self._readiness("kube-apiserver"))
        return time.monotonic() - started

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        logfile = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        proc = subprocess.Popen(
            argv, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.workdir
        )
        logfile.close()
        self.processes[name] = proc
        return proc

    def _while_running(self, name: str, ready: Callable[[], object]) -> Callable[[], object]:
        """A predicate for eventually(): `ready()`, an error of it a "not yet"; process `name`
        having exited is an error at once, with its log's tail."""

        def check() -> object:
            proc = self.processes[name]
            if proc.poll() is not None:
                tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")
            with contextlib.suppress(Exception):
                return ready()
            return False

        return check

    def _readiness(self, name: str) -> str:
        """eventually()'s `what` for process `name`."""
        return f"{name} ready (its log: {self.workdir / name}.log)"

    def _start_etcd(self) -> None:
        peer = free_port()
        self._spawn("etcd", [
            str(self.bin_dir / "etcd"), "--name", "local", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"local=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level", "warn",
        ])  # fmt: skip
        etcd_health = f"http://127.0.0.1:{self.etcd_port}/health"
        eventually(self._while_running("etcd", lambda: http_ok(etcd_health)), 60, every=0.2,
                   what=self._readiness("etcd"))

    def _start_apiserver(self) -> None:
        pki = self.workdir / "pki"
        self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            "--etcd-servers", f"http://127.0.0.1:{self.etcd_port}",
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(self.api_port),
            "--tls-cert-file", str(pki / "apiserver.crt"),
            "--tls-private-key-file", str(pki / "apiserver.key"),
            "--client-ca-file", str(pki / "ca.crt"),
            "--token-auth-file", str(self.workdir / "tokens.csv"),
            "--authorization-mode", "Node,RBAC",
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--allow-privileged=true",
            *self._audit_args(),
            "--profiling=false", "--v", "1",
        ])  # fmt: skip
        eventually(self._while_running("kube-apiserver", self._apiserver_ready), 90, every=0.2,
                   what=self._readiness("kube-apiserver"))

    def _audit_args(self) -> list[str]:
        if not self.audit:
            return []
        policy = self.workdir / "audit-policy.json"
        policy.write_text(json.dumps(AUDIT_POLICY))
        return ["--audit-policy-file", str(policy), "--audit-log-path", str(self.audit_log)]

    def _apiserver_ready(self) -> bool:
        out = self.kubectl("get", "--raw", "/readyz", check=False)
        return out.returncode == 0 and out.stdout.strip() == "ok"

    def _start_controllers(self) -> None:
        pki = self.workdir / "pki"
        self._spawn("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"),
            "--kubeconfig", self.kubeconfig, "--bind-address", "127.0.0.1",
            "--secure-port", str(free_port()),
            "--service-account-private-key-file", str(pki / "sa.key"),
            "--root-ca-file", str(pki / "ca.crt"),
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--controllers", ",".join(["*", *(f"-{c}" for c in self.disabled_controllers)]),
            "--leader-elect=false", "--v", "1",
        ])  # fmt: skip
        self._spawn("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"),
            "--kubeconfig", self.kubeconfig, "--bind-address", "127.0.0.1",
            "--secure-port", str(free_port()), "--leader-elect=false", "--v", "1",
        ])  # fmt: skip
        # The ServiceAccount controller creating "default" proves the controller-manager works.
        eventually(self._while_running(
            "kube-controller-manager",
            lambda: self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0,
        ), 60, every=0.2, what=self._readiness("kube-controller-manager"))

    def _start_kwok(self) -> None:
        self._spawn("kwok", [
            str(self.bin_dir / "kwok"), "--kubeconfig", self.kubeconfig,
            "--config", str(HACK / "kwok-stages.yaml"),
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--manage-nodes-with-label-selector=",
            "--disregard-status-with-annotation-selector=kwok.x-k8s.io/status=custom",
            "--disregard-status-with-label-selector=",
            "--cidr", self.pod_cidr, "--node-ip", "10.0.0.1",
            "--node-lease-duration-seconds", "40",
            "--server-address", f"127.0.0.1:{free_port()}",
        ])  # fmt: skip
        time.sleep(0.5)
        if self.processes["kwok"].poll() is not None:
            raise RuntimeError((self.workdir / "kwok.log").read_text()[-3000:])

    def _write_kubeconfig(self, token: str) -> None:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {"server": self.server, "certificate-authority": self.ca_file},
                }
            ],
            "users": [{"name": "admin", "user": {"token": token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
            "current-context": "local",
        }
        Path(self.kubeconfig).write_text(json.dumps(config, indent=2))

    # -- helpers tests and the demo use ----------------------------------------------------------

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.bin_dir / "kubectl"), *args],
            input=input, capture_output=True, text=True, env=self.env, timeout=timeout,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, ["kubectl", *args], result.stdout, result.stderr)
        return result

    def get_json(self, *args: str) -> dict[str, Any]:
        """`kubectl get ... -o json`, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)  # type: ignore[no-any-return]

    def apply(
        self, manifest: dict[str, Any], namespace: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """`kubectl apply` one object given as a dict."""
        args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
        return self.kubectl(*args, input=json.dumps(manifest), check=check)

    def install_crd(self, path: Path, timeout: float = 60) -> str:
        """Apply a CRD file and wait until it is Established; its name."""
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
        name = self.kubectl("get", "-f", str(path), "-o", "name").stdout.strip().split("/")[-1]
        # Polled rather than `kubectl wait`, which errors while a new CRD has no conditions yet
        # (so does this jsonpath: an error is "not yet").
        jsonpath = '{.status.conditions[?(@.type=="Established")].status}'
        deadline = time.monotonic() + timeout
        while self.kubectl("get", "crd", name, "-o", f"jsonpath={jsonpath}", check=False).stdout \
                != "True":  # fmt: skip
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout}s")
            time.sleep(0.2)
        return name

    def remove_crd(self, name: str, timeout: float = 60) -> None:
        """Delete a CRD, if there, with every object of it, and wait until discovery no longer
        lists its API (what a client, kopf included, asks before it watches)."""
        found = self.kubectl("get", "crd", name, "-o", "json", "--ignore-not-found").stdout
        if not found:
            return
        spec = json.loads(found)["spec"]
        paths = [f"/apis/{spec['group']}/{v['name']}" for v in spec["versions"]]
        self.kubectl("delete", "crd", name, "--wait=true", f"--timeout={timeout:.0f}s")
        deadline = time.monotonic() + timeout
        while any(self.kubectl("get", "--raw", p, check=False).returncode == 0 for p in paths):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{paths} still served {timeout}s after CRD {name} went")
            time.sleep(0.2)

    def add_gpu_node(self, name: str, gpus: int = 8, labels: dict[str, str] | None = None) -> None:
        """A fake node that kwok keeps Ready, with `gpus` allocatable nvidia.com/gpu."""
        self.kubectl("apply", "-f", "-", input=json.dumps(gpu_node(name, gpus, labels)))
        self.kubectl("wait", "--for=condition=Ready", f"node/{name}", "--timeout=60s")

    def audit_events(self, username: str) -> list[dict[str, Any]]:
        """The audit log's events of one user (a ServiceAccount: only those are logged), one per
        request: the last stage seen of each (a watch logs when it starts and when it ends)."""
        if not self.audit_log.exists():
            return []
        events: dict[str, dict[str, Any]] = {}
        for line in self.audit_log.read_text().splitlines():
            event = json.loads(line)
            if event.get("user", {}).get("username") == username:
                events[event["auditID"]] = event
        return list(events.values())

    def add_gpu_nodes(
        self, names: list[str], gpus: int = 8, senders: int = 4, timeout: float = 600
    ) -> None:
        """Many fake GPU nodes at once: `senders` concurrent `kubectl create` of a List each
        (kubectl paces its own requests), then wait until kwok reports every one Ready."""
        chunks = [names[i::senders] for i in range(senders) if names[i::senders]]

        def create(chunk: list[str]) -> None:
            items = [gpu_node(name, gpus) for name in chunk]
            listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
            self.kubectl("create", "-f", "-", "-o", "name", input=listed, timeout=timeout)

        with ThreadPoolExecutor(max_workers=len(chunks)) as pool:
            list(pool.map(create, chunks))
        wanted = set(names)
        ready_path = '{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")]' \
            '.status}{"\\n"}{end}'
        deadline = time.monotonic() + timeout
        while True:
            out = self.kubectl("get", "nodes", "-o", f"jsonpath={ready_path}", timeout=120).stdout
            ready = {line[:-5] for line in out.splitlines() if line.endswith("=True")}
            if wanted <= ready:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(wanted - ready)} of {len(wanted)} nodes not Ready")
            time.sleep(2)

    def delete_node(self, name: str) -> None:
        self.kubectl("delete", "node", name, "--ignore-not-found", "--wait=true")


def gpu_node(name: str, gpus: int = 8, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node kwok manages (annotation kwok.x-k8s.io/node=fake) with `gpus` nvidia.com/gpu."""
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU_RESOURCE: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090",
                "nvidia.com/gpu.count": str(gpus),
                **(labels or {}),
            },
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def http_ok(url: str, timeout: float = 2) -> bool:
    """True when `url` answers 200; False when it answers otherwise or not at all."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def running_cluster(
    gpu_nodes: int = 2, pod_cidr: str = DEFAULT_POD_CIDR, workdir: Path | None = None
) -> Iterator[LocalCluster]:
    """Start a cluster with `gpu_nodes` fake 8-GPU nodes; stop it and remove its files after."""
    bin_dir = ensure_binaries()
    own_dir = workdir is None
    path = workdir or Path(tempfile.mkdtemp(prefix="autoglm-cluster-"))
    cluster = LocalCluster(workdir=path, bin_dir=bin_dir, pod_cidr=pod_cidr)
    try:
        cluster.start()
        for index in range(gpu_nodes):
            cluster.add_gpu_node(f"gpu-node-{index}")
        yield cluster
    finally:
        cluster.stop()
        if own_dir and not os.environ.get("AUTOGLM_KEEP_CLUSTER_FILES"):
            shutil.rmtree(path, ignore_errors=True)


# -- command line: `make cluster-up` / `make cluster-down` --------------------------------------


def _up(args: argparse.Namespace) -> None:
    if (STATE_DIR / "pids.json").exists():
        sys.exit(f"a cluster is already up (state in {STATE_DIR}); run `make cluster-down` first")
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    cluster = LocalCluster(workdir=STATE_DIR, bin_dir=ensure_binaries(), pod_cidr=args.pod_cidr)
    cluster.start()
    try:
        for index in range(args.gpu_nodes):
            cluster.add_gpu_node(f"gpu-node-{index}", gpus=args.gpus)
    except BaseException:
        cluster.stop()
        raise
    started = {name: process_identity(proc.pid) for name, proc in cluster.processes.items()}
    (STATE_DIR / "pids.json").write_text(json.dumps(started))
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    print(f"export PATH={cluster.bin_dir}:$PATH")


def _down(_: argparse.Namespace) -> None:
    pids_file = STATE_DIR / "pids.json"
    if not pids_file.exists():
        log("no cluster is up")
        return
    recorded: dict[str, Any] = json.loads(pids_file.read_text())
    ours = {name: entry for name, entry in recorded.items() if _still_ours(name, entry)}
    for name, entry in reversed(list(ours.items())):
        _signal_group(entry, signal.SIGTERM)
        log(f"stopped {name}")
    deadline = time.monotonic() + 15
    for entry in ours.values():
        while time.monotonic() < deadline and _is_running(entry):
            time.sleep(0.1)
        _signal_group(entry, signal.SIGKILL)
    shutil.rmtree(STATE_DIR, ignore_errors=True)


# -- which process a PID is: a PID read from disk may since have been reused --------------------


def process_identity(pid: int) -> dict[str, Any] | None:
    """The PID with what tells this process from a later one under the same PID: its start time
    (clock ticks after boot, /proc/<pid>/stat field 22) and its command line. None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # exited, not yet reaped: nothing left to stop
        return None
    return {
        "pid": pid,
        "startTime": int(fields[22 - 3]),
        "cmdline": cmdline.decode(errors="replace").split("\0")[:-1],
    }


def _is_running(entry: dict[str, Any]) -> bool:
    return process_identity(entry["pid"]) == entry


def _still_ours(name: str, entry: Any) -> bool:
    if not isinstance(entry, dict) or not {"pid", "startTime", "cmdline"} <= entry.keys():
        log(f"not stopping {name}: the state file records no identity for it ({entry!r})")
        return False
    if _is_running(entry):
        return True
    now = process_identity(entry["pid"])
    if now is None:
        log(f"{name} (pid {entry['pid']}) has already exited")
    else:
        log(f"not stopping pid {entry['pid']}: it is no longer the {name} `up` started")
    return False


def _signal_group(entry: dict[str, Any], signum: int) -> None:
    """Signal the process group `up` started, checking the leader is still that process."""
    if _is_running(entry):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(entry["pid"], signum)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the control plane and fake GPU nodes, then return")
    up.add_argument("--gpu-nodes", type=int, default=2)
    up.add_argument("--gpus", type=int, default=8, help="nvidia.com/gpu per node")
    up.add_argument("--pod-cidr", default=DEFAULT_POD_CIDR)
    up.set_defaults(func=_up)
    down = sub.add_parser("down", help="stop everything `up` started")
    down.set_defaults(func=_down)
    sub.add_parser("bin-dir", help="build the binaries if needed and print their directory")
    args = parser.parse_args(argv)
    if args.command == "bin-dir":
        print(ensure_binaries())
        return
    args.func(args)


if __name__ == "__main__":
    main()
