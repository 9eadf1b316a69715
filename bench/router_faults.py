"""Faults under load: replicas and routers stopped, flipped and killed while clients send.

Everything is a local process on loopback: `testkit.sim` replicas (time factor 0.2) and
`autoglm-router` processes (`--endpoint` discovery, 1 s polls). The clients are raw aiohttp with
no retries of their own: each worker keeps one kept-alive connection and sends one request
after another with a pause of 0-40 ms (so connections also sit idle), alternating streamed and
non-streamed chats of 24 tokens with a session key. A request fails unless it gets 200 and a
whole answer (`data: [DONE]`, or a JSON body with a choice).

Scenarios and the router's fault targets:
- `replica_drained`: 3 sims behind one router; one sim gets SIGTERM (what a pod deletion does:
  the runtime drains, answers 503 `draining` to new requests, finishes the admitted, exits).
  Target: 0 failed.
- `replica_killed`: 2 streaming sims and a batching one behind one router; a streaming one gets
  SIGKILL. A stream it had started cannot be retried (its first bytes reached the client), so
  the target is: failures <= the router's requests open on it at the kill, and 0 failed among
  requests sent after the kill.
- `replica_flips`: 2 sims behind one router; one flips streaming <-> batching every 10 s
  through its admin API (the router learns modes from the `autoglm_mode` gauge). 0 failed.
- `router_sigterm`: 3 sims behind two routers, workers split over both; one router gets
  SIGTERM. The Service is modelled on the client side: a worker that cannot connect (refused:
  the terminating router no longer listens, as kube-proxy stops sending new connections to an
  endpoint it removed) connects to the other router and sends there; nothing that reached a
  router is resent. 0 failed.
- `router_sigkill`: the same, but SIGKILL. The requests in flight on the killed router fail:
  those open when the signal is sent, and those a client sent on its kept-alive connection in
  the moment the process took to die (both counted). Targets: no failure on the other router,
  none among requests sent once the killed one was dead (its sockets closed), and none of those
  sent to it: new requests go to the other router at once.
- `two_routers_balance` (routers that each count only their own requests still balance the
  replicas): 4 streaming sims at time factor 1 (real time, so
  the routers' default 1 s poll), 96-token answers (about 3 s); 16 clients (about 4 requests in
  flight per replica), then 4 (about 1), each through one router, then split evenly over two
  routers, then 3:1. Each router bounds only its own in-flight requests;
  measured is the time-averaged in-flight per replica as the replicas see it (each sim's
  `vllm:e2e_request_latency_seconds_sum` over the wall time, Little's law). Target max/mean
  <= 1.25 for each split.

Writes out/bench/router_faults.json and .png; exit 1 on a missed target. Every process started
is stopped at the end. About 4 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from autoglm_api.profiles import MODE_PATH
from testkit.paths import OUT_DIR
from testkit.plots import pyplot
from testkit.processes import RouterProcess, ServerProcess, SimProcess
from testkit.report import results_page
from testkit.stats import percentile

MODEL = "autoglm-phone-9b"
ADMIN_TOKEN = "faults-bench"
MAX_TOKENS = 24
TIME_FACTOR = 0.2
BALANCE_TARGET = 1.25
# The sims run 5x faster than real time: a 0.2 s poll is the default 1 s one in their time.
POLL_SECONDS = 1.0 * TIME_FACTOR
# Balance is measured in real time (time factor 1, the default 1 s poll) on requests of about
# 3 s, long enough to outlast a poll, with few SSE events so the router and sims stay cheap.
BALANCE_WORKERS = (16, 4)
BALANCE_MAX_TOKENS = 96
BALANCE_SECONDS = 15.0
THINK_SECONDS = 0.02  # a user's mean pause between requests, so connections also sit idle


class Processes:
    """Every sim and router a scenario starts; all stopped when it ends, even on failure."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: list[ServerProcess] = []

    def sims(self, modes: list[str], time_factor: float = TIME_FACTOR) -> list[SimProcess]:
        sims = []
        for i, mode in enumerate(modes):
            config = self.folder / f"config{len(self.started)}-{i}.json"
            config.write_text(json.dumps({"initialMode": mode}))
            sims.append(SimProcess("--time-factor", str(time_factor), env={
                "AUTOGLM_CONFIG_FILE": str(config), "AUTOGLM_ADMIN_TOKEN": ADMIN_TOKEN,
                "AUTOGLM_LABELS_FILE": str(self.folder / f"labels{len(self.started)}-{i}"),
                "AUTOGLM_DRAIN_GRACE_SECONDS": "20",
            }, log_path=self.folder / f"sim{len(self.started)}-{i}.log"))  # fmt: skip
        self.started += sims
        with ThreadPoolExecutor(len(sims)) as pool:
            list(pool.map(lambda sim: sim.start(timeout=60), sims))
        return sims

    def router(self, sims: list[SimProcess], poll_seconds: float = POLL_SECONDS) -> RouterProcess:
        router = RouterProcess([sim.base_url for sim in sims], "--log-level", "warning",
                               "--drain-seconds", "30", "--poll-interval", str(poll_seconds),
                               log_path=self.folder / f"router{len(self.started)}.log")
        self.started.append(router)
        return router.start(timeout=30)

    def stop_all(self) -> None:
        for process in self.started:
            process.stop()


