"""The router's own cost, against a trivial upstream so the router, not an engine, is measured.

Two parts, one run:
1. Client choice: httpx and aiohttp each forward the same requests (POST + streamed body) to
   the trivial upstream, the way the router's data path does; per-request latency and the
   client's CPU per request, at 1 and 32 concurrent requests.
2. The router itself: time to first byte and to the end, direct to the upstream vs through
   `autoglm-router`, at 1 and 100 concurrent streams of 32 SSE events; the router's own
   added-latency histogram (request in -> upstream out, first upstream byte -> first client
   byte), its CPU per request and per SSE event, and its RSS.
3. vLLM's Rust router (`vllm-router`, `consistent_hash` on `X-Session-ID`;
   testkit.bench.vllm_router) on the same upstream under the same load: the client-measured
   figures and its RSS, printed as ours / its.
Everything shares this machine's cores, so the figures include contention; the load generator
uses aiohttp (the cheaper client) so it disturbs less. Targets (from issue 13, on the router's
own histogram at 100 concurrent streams): each phase p50 <= 2 ms and p99 <= 10 ms, router CPU
<= 2 ms per request and <= 50 us per SSE event, RSS <= 150 MB; exit 1 when one is missed.
Writes out/bench/router_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from testkit.bench import vllm_router
from testkit.paths import OUT_DIR
from testkit.report import results_page

SSE_EVENTS = 32
PHASES = ("request", "first_byte")
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"tap "},"finish_reason":null}]}\n\n'
BODY = json.dumps({"model": "m", "stream": True, "session_id": "bench",
                   "messages": [{"role": "user", "content": "open the settings app"}]}).encode()
HEADERS = {"content-type": "application/json", "X-Session-ID": "bench"}
CLK_TCK = os.sysconf("SC_CLK_TCK")
# The figures printed as ours / vllm-router's (client-measured, so the same for both).
COMPARED = (("added_ttfb_p50_ms", "added TTFB p50 (ms)"), ("added_ttfb_p99_ms",
            "added TTFB p99 (ms)"), ("router_cpu_ms_per_request", "CPU per request (ms)"),
            ("router_cpu_us_per_sse_event", "CPU per SSE event (us)"))


# --- the trivial upstream (run in its own process with --upstream PORT) ---------------------

async def upstream_app(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                       send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] in ("/health", "/metrics"):
        body = b'autoglm_mode{mode="streaming"} 1.0\nautoglm_draining 0.0\n'
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    for _ in range(SSE_EVENTS):
        await send({"type": "http.response.body", "body": EVENT, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def run_upstream(port: int) -> None:
    import uvicorn
    uvicorn.run(upstream_app, host="127.0.0.1", port=port, log_level="error",
                access_log=False, interface="asgi3")


# --- helpers ---------------------------------------------------------------------------------

def free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(url: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50_ms": 1000 * statistics.median(ordered),
            "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+) kB", status)
    return int(found.group(1)) / 1024 if found else 0.0


# --- part 1: httpx vs aiohttp as the proxy's client ------------------------------------------

async def with_httpx(url: str, count: int, concurrency: int) -> tuple[list[float], float]:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:

        async def one() -> float:
            start = time.perf_counter()
            request = client.build_request("POST", url + "/v1/chat/completions", content=BODY,
                                           headers={"content-type": "application/json"})
            response = await client.send(request, stream=True)
            async for _ in response.aiter_raw():
                pass
            await response.aclose()
            return time.perf_counter() - start

        return await drive(one, count, concurrency)


async def with_aiohttp(url: str, count: int, concurrency: int) -> tuple[list[float], float]:
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                     auto_decompress=False) as session:

        async def one() -> float:
            start = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", data=BODY,
                                    headers={"content-type": "application/json"}) as response:
                async for _ in response.content.iter_any():
                    pass
            return time.perf_counter() - start

        return await drive(one, count, concurrency)


async def drive(one: Callable[[], Awaitable[float]], count: int,
                concurrency: int) -> tuple[list[float], float]:
    """Latencies and client CPU seconds per request (after a short warm-up)."""
    for _ in range(20):
        await one()
    latencies: list[float] = []
    remaining = iter(range(count))
    cpu = time.process_time()

    async def worker() -> None:
        for _ in remaining:
            latencies.append(await one())

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, (time.process_time() - cpu) / count


def compare_clients(upstream: str, count: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for concurrency in (1, 32):
        for name, run in (("httpx", with_httpx), ("aiohttp", with_aiohttp)) * 2:
            latencies, cpu = asyncio.run(run(upstream, count // 2, concurrency))
            entry = results.setdefault(f"{name}@{concurrency}", {"lat": [], "cpu": []})
            entry["lat"] += latencies
            entry["cpu"].append(cpu)
    return {key: {**quantiles(v["lat"]), "client_cpu_us_per_request":
                  1e6 * statistics.mean(v["cpu"])} for key, v in results.items()}


# --- part 2: the router's added latency ------------------------------------------------------

async def load(url: str, count: int, concurrency: int) -> dict[str, list[float]]:
    connector = aiohttp.TCPConnector(limit=concurrency)
    ttfb: list[float] = []
    total: list[float] = []
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def one() -> None:
            start = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", data=BODY,
                                    headers=HEADERS) as response:
                first = True
                async for _ in response.content.iter_any():
                    if first:
                        ttfb.append(time.perf_counter() - start)
                        first = False
            total.append(time.perf_counter() - start)

        remaining = iter(range(count))

        async def worker() -> None:
            for _ in remaining:
                await one()

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return {"ttfb": ttfb, "total": total}


def histogram(router: str, phase: str) -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) buckets of the router's added-latency histogram."""
    text = httpx.get(router + "/metrics", timeout=5).text
    pattern = re.compile(
        r'autoglm_router_added_latency_seconds_bucket\{le="([^"]+)",phase="' + phase +
        r'"\} (\S+)')
    return [(float(le), float(v)) for le, v in pattern.findall(text)]


