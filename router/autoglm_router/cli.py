"""`autoglm-router`: the router on uvicorn, in front of a fixed list of runtime endpoints."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import uvicorn

from autoglm_router.discovery import StaticDiscovery
from autoglm_router.proxy import ProxySettings, RouterApp
from autoglm_router.routing import RoutingConfig
from autoglm_runtime.profiles import BatchingProfile, Mode, StreamingProfile

DEFAULTS = ProxySettings()


def _endpoint(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path.strip("/"):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a replica base URL like http://10.0.0.7:8000")
    return value.rstrip("/")


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
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--endpoint", action="append", type=_endpoint, required=True,
                   metavar="URL", help="a replica's base URL; repeat for each replica")
    p.add_argument("--load-factor", type=float, default=1.25,
                   help="no replica above this times the mean in-flight cost (>= 1.0)")
    p.add_argument("--no-spill", dest="spill", action="store_false",
                   help="keep each class in its mode even when every replica there is at its cap")
    p.add_argument("--streaming-cap", type=_positive(int),
                   default=StreamingProfile().max_concurrency,
                   help="in-flight requests a streaming replica takes before it counts as full")
    p.add_argument("--batching-cap", type=_positive(int),
                   default=BatchingProfile().max_concurrency,
                   help="in-flight requests a batching replica takes before it counts as full")
    p.add_argument("--virtual-nodes", type=_positive(int), default=100,
                   help="points per replica on the hash ring")
    p.add_argument("--prefix-chars", type=_positive(int), default=DEFAULTS.prefix_chars,
                   help="characters of system prompt + first user turn hashed without a session")
    p.add_argument("--max-body-bytes", type=_positive(int), default=DEFAULTS.max_body_bytes,
                   help="larger request bodies get 413")
    p.add_argument("--connect-timeout", type=_positive(float), default=DEFAULTS.connect_timeout,
                   help="seconds to connect to a replica")
    p.add_argument("--idle-timeout", type=_positive(float), default=DEFAULTS.idle_timeout,
                   help="seconds a replica may stay silent (before headers or between chunks)")
    p.add_argument("--stream-timeout", type=_positive(float), default=DEFAULTS.stream_timeout,
                   help="seconds a whole response may take")
    p.add_argument("--poll-interval", type=_positive(float), default=1.0,
                   help="seconds between polls of each replica's /health and /metrics")
    p.add_argument("--drain-seconds", type=_positive(int), default=30,
                   help="on SIGTERM, how long streams in flight may take to finish")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"])
    return p


def create_app(args: argparse.Namespace) -> RouterApp:
    config = RoutingConfig(
        load_factor=args.load_factor, spill=args.spill, virtual_nodes=args.virtual_nodes,
        caps={Mode.STREAMING: args.streaming_cap, Mode.BATCHING: args.batching_cap},
    )
    settings = ProxySettings(
        prefix_chars=args.prefix_chars, max_body_bytes=args.max_body_bytes,
        connect_timeout=args.connect_timeout, idle_timeout=args.idle_timeout,
        stream_timeout=args.stream_timeout,
    )
    return RouterApp(StaticDiscovery(args.endpoint, interval=args.poll_interval), config,
                     settings)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.load_factor < 1.0:
        parser.error(f"--load-factor must be at least 1.0, got {args.load_factor}")
    if len(set(args.endpoint)) != len(args.endpoint):
        parser.error("each --endpoint may be given once")
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # uvicorn's SIGTERM handling is the drain: it stops listening, closes idle connections and
    # waits up to timeout_graceful_shutdown for requests in flight, streams included.
    # The replica's own Date and Server headers pass through, so uvicorn adds none.
    uvicorn.run(create_app(args), host=args.host, port=args.port, lifespan="on",
                log_level="warning", timeout_graceful_shutdown=args.drain_seconds,
                access_log=False, server_header=False, date_header=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