# --- the clients ------------------------------------------------------------------------------

@dataclass
class Sample:
    worker: int
    start: float  # seconds since the load began
    end: float
    router: int  # which front URL the request was sent to
    ok: bool
    error: str = ""
    reconnected: bool = False


@dataclass
class Load:
    """Workers sending back to back to `fronts`; worker w starts on fronts[split(w)]."""

    fronts: list[str]
    workers: int
    seconds: float
    split: Callable[[int], int] = lambda w: 0
    failover: bool = False  # on a refused connection, send to the next front instead
    max_tokens: int = MAX_TOKENS
    samples: list[Sample] = field(default_factory=list)
    open_on: list[set[int]] = field(default_factory=list)  # workers with a request open, by front
    began: float = 0.0

    def now(self) -> float:
        return time.monotonic() - self.began


def body_of(worker: int, i: int, max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": max_tokens, "stream": i % 2 == 0,
            "session_id": f"w{worker}-s{i % 4}",
            "messages": [{"role": "user", "content": f"Worker {worker} step {i}: open settings "
                                                     "and turn on dark mode."}]}


async def send_one(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    """Raises unless the whole answer arrived."""
    async with http.post(url + "/v1/chat/completions", json=body) as response:
        data = await response.read()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {data[:200]!r}")
    if body["stream"] and not data.rstrip().endswith(b"data: [DONE]"):
        raise RuntimeError("stream cut before [DONE]")
    if not body["stream"] and not json.loads(data).get("choices"):
        raise RuntimeError("no choices")


async def worker_loop(load: Load, worker: int) -> None:
    front = load.split(worker)
    think = random.Random(worker)
    i = 0
    connector = aiohttp.TCPConnector(limit=1)  # one kept-alive connection per user
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=60)) as http:
        while load.now() < load.seconds:
            i += 1
            sample = Sample(worker, load.now(), 0.0, front, False)
            load.open_on[front].add(worker)
            try:
                try:
                    await send_one(http, load.fronts[front], body_of(worker, i, load.max_tokens))
                except aiohttp.ClientConnectorError:
                    if not load.failover:
                        raise
                    load.open_on[front].discard(worker)
                    front = sample.router = (front + 1) % len(load.fronts)
                    sample.reconnected = True
                    load.open_on[front].add(worker)
                    await send_one(http, load.fronts[front], body_of(worker, i, load.max_tokens))
                sample.ok = True
            except (aiohttp.ClientError, RuntimeError, TimeoutError, ValueError) as exc:
                sample.error = repr(exc)[:200]
            finally:
                load.open_on[sample.router].discard(worker)
            sample.end = load.now()
            load.samples.append(sample)
            await asyncio.sleep(think.uniform(0.0, 2 * THINK_SECONDS))