def bucket_quantiles(before: list[tuple[float, float]],
                     after: list[tuple[float, float]]) -> dict[str, float]:
    """Upper bounds of p50 and p99 for the observations between two snapshots."""
    before = before or [(le, 0.0) for le, _ in after]
    buckets = [(le, a - b) for (le, a), (_, b) in zip(after, before, strict=True)]
    count = buckets[-1][1] if buckets else 0.0

    def upper_bound(q: float) -> float:
        return next((le for le, v in buckets if v >= q * count), float("inf"))

    return {"p50_ms_at_most": 1000 * upper_bound(0.5), "p99_ms_at_most": 1000 * upper_bound(0.99)}


def measure_router(upstream: str, router: str, router_pid: int, count: int,
                   own_histogram: bool = True, metrics: str = "") -> dict[str, Any]:
    """Client-measured figures for any router; `own_histogram`: autoglm-router's own too,
    read from `metrics` (its metrics port's base URL)."""
    results: dict[str, Any] = {}
    for concurrency in (1, 100):
        direct = asyncio.run(load(upstream, count, concurrency))
        cpu = cpu_seconds(router_pid)
        before = {phase: histogram(metrics, phase) for phase in PHASES if own_histogram}
        routed = asyncio.run(load(router, count, concurrency))
        router_cpu = cpu_seconds(router_pid) - cpu
        d, r = quantiles(direct["ttfb"]), quantiles(routed["ttfb"])
        results[f"streams@{concurrency}"] = {
            "ttfb_direct": d, "ttfb_router": r,
            "added_ttfb_p50_ms": r["p50_ms"] - d["p50_ms"],
            "added_ttfb_p99_ms": r["p99_ms"] - d["p99_ms"],
            "router_own": {phase: bucket_quantiles(old, histogram(metrics, phase))
                           for phase, old in before.items()},
            "router_cpu_ms_per_request": 1000 * router_cpu / count,
            "router_cpu_us_per_sse_event": 1e6 * router_cpu / (count * SSE_EVENTS),
        }
    results["router_rss_mb"] = rss_mb(router_pid)
    return results


