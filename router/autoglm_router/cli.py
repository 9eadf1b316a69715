"""`autoglm-router`: the router on uvicorn, in front of a list of runtime endpoints or the pods
a Kubernetes label selector matches."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

from autoglm_api.keepalive import SERVER_KEEP_ALIVE_SECONDS
from autoglm_api.profiles import BatchingProfile, Mode, StreamingProfile
from autoglm_router.connections import ConnectionLimits, guarded_protocol
from autoglm_router.discovery import Discovery, StaticDiscovery
from autoglm_router.drain import DrainingServer
from autoglm_router.kube import (
    AccessError,
    ApiAccess,
    KubernetesDiscovery,
    in_cluster_access,
    kubeconfig_access,
)
from autoglm_router.proxy import ProxySettings, RouterApp
from autoglm_router.routing import RoutingConfig

DEFAULTS = ProxySettings()
LIMITS = ConnectionLimits()
# The replicas' own variable: the router is given the same Secret, so both check one key.
API_KEY_ENV = "VLLM_API_KEY"


def _endpoint(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path.strip("/"):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a replica base URL like http://10.0.0.7:8000")
    return value.rstrip("/")


def _not_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return number


def _not_negative_float(value: str) -> float:
    number = float(value)
    if not number >= 0.0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return number


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(value: str) -> int | float:
        number = kind(value)
        if number <= 0:
            raise argparse.ArgumentTypeError(f"must be above 0, got {value}")
        return number
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="autoglm-router",
        description="Route OpenAI requests to AutoGLM runtime replicas by mode and session.")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (the API)")
    p.add_argument("--metrics-port", type=int, default=9090,
                   help="port of /health and /metrics, apart from the API clients reach")
    p.add_argument("--endpoint", action="append", type=_endpoint, metavar="URL",
                   help="a replica's base URL; repeat for each replica")
    gateway = p.add_argument_group(
        "endpoint picker (docs/router/gateway.md): a Gateway API Inference Extension gateway "
        "asks this process which replica takes each request")
    gateway.add_argument("--ext-proc-port", type=_positive(int),
                         help="serve Envoy's ext_proc protocol (and gRPC health) on this port, "
                         "beside the HTTP API")
    gateway.add_argument("--ext-proc-fallbacks", type=int, default=0, metavar="N",
                         help="name N more replicas after the chosen one, for a gateway that "
                         "retries down the list (Istio's override_host); 0 for one that routes "
                         "by the header to ORIGINAL_DST, which reads a single address")
    kube = p.add_argument_group("Kubernetes discovery (instead of --endpoint)")
    kube.add_argument("--kubernetes", action="store_true",
                      help="watch the pods --selector matches in --namespace")
    kube.add_argument("--namespace", help="the pods' namespace (default: the ServiceAccount's "
                      "or the kubeconfig context's)")
    kube.add_argument("--selector", help="label selector of one deployment's serving pods, "
                      "e.g. app.kubernetes.io/instance=NAME,app.kubernetes.io/component=server")
    kube.add_argument("--port-name", help="the container port to send requests to, by name "
                      "(default http)")
    kube.add_argument("--target-port", type=_positive(int),
                      help="the port to send requests to, by number (instead of --port-name)")
    kube.add_argument("--kubeconfig", help="reach the apiserver with this kubeconfig instead "
                      "of the pod's ServiceAccount (default $KUBECONFIG outside a pod)")
    kube.add_argument("--context", help="the kubeconfig context (default its current one)")
    hold = p.add_argument_group("holding (scale to zero, rollouts): an inference request that "
                                "finds no replica waits for one instead of a 503; the operator "
                                "reads what is held from the ops port (/autoglm/v1/demand)")
    hold.add_argument("--hold-queue-size", type=_not_negative, default=DEFAULTS.hold_queue_size,
                      metavar="N", help="requests held at once; past it 503 with Retry-After "
                      "(0: hold none, answer 503 at once)")
    hold.add_argument("--hold-seconds", type=_positive(float), default=DEFAULTS.hold_seconds,
                      metavar="S", help="the longest a request is held; then 503 with "
                      "Retry-After (keep --drain-seconds above it)")
    hold.add_argument("--hold-per-client", type=_positive(int), metavar="N",
                      help="requests one client (its source address) may have held at once; "
                      "past it 503 with Retry-After (default a quarter of --hold-queue-size)")
    hold.add_argument("--hold-heartbeat-seconds", type=_not_negative_float,
                      default=DEFAULTS.hold_heartbeat, metavar="S",
                      help="a held streamed request gets its response head and an SSE comment "
                      "every S seconds, so a proxy's idle timeout does not cut it (0: none)")
    p.add_argument("--served-model-name", action="append", default=[], metavar="NAME",
                   help="a name the replicas serve: GET /v1/models lists these while no "
                   "replica is up, instead of waking one; repeat for each")
    p.add_argument("--load-factor", type=float, default=1.25,
                   help="no replica above this times the mean in-flight cost (>= 1.0)")
    p.add_argument("--no-spill", dest="spill", action="store_false",
                   help="keep each class in its mode even when every replica there is at its cap")
    p.add_argument("--no-shed", dest="shed", action="store_false",
                   help="queue on a replica when every replica is at its cap, instead of "
                   "answering 429")
    p.add_argument("--other-overflow", type=float, default=RoutingConfig().other_overflow,
                   help="non-streamed requests are refused only past (1 + this) x the caps")
    p.add_argument("--fresh-seconds", type=float, default=RoutingConfig().fresh_seconds,
                   help="with no streaming replica, a streamed chat goes to the replica sent "
                   "the fewest requests within this many seconds (the chat TTFT target)")
    p.add_argument("--recent-load-seconds", type=_positive(float),
                   default=DEFAULTS.recent_load_seconds,
                   help="a new conversation is placed by each replica's in-flight cost "
                   "averaged over about this many seconds (a phone agent's turn cycle)")
    p.add_argument("--streaming-cap", type=_positive(int),
                   default=StreamingProfile().max_concurrency,
                   help="in-flight requests a streaming replica takes before it counts as full")
    p.add_argument("--batching-cap", type=_positive(int),
                   default=BatchingProfile().max_concurrency,
                   help="in-flight requests a batching replica takes before it counts as full")
    chat_caps = RoutingConfig().chat_caps
    p.add_argument("--streaming-chat-cap", type=_positive(int),
                   default=chat_caps[Mode.STREAMING],
                   help="the same for a streamed chat: a profile that puts streams first "
                   "admits them up to the engine's --max-num-seqs")
    p.add_argument("--batching-chat-cap", type=_positive(int),
                   default=chat_caps[Mode.BATCHING],
                   help="the same for a streamed chat on a batching replica")
    p.add_argument("--virtual-nodes", type=_positive(int), default=100,
                   help="points per replica on the hash ring")
    p.add_argument("--prefix-chars", type=_positive(int), default=DEFAULTS.prefix_chars,
                   help="characters of the system prompt and of the first user turn, each, "
                   "hashed without a session (the conversation key)")
    p.add_argument("--image-max-pixels", type=_positive(int), default=DEFAULTS.image_max_pixels,
                   help="the replicas' pixel budget per image (vLLM's max_pixels), to price a "
                        "screenshot's prefill as the engine counts it")
    p.add_argument("--max-body-bytes", type=_positive(int), default=DEFAULTS.max_body_bytes,
                   help="larger request bodies get 413")
    limits = p.add_argument_group("client limits (docs/operations/security.md)")
    limits.add_argument("--max-buffered-body-bytes", type=_positive(int),
                        default=DEFAULTS.max_buffered_body_bytes,
                        help="request bodies held at once, all requests together; past it 503")
    limits.add_argument("--max-inflight", type=_positive(int), default=DEFAULTS.max_inflight,
                        help="client requests at once; past it 503 with Retry-After")
    limits.add_argument("--max-client-connections", type=_positive(int),
                        default=LIMITS.max_connections,
                        help="open client connections; past it 503 with Retry-After")
    limits.add_argument("--max-header-bytes", type=_positive(int),
                        default=LIMITS.max_header_bytes,
                        help="request line and headers of one request; past it 431")
    limits.add_argument("--max-headers", type=_positive(int), default=LIMITS.max_headers,
                        help="headers in one request; past it 431")
    limits.add_argument("--header-timeout", type=_positive(float),
                        default=LIMITS.header_timeout,
                        help="seconds from connect (or a request's first byte) to its last "
                        "header; past it 408 and the connection closes")
    limits.add_argument("--body-timeout", type=_positive(float), default=DEFAULTS.body_timeout,
                        help="seconds to receive a whole request body; past it 408")
    limits.add_argument("--keep-alive-timeout", type=_positive(float),
                        default=SERVER_KEEP_ALIVE_SECONDS,
                        help="seconds an idle kept-alive client connection stays open; keep it "
                        "above the clients' own idle reuse (the openai client's 5 s), or a "
                        "request sent just as the router closes the connection is lost")
    limits.add_argument("--send-timeout", type=_positive(float), default=DEFAULTS.send_timeout,
                        help="seconds a client may take no response bytes before it is cut")
    p.add_argument("--connect-timeout", type=_positive(float), default=DEFAULTS.connect_timeout,
                   help="seconds to connect to a replica")
    p.add_argument("--idle-timeout", type=_positive(float), default=DEFAULTS.idle_timeout,
                   help="seconds a replica may stay silent (before headers or between chunks)")
    p.add_argument("--stream-timeout", type=_positive(float), default=DEFAULTS.stream_timeout,
                   help="seconds a whole response may take")
    p.add_argument("--poll-interval", type=_positive(float), default=1.0,
                   help="seconds between polls of each replica's /health and /metrics (with "
                   "--kubernetes: of an unreachable replica's /health)")
    p.add_argument("--drain-seconds", type=_positive(int), default=30,
                   help="on SIGTERM, how long streams in flight may take to finish")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    return p


def create_app(args: argparse.Namespace, discovery: Discovery | None = None) -> RouterApp:
    config = RoutingConfig(
        load_factor=args.load_factor, spill=args.spill, shed=args.shed,
        other_overflow=args.other_overflow, fresh_seconds=args.fresh_seconds,
        virtual_nodes=args.virtual_nodes,
        caps={Mode.STREAMING: args.streaming_cap, Mode.BATCHING: args.batching_cap},
        chat_caps={Mode.STREAMING: args.streaming_chat_cap,
                   Mode.BATCHING: args.batching_chat_cap},
    )
    settings = ProxySettings(
        prefix_chars=args.prefix_chars, image_max_pixels=args.image_max_pixels,
        max_body_bytes=args.max_body_bytes,
        connect_timeout=args.connect_timeout, idle_timeout=args.idle_timeout,
        stream_timeout=args.stream_timeout, load_poll_interval=args.poll_interval,
        recent_load_seconds=args.recent_load_seconds,
        max_inflight=args.max_inflight, max_buffered_body_bytes=args.max_buffered_body_bytes,
        body_timeout=args.body_timeout, send_timeout=args.send_timeout,
        hold_queue_size=args.hold_queue_size, hold_seconds=args.hold_seconds,
        hold_per_client=args.hold_per_client, hold_heartbeat=args.hold_heartbeat_seconds,
        served_model_names=tuple(args.served_model_name),
    )
    api_key = os.environ.get(API_KEY_ENV)
    return RouterApp(discovery or discovery_of(args), config, settings,
                     api_keys=[api_key] if api_key else [])


KUBE_ONLY = ("namespace", "selector", "port_name", "target_port", "kubeconfig", "context")


def check_discovery_flags(args: argparse.Namespace) -> str | None:
    """What is wrong with the discovery flags, or None."""
    if args.kubernetes and args.endpoint:
        return "--endpoint and --kubernetes exclude each other: give one"
    if not args.kubernetes:
        if not args.endpoint:
            return "give each replica with --endpoint URL, or --kubernetes to watch pods"
        given = [f"--{name.replace('_', '-')}" for name in KUBE_ONLY
                 if getattr(args, name) is not None]
        return f"{', '.join(given)} only apply with --kubernetes" if given else None
    if not args.selector or not args.selector.strip():
        return "--kubernetes needs --selector (e.g. app.kubernetes.io/instance=NAME)"
    if args.port_name is not None and args.target_port is not None:
        return "--port-name and --target-port exclude each other: give one"
    if args.context is not None and args.kubeconfig is None and not os.environ.get("KUBECONFIG"):
        return "--context needs --kubeconfig (or $KUBECONFIG)"
    return None


def check_picker_flags(args: argparse.Namespace) -> str | None:
    """What is wrong with the endpoint picker's flags, or None."""
    if args.ext_proc_port is None:
        return "--ext-proc-fallbacks only applies with --ext-proc-port" \
            if args.ext_proc_fallbacks else None
    if args.ext_proc_port in (args.port, args.metrics_port):
        return "--ext-proc-port must differ from --port and --metrics-port"
    if args.ext_proc_fallbacks < 0:
        return f"--ext-proc-fallbacks must be at least 0, got {args.ext_proc_fallbacks}"
    # The gateway dials what the picker names: an ip:port, never a name to resolve.
    named = [url for url in args.endpoint or [] if not _is_ip(urlsplit(url).hostname or "")]
    if named:
        return (f"--ext-proc-port names replicas by IP address: {', '.join(named)} is not one")
    return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def api_access(args: argparse.Namespace, env: dict[str, str] | None = None) -> ApiAccess:
    """The kubeconfig when given, else the pod's ServiceAccount, else $KUBECONFIG."""
    env = dict(os.environ) if env is None else env
    if args.kubeconfig:
        return kubeconfig_access(args.kubeconfig, args.context)
    if env.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster_access(env)
    if env.get("KUBECONFIG"):
        return kubeconfig_access(env["KUBECONFIG"].split(os.pathsep)[0], args.context)
    raise AccessError("not inside a pod and no kubeconfig: give --kubeconfig")