async def run_load(load: Load, faults: Callable[[Load], Awaitable[dict[str, Any]]]
                   ) -> dict[str, Any]:  # fmt: skip
    """The load and the scenario's faults side by side; the faults' own figures back."""
    load.open_on = [set() for _ in load.fronts]
    load.began = time.monotonic()
    results = await asyncio.gather(faults(load), *(worker_loop(load, w)
                                                   for w in range(load.workers)))
    return dict(results[0])


def tally(load: Load) -> dict[str, Any]:
    failed = [s for s in load.samples if not s.ok]
    latencies = sorted(s.end - s.start for s in load.samples if s.ok)
    return {"requests": len(load.samples), "failed": len(failed),
            "errors": sorted({s.error for s in failed})[:5],
            "reconnected": sum(s.reconnected for s in load.samples),
            "p50_s": statistics.median(latencies) if latencies else float("nan"),
            "p99_s": percentile(latencies, 0.99) if latencies else float("nan"),
            "per_front": [sum(1 for s in load.samples if s.ok and s.router == f)
                          for f in range(len(load.fronts))]}  # fmt: skip


# --- scenarios --------------------------------------------------------------------------------

async def sleep_until(load: Load, at: float) -> None:
    await asyncio.sleep(max(0.0, at - load.now()))


def replica_drained(procs: Processes) -> tuple[dict[str, Any], Load]:
    sims = procs.sims(["streaming", "batching", "batching"])
    router = procs.router(sims)
    load = Load([router.base_url], workers=12, seconds=10.0)

    async def faults(load: Load) -> dict[str, Any]:
        await sleep_until(load, 3.0)
        sims[1].terminate()
        return {"events": [["SIGTERM replica", 3.0]]}

    figures = asyncio.run(run_load(load, faults))
    figures["drained_exit"] = sims[1].process.wait(30) if sims[1].process else None
    figures["router_retries"] = scrape(router.ops_url, "autoglm_router_retries_total")
    return figures, load


def replica_killed(procs: Processes) -> tuple[dict[str, Any], Load]:
    sims = procs.sims(["streaming", "streaming", "batching"])
    router = procs.router(sims)
    load = Load([router.base_url], workers=12, seconds=10.0)

    async def faults(load: Load) -> dict[str, Any]:
        await sleep_until(load, 3.0)
        open_there = scrape(router.ops_url, "autoglm_router_inflight").get(
            f'replica="{sims[0].base_url}"', 0.0)
        at = load.now()
        assert sims[0].process is not None
        sims[0].process.kill()
        return {"events": [["SIGKILL replica", at]], "in_flight_at_fault": open_there,
                "fault_at_s": at}

    figures = asyncio.run(run_load(load, faults))
    figures["failed_started_after"] = sum(1 for s in load.samples
                                          if not s.ok and s.start > figures["fault_at_s"])
    figures["router_retries"] = scrape(router.ops_url, "autoglm_router_retries_total")
    return figures, load


