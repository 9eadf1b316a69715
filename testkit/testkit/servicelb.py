"""A kube-proxy for one Service whose pods live on loopback addresses.

EndpointSlices refuse loopback addresses, so the endpoint controller cannot publish the local
cluster's pods. This proxy works the endpoints out the way that controller does, from a pod
watch: pods that match the Service's selector, have an IP, are Ready and are not terminating.
kwok reports a pod Ready without probing anything, so the proxy also runs the container's HTTP
readinessProbe itself, as the kubelet would, before the pod counts as ready. And kwok hands a
deleted pod's IP to the next pod at once, while the old pod's process still drains on it
(testkit.podrunner makes the new pod wait for the address): a probe of that address reaches
the old process. So, given the `kubelet` (the PodRunner), a pod counts only once its own
process runs, as a pod's readiness does once its container has started.

Like kube-proxy it balances connections, not requests: a new connection goes to the next ready
endpoint, and an established connection stays with its pod until either side closes it. Given
`idle_timeout`, it cuts a connection on which no byte moved for that long, as the ingresses and
cloud load balancers in front of a Service do (60 s is common). Like
the endpoint controller it follows the Service: when its selector changes (the operator moves
Service `<name>` onto the router pods once one is ready), the endpoints follow at once.

    with ServiceProxy(cluster, "demo", "phone-9b", kubelet=pod_runner) as proxy:
        openai.OpenAI(base_url=proxy.url + "/v1", api_key="EMPTY")
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes import client, config, watch  # type: ignore[import-untyped]

from testkit.localcluster import LocalCluster, http_ok, log

PROBE_EVERY_SECONDS = 0.5


class Kubelet(Protocol):
    """What runs the pods' processes (testkit.podrunner.PodRunner)."""

    def running(self, pod_name: str) -> object | None: ...


@dataclass(frozen=True)
class Endpoint:
    pod: str
    address: str  # ip:port
    probe_url: str | None  # the readinessProbe's URL; None: the pod has none


@dataclass
class ProxyStats:
    """Connections sent to each pod, and when each pod stopped being a ready endpoint."""

    connections: Counter[str] = field(default_factory=Counter)
    connection_times: list[tuple[float, str]] = field(default_factory=list)
    removed_at: dict[str, float] = field(default_factory=dict)
    refused: int = 0  # connections that arrived while no endpoint was ready
    idle_cuts: int = 0  # connections cut for idleness (idle_timeout)