def measure_vllm_router(upstream: str, count: int) -> dict[str, Any]:
    """vllm-router (consistent_hash on X-Session-ID) on the same upstream, the same load."""
    port = free_port()
    process = subprocess.Popen(vllm_router.argv(vllm_router.find_binary(), port, [upstream]),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_listening(url, 120)  # it listens once its first health check of the worker passed
        return measure_router(upstream, url, process.pid, count, own_histogram=False)
    finally:
        process.terminate()
        process.wait(10)


def side_by_side(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """One line per compared figure: ours / vllm-router's."""
    lines = []
    for streams in ("streams@1", "streams@100"):
        for key, title in COMPARED:
            a, b = ours[streams][key], theirs[streams][key]
            lines.append(f"{streams:<12} {title:<24} {a:8.3f} / {b:8.3f}")
    a, b = ours["router_rss_mb"], theirs["router_rss_mb"]
    lines.append(f"{'':<12} {'RSS (MB)':<24} {a:8.1f} / {b:8.1f}")
    return lines


def missed_targets(routed: dict[str, Any]) -> list[str]:
    """The issue's targets, on the router's own histogram at 100 concurrent streams."""
    at_100 = routed["streams@100"]
    checks = [
        (f"{phase} p50 <= 2 ms", at_100["router_own"][phase]["p50_ms_at_most"] <= 2.0)
        for phase in PHASES
    ] + [
        (f"{phase} p99 <= 10 ms", at_100["router_own"][phase]["p99_ms_at_most"] <= 10.0)
        for phase in PHASES
    ] + [
        ("CPU <= 2 ms per request", at_100["router_cpu_ms_per_request"] <= 2.0),
        ("CPU <= 50 us per SSE event", at_100["router_cpu_us_per_sse_event"] <= 50.0),
        ("RSS <= 150 MB", routed["router_rss_mb"] <= 150.0),
    ]
    return [name for name, ok in checks if not ok]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, default=600)
    args = parser.parse_args()
    if args.upstream:
        run_upstream(args.upstream)
        return 0
    up_port, router_port, metrics_port = free_port(), free_port(), free_port()
    upstream = subprocess.Popen([sys.executable, __file__, "--upstream", str(up_port)])
    router = None
    try:
        upstream_url = f"http://127.0.0.1:{up_port}"
        wait_listening(upstream_url)
        clients = compare_clients(upstream_url, args.requests)
        router = subprocess.Popen(
            [sys.executable, "-m", "autoglm_router.cli", "--host", "127.0.0.1", "--port",
             str(router_port), "--metrics-port", str(metrics_port), "--endpoint", upstream_url,
             "--streaming-cap", "1000", "--log-level", "warning"])
        router_url = f"http://127.0.0.1:{router_port}"
        metrics_url = f"http://127.0.0.1:{metrics_port}"
        wait_listening(metrics_url)
        routed = measure_router(upstream_url, router_url, router.pid, args.requests,
                                metrics=metrics_url)
        router.terminate()
        router.wait(10)
        theirs = measure_vllm_router(upstream_url, args.requests)
    finally:
        for process in (router, upstream):
            if process is not None:
                process.terminate()
                process.wait(10)
    missed = missed_targets(routed)
    report = {"cpus": os.cpu_count(), "load_avg": os.getloadavg(), "requests": args.requests,
              "sse_events_per_stream": SSE_EVENTS, "clients": clients, "router": routed,
              "vllm_router": theirs, "targets_missed": missed}
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "router_overhead.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    with results_page("router_overhead"):
        print("autoglm-router / vllm-router, same upstream, same run:")
        print("\n".join(side_by_side(routed, theirs)))
        print("targets missed: " + ", ".join(missed) if missed else "all targets met")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
