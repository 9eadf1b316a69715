"""Discovery inside Kubernetes: a watch on one deployment's pods in one namespace.

A pod matching the selector is a replica at `http://<podIP>:<port>`; its mode is its
`autoglm.io/mode` label, it takes requests while its Ready condition is true, and it leaves at
once when it gets a deletionTimestamp (terminating). The apiserver is spoken to with aiohttp, not
a Kubernetes client: list, then watch from the list's resourceVersion with bookmarks; a 410 Gone
lists again; any other error reconnects with backoff, keeping the last pods seen meanwhile.
Only list/watch on pods of the namespace are needed: the router writes nothing (the operator
reads its demand from its ops port).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import ssl
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from autoglm_api.profiles import MODE_LABEL, Mode
from autoglm_router.discovery import Endpoint

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
USER_AGENT = "autoglm-router"


class AccessError(Exception):
    """No usable way to reach the apiserver (missing in-cluster files, a bad kubeconfig)."""


class WatchGone(Exception):
    """410 Gone: the resourceVersion is too old; list again."""


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"apiserver answered {status}: {body[:300]}")
        self.status = status


# -- reaching the apiserver -------------------------------------------------------------------


@dataclass(frozen=True)
class ApiAccess:
    server: str  # https://host:port
    namespace: str | None = None  # the ServiceAccount's or the kubeconfig context's
    token: str | None = None
    token_file: str | None = None  # read again for each request: projected tokens rotate
    ca_file: str | None = None
    ca_data: str | None = None  # PEM
    client_cert: tuple[str, str] | None = None  # PEM texts of certificate and key
    insecure: bool = False

    def bearer(self) -> str | None:
        if self.token_file:
            return Path(self.token_file).read_text().strip()
        return self.token

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token = self.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def ssl_context(self) -> ssl.SSLContext:
        try:
            return self._ssl_context()
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise AccessError(f"cannot load the apiserver's CA or client certificate: {exc}") \
                from exc

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.client_cert:
            # ssl loads a client certificate only from files.
            with tempfile.TemporaryDirectory() as folder:
                cert, key = Path(folder, "cert.pem"), Path(folder, "key.pem")
                cert.write_text(self.client_cert[0])
                key.write_text(self.client_cert[1])
                context.load_cert_chain(cert, key)
        return context


def in_cluster_access(env: Mapping[str, str] = os.environ,
                      folder: Path = SERVICE_ACCOUNT_DIR) -> ApiAccess:
    """The pod's ServiceAccount: KUBERNETES_SERVICE_HOST/PORT, its token, CA and namespace."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise AccessError("KUBERNETES_SERVICE_HOST/PORT are not set: not inside a pod "
                          "(give --kubeconfig)")
    token, ca = folder / "token", folder / "ca.crt"
    if not token.is_file() or not ca.is_file():
        raise AccessError(f"no ServiceAccount token and CA in {folder} "
                          "(is automountServiceAccountToken off?)")
    namespace_file = folder / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else None
    host = f"[{host}]" if ":" in host else host
    return ApiAccess(f"https://{host}:{port}", namespace, token_file=str(token),
                     ca_file=str(ca))


def kubeconfig_access(path: str, context: str | None = None) -> ApiAccess:
    """The current (or named) context of a kubeconfig; tokens and client certificates only."""
    try:
        config = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise AccessError(f"cannot read kubeconfig {path}: {exc}") from exc
    if not isinstance(config, dict):
        raise AccessError(f"kubeconfig {path} is not a kubeconfig")
    name = context or config.get("current-context")
    ctx = _named(config, "contexts", "context", name, path)
    cluster = _named(config, "clusters", "cluster", ctx.get("cluster"), path)
    user = _named(config, "users", "user", ctx.get("user"), path) if ctx.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        raise AccessError(f"kubeconfig {path}: exec and auth-provider users are not supported; "
                          "use a token")
    if not cluster.get("server"):
        raise AccessError(f"kubeconfig {path}: cluster {ctx.get('cluster')!r} has no server")
    base = Path(path).parent
    return ApiAccess(
        server=str(cluster["server"]).rstrip("/"),
        namespace=ctx.get("namespace"),
        token=user.get("token"),
        token_file=_path(base, user.get("tokenFile")),
        ca_file=_path(base, cluster.get("certificate-authority")),
        ca_data=_decoded(cluster.get("certificate-authority-data")),
        client_cert=_client_cert(base, user),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
    )