def discovery_of(args: argparse.Namespace) -> Discovery:
    if not args.kubernetes:
        return StaticDiscovery(args.endpoint, interval=args.poll_interval)
    access = api_access(args)
    namespace = args.namespace or access.namespace
    if not namespace:
        raise AccessError("no namespace: give --namespace")
    port = args.target_port if args.target_port is not None else args.port_name or "http"
    return KubernetesDiscovery(access, namespace, args.selector.strip(), port,
                               probe_interval=args.poll_interval)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.load_factor < 1.0:
        parser.error(f"--load-factor must be at least 1.0, got {args.load_factor}")
    if not args.other_overflow >= 0.0:
        parser.error(f"--other-overflow must be at least 0, got {args.other_overflow}")
    if not args.fresh_seconds > 0.0:
        parser.error(f"--fresh-seconds must be above 0, got {args.fresh_seconds}")
    problem = check_discovery_flags(args)
    if problem:
        parser.error(problem)
    if args.hold_per_client is not None and args.hold_per_client > args.hold_queue_size:
        parser.error(f"--hold-per-client ({args.hold_per_client}) must not exceed "
                     f"--hold-queue-size ({args.hold_queue_size})")
    if args.endpoint and len(set(args.endpoint)) != len(args.endpoint):
        parser.error("each --endpoint may be given once")
    if args.metrics_port == args.port:
        parser.error("--metrics-port must differ from --port: /metrics is not for clients")
    problem = check_picker_flags(args)
    if problem:
        parser.error(problem)
    try:
        discovery = discovery_of(args)
    except AccessError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # On SIGTERM the server stops listening and waits up to --drain-seconds for requests in
    # flight, streams included, and for kept-alive connections to end (drain.py).
    # The replica's own Date and Server headers pass through, so uvicorn adds none.
    app = create_app(args, discovery)
    limits = ConnectionLimits(
        max_connections=args.max_client_connections, max_header_bytes=args.max_header_bytes,
        max_headers=args.max_headers, header_timeout=args.header_timeout)
    picker = None
    if args.ext_proc_port is not None:
        # gRPC and Envoy's protos load only for the picker: the HTTP router runs without them.
        from autoglm_router.picker import PickerServer

        picker = PickerServer(app, args.host, args.ext_proc_port, args.ext_proc_fallbacks)
    server = DrainingServer(app, host=args.host, port=args.port, ops_port=args.metrics_port,
                            picker=picker,
                            lifespan="on", log_level="warning", http=guarded_protocol(limits),
                            timeout_keep_alive=args.keep_alive_timeout,
                            # The router is the edge: a client's X-Forwarded-* says nothing.
                            proxy_headers=False,
                            timeout_graceful_shutdown=args.drain_seconds, access_log=False,
                            server_header=False, date_header=False)
    server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