class ServiceProxy:
    def __init__(self, cluster: LocalCluster, namespace: str, service: str,
                 kubelet: Kubelet | None = None, idle_timeout: float | None = None) -> None:
        """`kubelet`: what runs the pods' processes; None when nothing here runs them (their
        readinessProbe alone decides)."""
        self.namespace = namespace
        self.idle_timeout = idle_timeout
        self._kubelet = kubelet
        self.service = service
        api_client = config.new_client_from_config(config_file=cluster.kubeconfig)
        self.core = client.CoreV1Api(api_client)
        self.stats = ProxyStats()
        self.port = 0
        self._pods: dict[str, Any] = {}  # every pod of the namespace, as last seen
        self._selector: dict[str, str] = {}
        self.target_port: int | str = 0
        self._candidates: dict[str, Endpoint] = {}  # selected, Ready per the API, not terminating
        self._probed: set[str] = set()  # candidates whose readinessProbe passed last time
        self._next = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()  # both ends of every proxied connection
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def endpoints(self) -> list[Endpoint]:
        """The ready endpoints, by pod name."""
        with self._lock:
            ready = [e for name, e in self._candidates.items() if name in self._probed]
        return sorted(ready, key=lambda e: e.pod)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> ServiceProxy:
        self._follow(self.core.read_namespaced_service(self.service, self.namespace))
        self._threads.append(_daemon(self._loop.run_forever, "servicelb"))
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop
        ).result(timeout=10)
        self.port = int(self._server.sockets[0].getsockname()[1])
        # Not joined on stop: they see the stop flag when their watch call returns (30 s at most).
        _daemon(self._watch_pods, "servicelb-pods")
        _daemon(self._watch_service, "servicelb-service")
        self._threads.append(_daemon(self._probe_forever, "servicelb-probe"))
        log(f"servicelb: {self.namespace}/{self.service} on {self.url}")
        return self

    def stop(self) -> None:
        self._stop.set()
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        for thread in self._threads:
            thread.join(timeout=10)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._open):
            writer.close()
        # Let every connection's handler finish before the loop stops under it.
        handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    def __enter__(self) -> ServiceProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the endpoints ---------------------------------------------------------------------------

    def _watch_pods(self) -> None:
        def listed(pods: list[Any]) -> None:
            with self._lock:
                self._pods = {pod.metadata.name: pod for pod in pods}
            self._reselect()

        def changed(kind: str, pod: Any) -> None:
            with self._lock:
                if kind == "DELETED":
                    self._pods.pop(pod.metadata.name, None)
                else:
                    self._pods[pod.metadata.name] = pod
            self._set(pod.metadata.name, None if kind == "DELETED" else self._endpoint(pod))

        self._list_and_watch(self.core.list_namespaced_pod, {}, listed, changed)

    def _watch_service(self) -> None:
        def listed(services: list[Any]) -> None:
            for svc in services:
                self._follow(svc)

        def changed(kind: str, svc: Any) -> None:
            if kind != "DELETED":
                self._follow(svc)

        by_name = {"field_selector": f"metadata.name={self.service}"}
        self._list_and_watch(self.core.list_namespaced_service, by_name, listed, changed)

    def _list_and_watch(self, list_fn: Any, filters: dict[str, str],
                        listed: Any, changed: Any) -> None:  # fmt: skip
        """A list, then a watch from its resourceVersion, again after each watch ends."""
        while not self._stop.is_set():
            try:
                listing = list_fn(self.namespace, **filters)
                listed(listing.items)
                stream = watch.Watch().stream(
                    list_fn, self.namespace, **filters,
                    resource_version=listing.metadata.resource_version, timeout_seconds=30,
                )  # fmt: skip
                for event in stream:
                    if self._stop.is_set():
                        return
                    changed(event["type"], event["object"])
            except Exception as exc:  # the apiserver may restart under us: list again
                if not self._stop.is_set():
                    log(f"servicelb: watch failed ({exc}); retrying")
                    time.sleep(1)

    def _follow(self, svc: Any) -> None:
        """The Service's selector and target port; a change re-selects the endpoints."""
        selector, port = dict(svc.spec.selector or {}), svc.spec.ports[0].target_port
        with self._lock:
            if (selector, port) == (self._selector, self.target_port):
                return
            self._selector, self.target_port = selector, port
        self._reselect()

    def _reselect(self) -> None:
        with self._lock:
            pods = list(self._pods.values())
            names = set(self._pods) | set(self._candidates)
        endpoints = {pod.metadata.name: self._endpoint(pod) for pod in pods}
        for name in names:
            self._set(name, endpoints.get(name))

    def _set(self, pod: str, endpoint: Endpoint | None) -> None:
        with self._lock:
            if endpoint is not None:
                self._candidates[pod] = endpoint
                return
            was_ready = pod in self._probed
            self._candidates.pop(pod, None)
            self._probed.discard(pod)
            if was_ready:
                self.stats.removed_at[pod] = time.time()

    def _endpoint(self, pod: Any) -> Endpoint | None:
        """The pod's endpoint if the EndpointSlice controller would list it as ready."""
        with self._lock:
            selector, target_port = self._selector, self.target_port
        labels = pod.metadata.labels or {}
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            return None
        ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
        if pod.metadata.deletion_timestamp is not None or not pod.status.pod_ip or not ready:
            return None
        port = self._port(pod, target_port)
        if port is None:
            return None
        probe = pod.spec.containers[0].readiness_probe
        probe_url = None
        if probe is not None and probe.http_get is not None:
            probe_port = self._port(pod, probe.http_get.port)
            probe_url = f"http://{pod.status.pod_ip}:{probe_port}{probe.http_get.path or '/'}"
        return Endpoint(pod.metadata.name, f"{pod.status.pod_ip}:{port}", probe_url)

    @staticmethod
    def _port(pod: Any, port: int | str) -> int | None:
        """A port number, or a named container port's number."""
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        named = [p for c in pod.spec.containers for p in c.ports or [] if p.name == port]
        return int(named[0].container_port) if named else None

    def _probe_forever(self) -> None:
        while not self._stop.wait(PROBE_EVERY_SECONDS):
            with self._lock:
                candidates = list(self._candidates.values())
            passed = {e.pod for e in candidates if self._started(e.pod) and (
                e.probe_url is None or http_ok(e.probe_url, timeout=1))}
            with self._lock:
                for pod in self._probed - passed:
                    self.stats.removed_at[pod] = time.time()
                # A pod deleted while it was probed stays out.
                self._probed = passed & set(self._candidates)

    def _started(self, pod: str) -> bool:
        return self._kubelet is None or self._kubelet.running(pod) is not None

    # -- the data path ---------------------------------------------------------------------------

    def _pick(self) -> Endpoint | None:
        ready = self.endpoints()
        with self._lock:
            if not ready:
                self.stats.refused += 1
                return None
            endpoint = ready[self._next % len(ready)]
            self._next += 1
            self.stats.connections[endpoint.pod] += 1
            self.stats.connection_times.append((time.time(), endpoint.pod))
            return endpoint

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        endpoint = self._pick()
        if endpoint is None:
            writer.close()
            return
        host, port = endpoint.address.rsplit(":", 1)
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()  # as a refused connection through kube-proxy
            return
        self._open |= {writer, upstream_writer}
        moved = [time.monotonic()]  # when a byte last moved either way
        pipes = asyncio.gather(_pipe(reader, upstream_writer, moved),
                               _pipe(upstream_reader, writer, moved))
        try:
            if self.idle_timeout is None:
                await pipes
            else:
                await self._cut_when_idle(pipes, moved, writer, upstream_writer)
        finally:
            self._open -= {writer, upstream_writer}

    async def _cut_when_idle(self, pipes: asyncio.Future[Any], moved: list[float],
                             *writers: asyncio.StreamWriter) -> None:
        assert self.idle_timeout is not None
        while not pipes.done():
            idle = time.monotonic() - moved[0]
            if idle >= self.idle_timeout:
                self.stats.idle_cuts += 1
                log(f"servicelb: cut a connection idle for {idle:.0f}s")
                for writer in writers:
                    writer.transport.abort()
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pipes), self.idle_timeout - idle)
        await asyncio.gather(pipes, return_exceptions=True)


def _daemon(target: Any, name: str) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                moved: list[float]) -> None:
    """Copy until EOF or an error, then close this direction's writer (the other side sees EOF);
    `moved[0]` is when a byte last went through."""
    try:
        while data := await reader.read(65536):
            moved[0] = time.monotonic()
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