def _named(config: dict[str, Any], section: str, key: str, name: Any,
           path: str) -> dict[str, Any]:
    for entry in config.get(section) or []:
        if entry.get("name") == name:
            return dict(entry.get(key) or {})
    raise AccessError(f"kubeconfig {path} has no {key} named {name!r}")


def _path(base: Path, value: str | None) -> str | None:
    return str(base / value) if value else None


def _decoded(data: str | None) -> str | None:
    return base64.b64decode(data).decode() if data else None


def _client_cert(base: Path, user: dict[str, Any]) -> tuple[str, str] | None:
    cert = _decoded(user.get("client-certificate-data"))
    key = _decoded(user.get("client-key-data"))
    if cert is None and user.get("client-certificate"):
        cert = (base / user["client-certificate"]).read_text()
    if key is None and user.get("client-key"):
        key = (base / user["client-key"]).read_text()
    return (cert, key) if cert and key else None


# -- pods as replicas (pure) ------------------------------------------------------------------


@dataclass(frozen=True)
class PodReplica:
    uid: str
    pod: str
    url: str | None  # None: no IP yet, or no container port of that name
    mode: Mode | None
    ready: bool
    terminating: bool


def replica_of_pod(pod: Mapping[str, Any], port: str | int) -> PodReplica:
    """One pod as a replica; `port` is a container port's name, or a number to use as it is."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    label = (meta.get("labels") or {}).get(MODE_LABEL)
    mode = Mode(label) if label in {m.value for m in Mode} else None
    number = port if isinstance(port, int) else _named_port(pod, port)
    ip = status.get("podIP")
    url = None
    if ip and number:
        url = f"http://[{ip}]:{number}" if ":" in ip else f"http://{ip}:{number}"
    ready = status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or [])
    return PodReplica(meta.get("uid", ""), meta.get("name", ""), url, mode, ready,
                      terminating=bool(meta.get("deletionTimestamp")))


def _named_port(pod: Mapping[str, Any], name: str) -> int | None:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == name and port.get("containerPort"):
                return int(port["containerPort"])
    return None


@dataclass
class PodTable:
    """The pods the watch has seen, by uid, and the resourceVersion to watch from."""

    port: str | int
    pods: dict[str, PodReplica] = field(default_factory=dict)
    resource_version: str = ""

    def relist(self, pod_list: Mapping[str, Any]) -> None:
        self.pods = {}
        for pod in pod_list.get("items") or []:
            replica = replica_of_pod(pod, self.port)
            self.pods[replica.uid] = replica
        self.resource_version = (pod_list.get("metadata") or {}).get("resourceVersion", "")

    def apply(self, event: Mapping[str, Any]) -> None:
        """One watch event; raises WatchGone on 410 and ApiError on other ERROR events."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise WatchGone(obj.get("message", ""))
            raise ApiError(int(obj.get("code") or 0), str(obj.get("message", "")))
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind in ("ADDED", "MODIFIED"):
            replica = replica_of_pod(obj, self.port)
            self.pods[replica.uid] = replica
        elif kind == "DELETED":
            self.pods.pop((obj.get("metadata") or {}).get("uid", ""), None)
        if version:  # BOOKMARK carries only this
            self.resource_version = version

    def uid_of(self, url: str) -> str | None:
        return next((p.uid for p in self.pods.values() if p.url == url and not p.terminating),
                    None)

    def endpoints(self, draining: Iterable[str] = (),
                  unreachable: Iterable[str] = ()) -> list[Endpoint]:
        """Replicas with an address and not terminating; one per URL, a ready one first."""
        draining, unreachable = set(draining), set(unreachable)
        by_url: dict[str, Endpoint] = {}
        for pod in sorted(self.pods.values(), key=lambda p: p.pod):
            if pod.url is None or pod.terminating:
                continue
            endpoint = Endpoint(pod.url, pod.mode, pod.ready and pod.url not in unreachable,
                                pod.url in draining, label=pod.pod)
            if pod.url not in by_url or (endpoint.ready and not by_url[pod.url].ready):
                by_url[pod.url] = endpoint
        return list(by_url.values())


