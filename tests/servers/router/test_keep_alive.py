"""No server of ours closes a kept-alive connection while its client may still reuse it.

This was a lost request: the sim and the router, like uvicorn and `vllm serve` at their
defaults, closed an idle connection after 5 s, and the official `openai` client reuses one for
5 s counted from when it has read the answer, a little later. A request sent on a connection
idle for just under 5 s met the server's close and failed with `APIConnectionError`, about once
in a few hundred requests when load spread them about 5 s apart on each connection (the
adaptive end-to-end test's trickle of chats). The rule is in autoglm_api/keepalive.py.
"""

from __future__ import annotations

import signal
import socket
import time

import openai._constants
import pytest
from router_kit import StartRouter, StartSim

from autoglm_api.keepalive import (
    DRAINING_IDLE_SECONDS,
    SERVER_KEEP_ALIVE_SECONDS,
    UPSTREAM_POOL_IDLE_SECONDS,
)

pytestmark = pytest.mark.timeout(60)

AIOHTTP_POOL_EXPIRY = 15.0  # aiohttp.TCPConnector's default keepalive_timeout


def openai_pool_expiry() -> float:
    """Seconds the official `openai` client keeps reusing an idle connection."""
    expiry = openai._constants.DEFAULT_CONNECTION_LIMITS.keepalive_expiry
    assert expiry is not None, "the openai client keeps idle connections forever"
    return float(expiry)


def get_on(sock: socket.socket, path: str) -> int:
    """GET `path` on this kept-alive connection and read the whole answer; its status, or an
    AssertionError when the server closed the connection instead of answering."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the kept-alive connection instead of answering {path}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines
                  if line.lower().startswith("content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection in the middle of an answer"
        body += chunk
    return int(lines[0].split()[1])


def reused_after_the_clients_expiry(port: int) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        assert get_on(sock, "/v1/models") == 200  # a live kept-alive connection
        # Time is the behaviour: idle past the last moment the client reuses it (with a margin
        # for a loaded machine), the server must still answer on it.
        time.sleep(openai_pool_expiry() + 1.0)
        return get_on(sock, "/v1/models")


def test_the_sim_keeps_an_idle_connection_open_past_the_openai_clients_reuse_of_it(
    start_sim: StartSim,
) -> None:
    assert reused_after_the_clients_expiry(start_sim("streaming").port) == 200


def test_the_router_keeps_an_idle_client_connection_open_past_the_openai_clients_reuse_of_it(
    start_sim: StartSim, start_router: StartRouter
) -> None:
    router = start_router([start_sim("streaming").base_url])
    assert reused_after_the_clients_expiry(router.port) == 200


def test_servers_outlast_their_clients_and_our_pools_retire_connections_first() -> None:
    clients = max(openai_pool_expiry(), AIOHTTP_POOL_EXPIRY)
    assert clients < SERVER_KEEP_ALIVE_SECONDS
    assert clients < DRAINING_IDLE_SECONDS
    stock_uvicorn = 5.0  # a plain `vllm serve` replica, without our launcher
    assert stock_uvicorn > UPSTREAM_POOL_IDLE_SECONDS


def test_a_draining_router_closes_an_idle_connection_only_once_its_client_stopped_reusing_it(
    start_sim: StartSim, start_router: StartRouter
) -> None:
    router = start_router([start_sim("streaming").base_url], "--drain-seconds", "60")
    with socket.create_connection(("127.0.0.1", router.port), timeout=30) as sock:
        assert get_on(sock, "/v1/models") == 200
        answered = time.monotonic()
        router.terminate()
        assert sock.recv(1) == b"", "the draining router answered nothing, it should close"
        idle = time.monotonic() - answered
    # Not under a client that may still reuse it, and not held for the whole drain either. The
    # router's timer starts when it wrote the answer, a moment before this client read it, so
    # `idle` can fall a hair short of DRAINING_IDLE_SECONDS; the clients' expiry is what matters.
    assert max(openai_pool_expiry(), AIOHTTP_POOL_EXPIRY) < idle < 30, idle
    assert router.process is not None and router.process.wait(10) in (0, -signal.SIGTERM)