def replica_flips(procs: Processes) -> tuple[dict[str, Any], Load]:
    sims = procs.sims(["streaming", "batching"])
    router = procs.router(sims)
    load = Load([router.base_url], workers=12, seconds=28.0)

    async def faults(load: Load) -> dict[str, Any]:
        events = []
        mode = "streaming"
        async with aiohttp.ClientSession() as http:
            for at in (5.0, 15.0, 25.0):
                await sleep_until(load, at)
                mode = "batching" if mode == "streaming" else "streaming"
                async with http.put(sims[0].admin_url + MODE_PATH, json={"mode": mode},
                                    headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as r:
                    r.raise_for_status()
                events.append([f"flip to {mode}", at])
        return {"events": events}

    figures = asyncio.run(run_load(load, faults))
    figures["router_retries"] = scrape(router.ops_url, "autoglm_router_retries_total")
    return figures, load


def two_router_fault(procs: Processes, sig: signal.Signals) -> tuple[dict[str, Any], Load]:
    sims = procs.sims(["streaming", "batching", "batching"])
    routers = [procs.router(sims), procs.router(sims)]
    load = Load([r.base_url for r in routers], workers=12, seconds=10.0,
                split=lambda w: w % 2, failover=True)

    async def faults(load: Load) -> dict[str, Any]:
        await sleep_until(load, 3.0)
        assert routers[0].process is not None
        in_flight = len(load.open_on[0])
        at = load.now()
        routers[0].process.send_signal(sig)
        figures = {"events": [[f"{sig.name} router 0", at]], "in_flight_at_fault": in_flight,
                   "fault_at_s": at}
        if sig is signal.SIGKILL:  # when it is gone (its sockets closed), for the counts
            await asyncio.to_thread(routers[0].process.wait)
            figures["dead_at_s"] = load.now()
        return figures

    figures = asyncio.run(run_load(load, faults))
    assert routers[0].process is not None
    figures["router_exit"] = routers[0].process.wait(40)
    at = figures["fault_at_s"]
    later = [s for s in load.samples if s.start > at]
    figures["failed_started_before"] = sum(1 for s in load.samples
                                           if not s.ok and s.start <= at)
    figures["failed_started_after"] = sum(1 for s in later if not s.ok)
    if "dead_at_s" in figures:
        dead = figures["dead_at_s"]
        figures["failed_on_the_other"] = sum(1 for s in load.samples if not s.ok and s.router)
        figures["failed_sent_after_death"] = sum(1 for s in load.samples
                                                 if not s.ok and s.start > dead)
        figures["sent_to_the_dead_one"] = sum(1 for s in load.samples
                                              if s.router == 0 and s.start > dead)
    figures["after_on_router0"] = sum(1 for s in later if s.ok and s.router == 0)
    switched = [s.end - at for s in later if s.reconnected and s.ok]
    figures["first_reconnected_done_after_s"] = min(switched) if switched else None
    return figures, load


def scrape(url: str, name: str) -> dict[str, float]:
    """Each series of one metric, by its label string."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    return {m.group(1) or "": float(m.group(2)) for m in
            re.finditer(rf"^{re.escape(name)}(?:{{([^}}]*)}})? (\S+)$", text, re.M)}


def busy_seconds(sim: SimProcess) -> float:
    return sum(scrape(sim.base_url, "vllm:e2e_request_latency_seconds_sum").values())


def balance(procs: Processes) -> dict[str, Any]:
    sims = procs.sims(["streaming"] * 4, time_factor=1.0)
    routers = [procs.router(sims, poll_seconds=1.0), procs.router(sims, poll_seconds=1.0)]
    fronts = [r.base_url for r in routers]
    splits: dict[str, Callable[[int], int]] = {
        "one router": lambda w: 0, "two routers 1:1": lambda w: w % 2,
        "two routers 3:1": lambda w: int(w % 4 == 3)}
    out: dict[str, Any] = {}
    for workers in BALANCE_WORKERS:
        for name, split in splits.items():
            before = [busy_seconds(sim) for sim in sims]
            load = Load(fronts, workers=workers, seconds=BALANCE_SECONDS, split=split,
                        max_tokens=BALANCE_MAX_TOKENS)
            began = time.monotonic()
            asyncio.run(run_load(load, lambda load: _nothing()))
            wall = time.monotonic() - began
            in_flight = [(busy_seconds(sim) - b) / wall
                         for sim, b in zip(sims, before, strict=True)]
            out[f"{workers} clients, {name}"] = {
                **tally(load), "in_flight_per_replica": in_flight,
                "max_over_mean": max(in_flight) / statistics.mean(in_flight)}
    return out


async def _nothing() -> dict[str, Any]:
    return {}


# --- the run ----------------------------------------------------------------------------------

def checks(figures: dict[str, Any]) -> list[tuple[str, float, str, bool]]:
    """(target, measured, required, met)."""
    kill = figures["router_sigkill"]
    rows = [(f"{name}: failed requests", figures[name]["failed"], "== 0",
             figures[name]["failed"] == 0)
            for name in ("replica_drained", "replica_flips", "router_sigterm")]
    killed = figures["replica_killed"]
    rows += [
        ("replica_killed: failed started after the kill", killed["failed_started_after"],
         "== 0", killed["failed_started_after"] == 0),
        ("replica_killed: failed - in flight on it", killed["failed"] - killed[
            "in_flight_at_fault"], "<= 0", killed["failed"] <= killed["in_flight_at_fault"]),
        ("router_sigkill: failed on the other router", kill["failed_on_the_other"], "== 0",
         kill["failed_on_the_other"] == 0),
        ("router_sigkill: failed, sent once it was dead", kill["failed_sent_after_death"],
         "== 0", kill["failed_sent_after_death"] == 0),
        ("router_sigkill: sent to it once it was dead", kill["sent_to_the_dead_one"], "== 0",
         kill["sent_to_the_dead_one"] == 0),
    ]
    rows += [(f"balance, {split}: in-flight max/mean", row["max_over_mean"],
              f"<= {BALANCE_TARGET}", row["max_over_mean"] <= BALANCE_TARGET)
             for split, row in figures["two_routers_balance"].items()]
    return rows


def run_scenario(name: str, body: Callable[[Processes], Any]) -> Any:
    with tempfile.TemporaryDirectory() as folder:
        procs = Processes(Path(folder))
        try:
            return body(procs)
        finally:
            procs.stop_all()


def main(args: argparse.Namespace) -> int:
    figures: dict[str, Any] = {}
    timelines: dict[str, Load] = {}
    scenarios: dict[str, Callable[[Processes], tuple[dict[str, Any], Load]]] = {
        "replica_drained": replica_drained, "replica_killed": replica_killed,
        "replica_flips": replica_flips,
        "router_sigterm": lambda p: two_router_fault(p, signal.SIGTERM),
        "router_sigkill": lambda p: two_router_fault(p, signal.SIGKILL)}
    for name, body in scenarios.items():
        started = time.monotonic()
        extra, load = run_scenario(name, body)
        figures[name] = {**tally(load), **extra}
        timelines[name] = load
        print(f"{name:<16} {time.monotonic() - started:5.1f} s  " + json.dumps(figures[name]),
              flush=True)
    figures["two_routers_balance"] = run_scenario("balance", balance)
    for split, row in figures["two_routers_balance"].items():
        print(f"balance {split:<16} " + json.dumps(row), flush=True)
    rows = checks(figures)
    print()
    with results_page("router_faults"):
        print("targets:")
        for target, measured, required, met in rows:
            print(f"  {target:<48} {measured:>8.3f} {required:<7} {'met' if met else 'MISSED'}")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "router_faults.json").write_text(json.dumps({
        "load": {"max_tokens": MAX_TOKENS, "time_factor": TIME_FACTOR},
        "figures": figures, "samples": {n: [asdict(s) for s in load.samples]
                                        for n, load in timelines.items()},
        "checks": [dict(zip(("target", "measured", "required", "met"), row, strict=True))
                   for row in rows]}, indent=1))  # fmt: skip
    plot(figures, timelines)
    return 0 if all(met for *_, met in rows) else 1


def plot(figures: dict[str, Any], timelines: dict[str, Load]) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(1, len(timelines) + 1, figsize=(22, 4))
    for ax, (name, load) in zip(axes, timelines.items(), strict=False):
        for ok, color in ((True, "tab:blue"), (False, "tab:red")):
            picked = [s for s in load.samples if s.ok is ok]
            ax.scatter([s.start for s in picked], [s.end - s.start for s in picked], s=4,
                       c=color, label="ok" if ok else "failed")
        for label, at in figures[name]["events"]:
            ax.axvline(at, color="black", linewidth=1)
            ax.annotate(label, (at, 0.98), xycoords=("data", "axes fraction"), rotation=90,
                        fontsize=7, va="top")
        ax.set_title(f"{name}: {figures[name]['failed']} failed")
        ax.set_xlabel("request start (s)")
        ax.set_ylabel("latency (s)")
        ax.legend()
    balance_rows = figures["two_routers_balance"]
    axes[-1].bar(list(balance_rows), [row["max_over_mean"] for row in balance_rows.values()])
    axes[-1].tick_params(axis="x", labelrotation=60, labelsize=7)
    axes[-1].axhline(BALANCE_TARGET, color="red", linewidth=1)
    axes[-1].set_title("time-averaged in-flight max/mean, 4 replicas")
    fig.tight_layout()
    fig.savefig(OUT_DIR / "router_faults.png", dpi=110)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sys.exit(main(parser.parse_args()))