# -- the watch --------------------------------------------------------------------------------


def _state(pod: PodReplica | None) -> tuple[object, ...] | None:
    """What routing reads of a pod (its resourceVersion changes with every status write)."""
    return None if pod is None else (pod.url, pod.mode, pod.ready, pod.terminating)


class KubernetesDiscovery:
    """The `Discovery` of pods in one namespace that match a label selector.

    Data-path reports hold an address out between watch events, a draining one and an
    unreachable one alike, until its `/health` answers 200 again. An address, not a pod: the
    answer came from whatever listens there, and a new pod may get a leaving pod's address (a
    new pod that takes over a draining pod's address is used once it answers).
    """

    def __init__(self, access: ApiAccess, namespace: str, selector: str, port: str | int, *,
                 probe_interval: float = 1.0, watch_seconds: int = 60,
                 backoff_max: float = 30.0, first_sync_wait: float = 5.0) -> None:
        self.access = access
        self.namespace = namespace
        self.selector = selector
        self.table = PodTable(port)
        self.probe_interval = probe_interval
        self.watch_seconds = watch_seconds  # the apiserver ends each watch after this
        self.backoff_max = backoff_max
        self.first_sync_wait = first_sync_wait
        self.lists = 0
        self.watches = 0
        self._draining: set[str] = set()  # URLs
        self._unreachable: set[str] = set()  # URLs
        self._synced = asyncio.Event()
        self._ssl: ssl.SSLContext | bool = access.ssl_context()  # bad files fail at start
        self._client: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def pods_url(self) -> str:
        return f"{self.access.server}/api/v1/namespaces/{self.namespace}/pods"

    def endpoints(self) -> list[Endpoint]:
        return self.table.endpoints(self._draining, self._unreachable)

    def report_unreachable(self, name: str) -> None:
        if name not in self._unreachable and self.table.uid_of(name):
            self._unreachable.add(name)
            self._spawn(self._recover(name, self._unreachable))

    def report_draining(self, name: str) -> None:
        if name not in self._draining and self.table.uid_of(name):
            self._draining.add(name)
            self._spawn(self._recover(name, self._draining))

    async def start(self) -> None:
        self._client = aiohttp.ClientSession(headers={"User-Agent": USER_AGENT})
        self._spawn(self._run())
        # Wait briefly for the first list, so the first requests find replicas; the proxy
        # starts anyway (its /health says 503) when the apiserver is slow or unreachable.
        try:
            await asyncio.wait_for(self._synced.wait(), self.first_sync_wait)
        except TimeoutError:
            log.warning("No pod list from %s within %s s; starting without replicas",
                        self.access.server, self.first_sync_wait)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._client is not None:
            await self._client.close()

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self) -> None:
        backoff = 0.0
        listed = False
        while True:
            try:
                if not listed:
                    await self._list()
                    listed = True
                backoff = 0.0
                await self._watch()
            except WatchGone:
                log.info("Watch of pods %r: resourceVersion too old, listing again",
                         self.selector)
                listed = False
            except Exception as exc:  # nothing may end discovery: back off and go on
                backoff = min(self.backoff_max, max(0.5, backoff * 2))
                self._log_failure(exc, backoff)
                await asyncio.sleep(backoff)

    def _log_failure(self, exc: Exception, backoff: float) -> None:
        what = f"Watching pods {self.selector!r} in {self.namespace} failed"
        if isinstance(exc, ApiError):  # 401/403 or a bad selector: a person must act
            log.error("%s (%s); again in %.1f s", what, exc, backoff)
        elif isinstance(exc, aiohttp.ClientError | TimeoutError | ValueError | OSError):
            log.warning("%s (%r); again in %.1f s", what, exc, backoff)
        else:
            log.exception("%s; again in %.1f s", what, backoff)

    async def _list(self) -> None:
        table = PodTable(self.table.port)
        items: list[Any] = []
        cont = ""
        while True:
            params = {"labelSelector": self.selector, "limit": "500"}
            if cont:
                params["continue"] = cont
            page = await self._get_json(params)
            items += page.get("items") or []
            cont = (page.get("metadata") or {}).get("continue") or ""
            if not cont:
                break
        table.relist({"items": items, "metadata": page.get("metadata") or {}})
        self.table.pods, self.table.resource_version = table.pods, table.resource_version
        self._forget_gone()
        self.lists += 1
        self._synced.set()
        log.info("Listed %d pods matching %r in %s", len(items), self.selector, self.namespace)

    async def _get_json(self, params: dict[str, str]) -> dict[str, Any]:
        assert self._client is not None
        async with self._client.get(
            self.pods_url, params=params, headers=self.access.headers(), ssl=self._ssl,
            timeout=aiohttp.ClientTimeout(total=30),
        ) as response:
            body = await response.read()
            if response.status == 410:
                raise WatchGone(body.decode(errors="replace"))
            if response.status != 200:
                raise ApiError(response.status, body.decode(errors="replace"))
            return orjson.loads(body)

    async def _watch(self) -> None:
        """One watch, until the apiserver ends it; events apply as their lines arrive."""
        assert self._client is not None
        params = {"labelSelector": self.selector, "watch": "1", "allowWatchBookmarks": "true",
                  "resourceVersion": self.table.resource_version,
                  "timeoutSeconds": str(self.watch_seconds)}
        # A silent connection past the watch's own end is a dead one.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10,
                                        sock_read=self.watch_seconds + 30)
        async with self._client.get(self.pods_url, params=params, headers=self.access.headers(),
                                    ssl=self._ssl, timeout=timeout) as response:
            if response.status == 410:
                raise WatchGone("watch answered 410")
            if response.status != 200:
                raise ApiError(response.status, (await response.read()).decode(errors="replace"))
            self.watches += 1
            buffer = b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        self._apply(orjson.loads(line))

    def _apply(self, event: Mapping[str, Any]) -> None:
        uid = ((event.get("object") or {}).get("metadata") or {}).get("uid", "")
        before = self.table.pods.get(uid)
        self.table.apply(event)
        self._forget_gone()
        after = self.table.pods.get(uid)
        pod = after or before
        if pod is not None and _state(before) != _state(after):
            log.info("Pod %s %s: url=%s mode=%s ready=%s terminating=%s", pod.pod,
                     "gone" if after is None else "now", pod.url, pod.mode and pod.mode.value,
                     pod.ready, pod.terminating)

    def _forget_gone(self) -> None:
        urls = {p.url for p in self.table.pods.values()}
        self._draining &= urls
        self._unreachable &= urls

    async def _recover(self, url: str, held_out: set[str]) -> None:
        """Probe an address held out (in `held_out`) until its /health answers 200 or no pod
        has it any more."""
        assert self._client is not None
        log.info("Replica %s %s: out until its /health answers", url,
                 "draining" if held_out is self._draining else "unreachable")
        while url in held_out:
            await asyncio.sleep(self.probe_interval)
            try:
                async with self._client.get(url + "/health",
                                            timeout=aiohttp.ClientTimeout(total=2)) as response:
                    if response.status == 200:
                        held_out.discard(url)
                        log.info("Replica %s answers again", url)
            except (aiohttp.ClientError, TimeoutError):
                pass
