"""Session affinity: phone-agent conversations on 4 sims through four ways of routing.

The trace: conversations shaped as the AutoGLM phone agent sends them (testkit.agent): its
system prompt, the same 2.7 KB for every task; the task in the first user message; each step
the whole history (earlier user texts, screenshots stripped, and the answers kept as
`<think>...</think><answer>...</answer>`) plus the current screenshot, so a 12-step
conversation stays under maxModelLen 2048. Steps are streamed and follow each other after the
phone's think time. `--concurrent` conversations run at once (the stated load),
`--conversations` in all. `--session-ids none` (the default) sends no session id, as the
official client does, so the router keys a conversation by its prefix (system prompt and
task); `--session-ids sent` puts one in the body (`session_id`) and the `X-Session-ID` header.

The same trace (same seed) goes through, each time on 4 fresh `testkit.sim` replicas
(prefix caching on, in real time by default: about 70 s a run):
- `autoglm-router` (rule 2: a new conversation placed by consistent hashing with bounded
  loads, `--load-factor` 1.25, its default; its later turns kept where it was placed), and
  `autoglm-router-lf2`, the same with `--load-factor 2`;
- `autoglm-router-2x`: two autoglm-router processes, each turn sent to one of them at random,
  as a Service does when every turn opens a new connection (the worst case for rule 2: a
  router knows only the placements it made itself);
- `random`: the client picks a replica at random for every turn;
- `oracle`, the hindsight oracle: every turn of a conversation goes to one replica, chosen when
  the conversation starts as the replica with the fewest conversations open, then the fewest
  turns still to come (it knows when each conversation ends and how long it is), so affinity
  is perfect and load is as even as whole conversations allow;
- `vllm-router` (vLLM's Rust router from PyPI, `--policy consistent_hash`, keyed by
  `X-Session-ID`; installed by hack/vllm-router-env.sh): with `--session-ids sent` only, since
  it has nothing to key a conversation by otherwise;
- `gie-epp`, the Gateway API Inference Extension's own endpoint picker (testkit.gie; built
  from the Go module proxy by hack/gie-epp.sh) behind real Envoy, as a GIE gateway runs it:
  the local control plane with the InferencePool CRD, the 4 sims as serving pods at their pod
  IPs (the pod runner), the pool the operator publishes for them, and the EPP pointed at that
  pool with its default plugins (its Helm chart's: prefix-cache scorer weight 3, queue and
  KV-cache utilization scorers 2 each, from the sims' scraped vllm:* metrics). The EPP listens
  on every interface, so this row runs in a network namespace of its own with only loopback
  (this script again, `--peer-run`, under `unshare --net`).

Reported per router: prefix-cache hit ratio (the sims' vllm:prefix_cache_hits / _queries, in
tokens), TTFT p50 of second and later turns (client-measured, in sim seconds: divided by the
time factor), and time-averaged in-flight max/mean over the replicas (each replica's
vllm:e2e_request_latency_seconds_sum over the run's wall time is its mean in-flight count,
Little's law). Targets for autoglm-router: hit ratio >= 90% of the oracle's, and its gain in
hit ratio over random >= 80% of the oracle's gain (the shared system prompt is cached on every
replica, which flatters random's plain ratio); its later-turn TTFT p50 reduction vs random >=
80% of the oracle's; max/mean in-flight <= 1.25.
TTFT ties are ties: when the oracle's p50 is within 2% of random's, the TTFT share is reported
`tie` (not resolved by the run) rather than judged. Also printed: the ceiling the sim's
equations give for the TTFT reduction. Exit 1 on a missed target. Writes
out/bench/router_sessions-<session-ids>.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from testkit import agent, gie
from testkit.bench import vllm_router
from testkit.paths import OUT_DIR
from testkit.plots import pyplot
from testkit.processes import RouterProcess, ServerProcess, SimProcess
from testkit.report import results_page
from testkit.sim.model import IMAGE_TOKENS, LatencyModel
from testkit.sim.prefix_cache import BLOCK_TOKENS, block_hashes
from testkit.sim.serve.chat import chat_prompt

MODEL = "autoglm-phone-9b"
REPLICAS = 4
ROUTERS = ("autoglm-router", "autoglm-router-lf2", "autoglm-router-2x", "random", "oracle",
           "vllm-router", "gie-epp")
COLORS = ("tab:blue", "tab:cyan", "tab:purple", "tab:grey", "tab:green", "tab:orange", "tab:red")
PEERS = ("vllm-router", "gie-epp")  # judged against the same targets as ours, for comparison
MAX_TOKENS = 48  # one action: the agent's answers are short
THINK_SECONDS = 1.0  # the phone acts on the answer before the next turn (sim seconds)
SESSION_IDS = ("none", "sent")
APPS = ("settings", "messages", "maps", "camera", "calendar", "music", "mail", "shop")


@dataclass(frozen=True)
class Conversation:
    index: int
    task: str
    turns: int

    @property
    def session_id(self) -> str:
        return f"task-{self.index}"


@dataclass
class TurnResult:
    conversation: int
    turn: int
    ttft: float
    prompt_tokens: int


@dataclass
class RunResult:
    turns: list[TurnResult] = field(default_factory=list)
    errors: int = 0
    wall_seconds: float = 0.0
    replicas: list[dict[str, float]] = field(default_factory=list)
    placements: dict[str, float] = field(default_factory=dict)  # autoglm-router's own counts


def make_trace(seed: int, conversations: int) -> list[Conversation]:
    rng = random.Random(seed)
    return [Conversation(i, f"Task {seed}-{i}: in {rng.choice(APPS)}, "
                            f"{rng.choice(('find', 'open', 'change', 'send'))} item "
                            f"{rng.randrange(1000)} and report back.", rng.randint(4, 12))
            for i in range(conversations)]  # fmt: skip


def screenshot(seed: int, conversation: int, turn: int) -> str:
    payload = base64.b64encode(f"screen {seed} {conversation} {turn}".encode()).decode()
    return "data:image/png;base64," + payload


def messages(seed: int, conv: Conversation, turn: int) -> Any:
    """The agent's system prompt, earlier steps as text with their kept answers, then this
    step's screenshot and text (the task on the first)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": agent.SYSTEM_PROMPT}]
    for earlier in range(turn):
        out += [{"role": "user", "content": agent.step_text(conv.task, earlier)},
                {"role": "assistant", "content": agent.kept_turn(earlier)}]  # fmt: skip
    out.append(agent.user_turn(conv.task, turn, screenshot(seed, conv.index, turn)))
    return out


# --- routing ----------------------------------------------------------------------------------

Picker = Callable[[], str]  # the base URL for a conversation's next turn


class Oracle:
    """Every turn of a conversation on one replica, chosen when it starts: the one with the
    fewest conversations open, then the fewest turns still to come (it knows when each
    conversation ends and how long it is). Perfect affinity, and every replica holds as many
    conversations as whole conversations allow at every moment, not only on the whole run:
    placed by turns to come alone, the oracle's later-turn TTFT was slower than random's."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.open = [0] * len(urls)
        self.remaining = [0] * len(urls)

    def start(self, conv: Conversation) -> Picker:
        home = min(range(len(self.urls)), key=lambda i: (self.open[i], self.remaining[i], i))
        self.open[home] += 1
        self.remaining[home] += conv.turns
        left = [conv.turns]

        def pick() -> str:
            self.remaining[home] -= 1
            left[0] -= 1
            if left[0] == 0:
                self.open[home] -= 1  # its last turn: the conversation ends with it
            return self.urls[home]

        return pick


def policy(name: str, urls: list[str], fronts: list[str], seed: int
           ) -> Callable[[Conversation], Picker]:  # fmt: skip
    """How each turn picks its URL: a replica (random, oracle) or a router in front."""
    if name == "oracle":
        return Oracle(urls).start
    rng = random.Random(seed)
    choices = fronts or urls
    return lambda conv: lambda: rng.choice(choices)


# --- the client -------------------------------------------------------------------------------

async def one_turn(http: aiohttp.ClientSession, url: str, body: dict[str, Any],
                   headers: dict[str, str]) -> tuple[float, str]:  # fmt: skip
    """(seconds to the first content token, the answer's text)."""
    start = time.monotonic()
    ttft: float | None = None
    parts: list[str] = []
    async with http.post(url + "/v1/chat/completions", json=body,
                         headers=headers) as response:
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status}: {await response.text()}")
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            content = choices[0].get("delta", {}).get("content")
            if content:
                ttft = ttft if ttft is not None else time.monotonic() - start
                parts.append(content)
    if ttft is None:
        raise RuntimeError(f"{url}: no content streamed")
    return ttft, "".join(parts)


async def converse(http: aiohttp.ClientSession, seed: int, conv: Conversation, pick: Picker,
                   args: argparse.Namespace, result: RunResult) -> None:  # fmt: skip
    headers = {"X-Session-ID": conv.session_id} if args.session_ids == "sent" else {}
    for turn in range(conv.turns):
        body = {"model": MODEL, "messages": messages(seed, conv, turn), "stream": True,
                "max_tokens": MAX_TOKENS}  # fmt: skip
        if args.session_ids == "sent":
            body["session_id"] = conv.session_id
        try:
            ttft, _ = await one_turn(http, pick(), body, headers)
        except (aiohttp.ClientError, RuntimeError) as error:
            print(f"  conversation {conv.index} turn {turn}: {error}", file=sys.stderr)
            result.errors += 1
            return
        tokens = len(chat_prompt(body).token_ids)
        result.turns.append(TurnResult(conv.index, turn, ttft / args.time_factor, tokens))
        await asyncio.sleep(THINK_SECONDS * args.time_factor)


async def drive(trace: list[Conversation], seed: int, start: Callable[[Conversation], Picker],
                args: argparse.Namespace) -> RunResult:  # fmt: skip
    result = RunResult()
    slots = asyncio.Semaphore(args.concurrent)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)

    async def one(conv: Conversation) -> None:
        async with slots:
            await converse(http, seed, conv, start(conv), args, result)

    began = time.monotonic()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        await asyncio.gather(*(one(conv) for conv in trace))
    result.wall_seconds = time.monotonic() - began
    return result


# --- processes --------------------------------------------------------------------------------

class VllmRouter(ServerProcess):
    kind = "vllm-router"
    binary = ""

    def command(self) -> list[str]:
        return vllm_router.argv(self.binary, self.port, list(self.args))


SIM_CONFIG = {"initialMode": "streaming"}
# The GIE peer's whole row (control plane, pods, EPP, Envoy, the trace) in its namespace.
PEER_RUN_TIMEOUT = 900


def start_sims(folder: Path, time_factor: float) -> list[SimProcess]:
    config = folder / "config.json"
    config.write_text(json.dumps(SIM_CONFIG))
    sims = [SimProcess("--time-factor", str(time_factor), env={
        "AUTOGLM_CONFIG_FILE": str(config), "AUTOGLM_LABELS_FILE": str(folder / f"labels{i}"),
        "AUTOGLM_ADMIN_TOKEN": "sessions-bench"}, log_path=folder / f"sim{i}.log")
        for i in range(REPLICAS)]  # fmt: skip
    with ThreadPoolExecutor(REPLICAS) as pool:
        list(pool.map(lambda sim: sim.start(timeout=60), sims))
    return sims


def warm_up(url: str) -> None:
    """One small request first, so a fresh process's first-request costs stay out of the run."""
    body = json.dumps({"model": MODEL, "prompt": "warm up", "max_tokens": 2}).encode()
    request = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()


def scrape(url: str) -> dict[str, float]:
    """The sim's counters this benchmark reads, summed over their series."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    wanted = {"hits": "vllm:prefix_cache_hits_total", "queries": "vllm:prefix_cache_queries_total",
              "e2e_sum": "vllm:e2e_request_latency_seconds_sum",
              "ttft_sum": "vllm:time_to_first_token_seconds_sum",
              "ttft_count": "vllm:time_to_first_token_seconds_count"}  # fmt: skip
    out = dict.fromkeys(wanted, 0.0)
    for key, name in wanted.items():
        for match in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M):
            out[key] += float(match.group(1))
    return out


def router_placements(url: str) -> dict[str, float]:
    """The router's session placements (hit, moved, new) and bounded decisions: why turns
    left their session's replica."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for label, name in (("placement", "autoglm_router_session_placements_total"),
                        ("reason", "autoglm_router_decisions_total")):
        for match in re.finditer(rf'^{name}{{{label}="(\w+)"}} (\S+)$', text, re.M):
            out[f"turns_{match.group(1)}"] = float(match.group(2))
    return out


def measure(name: str, urls: list[str], fronts: list[str], trace: list[Conversation], seed: int,
            args: argparse.Namespace) -> RunResult:  # fmt: skip
    """The trace through `fronts` (or straight to the replicas), and what the replicas counted."""
    for url in urls:
        warm_up(url)
    before = [scrape(url) for url in urls]
    result = asyncio.run(drive(trace, seed, policy(name, urls, fronts, seed), args))
    result.replicas = [{key: value - old[key] for key, value in scrape(url).items()}
                       for url, old in zip(urls, before, strict=True)]  # fmt: skip
    return result


def run_gie_epp(seed: int, args: argparse.Namespace, folder: Path) -> RunResult:
    """The GIE peer's row: this script again with `--peer-run`, in a network namespace of its
    own (testkit.gie.isolated), with the binaries built beforehand (the namespace has no
    module proxy). Fresh sims, cold caches, as every row."""
    out = folder / "gie-epp.json"
    argv = gie.isolated([sys.executable, __file__, "--peer-run", str(out), "--seeds", str(seed),
                         "--conversations", str(args.conversations), "--concurrent",
                         str(args.concurrent), "--time-factor", str(args.time_factor),
                         "--session-ids", args.session_ids])  # fmt: skip
    with open(folder / "gie-epp.log", "wb") as log:
        done = subprocess.run(argv, env={**os.environ, **gie.prepare()}, stdout=log,
                              stderr=subprocess.STDOUT, timeout=PEER_RUN_TIMEOUT, check=False)
    if done.returncode != 0 or not out.exists():
        tail = (folder / "gie-epp.log").read_text(errors="replace")[-4000:]
        raise RuntimeError(f"the gie-epp row failed ({done.returncode}):\n{tail}")
    return loaded(json.loads(out.read_text()))


def loaded(saved: dict[str, Any]) -> RunResult:
    """A RunResult from its `dataclasses.asdict` JSON (the peer row's process writes one)."""
    return RunResult(**{**saved, "turns": [TurnResult(**turn) for turn in saved["turns"]]})


def peer_run(args: argparse.Namespace) -> int:
    """`--peer-run OUT`: the gie-epp row of one seed, in the namespace run_gie_epp made."""
    import tempfile

    gie.own_network()
    seed = args.seeds[0]
    trace = make_trace(seed, args.conversations)
    with tempfile.TemporaryDirectory() as folder, gie.epp_pool(
            Path(folder), replicas=REPLICAS, time_factor=args.time_factor,
            runtime_config=SIM_CONFIG) as pool:  # fmt: skip
        result = measure("gie-epp", pool.replicas, [pool.base_url], trace, seed, args)
    Path(args.peer_run).write_text(json.dumps(dataclasses.asdict(result)))
    return 0


def run_one(name: str, trace: list[Conversation], seed: int, args: argparse.Namespace,
            folder: Path) -> RunResult:  # fmt: skip
    """One router on fresh sims (cold caches), the whole trace."""
    if name == "gie-epp":
        return run_gie_epp(seed, args, folder)
    sims = start_sims(folder, args.time_factor)
    fronts: list[ServerProcess] = []
    try:
        urls = [sim.base_url for sim in sims]
        if name.startswith("autoglm-router"):
            factor = "2" if name.endswith("lf2") else "1.25"
            for i in range(2 if name.endswith("2x") else 1):
                fronts.append(RouterProcess(urls, "--log-level", "warning", "--load-factor",
                                            factor, log_path=folder / f"router{i}.log"))
                fronts[-1].start(timeout=30)
        elif name == "vllm-router":
            fronts.append(VllmRouter(*urls, log_path=folder / "vllm-router.log",
                                     wait_healthy=False))
            fronts[-1].start(timeout=60)
            time.sleep(2.0)  # its workers' first health check
        result = measure(name, urls, [front.base_url for front in fronts], trace, seed, args)
        for front in fronts:
            if isinstance(front, RouterProcess):
                for key, count in router_placements(front.ops_url).items():
                    result.placements[key] = result.placements.get(key, 0.0) + count
        return result
    finally:
        for front in fronts:
            front.stop()
        for sim in sims:
            sim.stop()


def summarize(result: RunResult, time_factor: float) -> dict[str, float]:
    hits = sum(r["hits"] for r in result.replicas)
    queries = sum(r["queries"] for r in result.replicas)
    later = [t.ttft for t in result.turns if t.turn > 0]
    in_flight = [r["e2e_sum"] / result.wall_seconds for r in result.replicas]
    return {
        "hit_ratio": hits / queries if queries else 0.0,
        "later_ttft_p50_s": statistics.median(later) if later else float("nan"),
        "first_ttft_p50_s": statistics.median(t.ttft for t in result.turns if t.turn == 0),
        "in_flight_max_over_mean": max(in_flight) / statistics.mean(in_flight),
        "in_flight_mean": statistics.mean(in_flight),
        # The engines' own TTFT (all turns): routing quality without the proxy's own delay.
        "engine_ttft_mean_s": sum(r["ttft_sum"] for r in result.replicas)
        / sum(r["ttft_count"] for r in result.replicas) / time_factor,
        "turns": float(len(result.turns)),
        "errors": float(result.errors),
        "wall_s": result.wall_seconds / time_factor,
        **result.placements,
    }


def ceiling(trace: list[Conversation], seed: int, concurrent: int) -> dict[str, float]:
    """The TTFT reduction the sim's equations allow for a later turn (model.py: preprocess,
    then one prefill step `t0 + t1 b + c_p p + c_img i`), ignoring queueing:
    - `second_turn_vs_cold`: a second turn with its prefix cached vs with nothing cached (the
      article's comparison, its 37%);
    - `later_vs_random`: every later turn with its conversation's prefix cached vs what random
      routing expects (the shared system prompt cached everywhere, the conversation's own
      prefix 1/REPLICAS of the time)."""
    model = LatencyModel()
    decoding = concurrent / REPLICAS / 2  # about half a replica's conversations are decoding

    def ttft(prompt: int, cached: int) -> float:
        return (model.preprocess_seconds(prompt, IMAGE_TOKENS) + model.t0 + model.t1 * decoding
                + model.c_p * (prompt - cached) + model.c_img)  # fmt: skip

    second, later = [], []
    system = [{"role": "system", "content": agent.SYSTEM_PROMPT}]
    shared = set(block_hashes(chat_prompt({"messages": system}).token_ids))
    for conv in trace:
        seen: set[bytes] = set()
        for turn in range(conv.turns):
            ids = chat_prompt({"messages": messages(seed, conv, turn)}).token_ids
            hashes = block_hashes(ids)
            own = leading(hashes, seen | shared, len(ids))
            common = leading(hashes, shared, len(ids))
            if turn == 1:
                second.append(1 - ttft(len(ids), own) / ttft(len(ids), 0))
            if turn > 0:
                expected = common + (own - common) / REPLICAS
                later.append(1 - ttft(len(ids), own) / ttft(len(ids), int(expected)))
            seen |= set(hashes)
    return {"second_turn_vs_cold": statistics.median(second),
            "later_vs_random": statistics.median(later)}


def leading(hashes: list[bytes], cached: set[bytes], prompt: int) -> int:
    count = 0
    while count < len(hashes) and hashes[count] in cached:
        count += 1
    return min(count, (prompt - 1) // BLOCK_TOKENS) * BLOCK_TOKENS


def check(figures: dict[str, dict[str, float]], who: str) -> list[tuple[str, float, float, str]]:
    """(target, measured, required, "met" / "MISSED" / "tie") for one router against the
    oracle and random. TTFT differences within TIE are ties. The TTFT target is met when the
    router's own later-turn p50 gain over random is resolved (beyond TIE) and at least 80% of
    the oracle's, or the router is within TIE of the oracle's p50 while the oracle's gain is
    resolved; with neither gain resolved it is `tie` (not resolved by the run). The oracle has
    perfect affinity, not the best TTFT: on some seeds its p50 is slower than random's."""
    mine, oracle, rand = figures[who], figures["oracle"], figures["random"]
    resolved = TIE * rand["later_ttft_p50_s"]
    oracle_gain = rand["later_ttft_p50_s"] - oracle["later_ttft_p50_s"]
    gain = rand["later_ttft_p50_s"] - mine["later_ttft_p50_s"]
    hit_share = mine["hit_ratio"] / oracle["hit_ratio"] if oracle["hit_ratio"] else 0.0
    oracle_hit_gain = oracle["hit_ratio"] - rand["hit_ratio"]
    hit_gain_share = ((mine["hit_ratio"] - rand["hit_ratio"]) / oracle_hit_gain
                      if oracle_hit_gain > 0 else float("nan"))
    gain_share = gain / oracle_gain if oracle_gain > 0 else float("nan")
    if gain > resolved and gain >= 0.80 * oracle_gain:
        ttft = "met"
    elif oracle_gain <= resolved:
        ttft = "tie"
    elif abs(mine["later_ttft_p50_s"] - oracle["later_ttft_p50_s"]) \
            <= TIE * oracle["later_ttft_p50_s"]:
        ttft = "met"
    else:
        ttft = "MISSED"
    return [
        ("hit ratio / oracle's", hit_share, 0.90, verdict(hit_share >= 0.90)),
        ("hit gain / oracle's", hit_gain_share, 0.80, verdict(hit_gain_share >= 0.80)),
        ("TTFT gain / oracle's", gain_share, 0.80, ttft),
        ("TTFT gain vs random", gain / rand["later_ttft_p50_s"], TIE, ttft),
        ("in-flight max/mean", mine["in_flight_max_over_mean"], 1.25,
         verdict(mine["in_flight_max_over_mean"] <= 1.25)),
        ("errors", mine["errors"], 0.0, verdict(mine["errors"] == 0)),
    ]


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def mean_over_seeds(per_seed: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {name: {key: statistics.mean(run[name][key] for run in per_seed)
                   for key in per_seed[0][name]}
            for name in per_seed[0]}  # fmt: skip


COLUMNS = (("hit_ratio", "hit ratio", "{:.3f}", max), ("later_ttft_p50_s", "TTFT p50 turn>=2",
           "{:.3f} s", min), ("first_ttft_p50_s", "TTFT p50 turn 1", "{:.3f} s", min),
           ("in_flight_max_over_mean", "in-flight max/mean", "{:.3f}", min),
           ("engine_ttft_mean_s", "engine TTFT mean", "{:.3f} s", min))  # fmt: skip
TIE = 0.02  # figures within 2% of each other are printed as ties


def best_of(figures: dict[str, dict[str, float]], key: str, better: Any) -> str:
    values = {name: figures[name][key] for name in figures}
    top = better(values.values())
    tied = [name for name, value in values.items() if abs(value - top) <= TIE * abs(top)]
    return " = ".join(tied) + (" (tie)" if len(tied) > 1 else "")


def report(mean: dict[str, dict[str, float]], checks: dict[str, list[Any]],
           ceil: dict[str, float], args: argparse.Namespace) -> None:  # fmt: skip
    print(f"\n{args.conversations} conversations, {args.concurrent} at once, 4-12 turns, "
          f"{len(args.seeds)} seeds {args.seeds}, time factor {args.time_factor}, session ids "
          f"{args.session_ids} (figures in sim seconds, means over seeds)")
    print(f"{'router':<19}" + "".join(f"{title:>20}" for _, title, _, _ in COLUMNS))
    for name in mean:
        cells = "".join(f"{fmt.format(mean[name][key]):>20}" for key, _, fmt, _ in COLUMNS)
        print(f"{name:<19}{cells}")
    for key, title, _, better in COLUMNS:
        print(f"best {title}: {best_of(mean, key, better)}")
    for who, rows in checks.items():
        print(f"\n{who} vs the targets (oracle's and random's figures from the same trace):")
        for target, measured, required, status in rows:
            sign = "<=" if target.startswith(("in-flight", "errors")) else ">="
            note = " (no gain resolved by the run)" if status == "tie" else ""
            print(f"  {target:<24} {measured:>7.3f} {sign} {required:<5} {status}{note}")
    print(f"\nthe sim's equations, a turn's own prefill only (no queueing): a second turn "
          f"with its prefix cached reaches its first token {ceil['second_turn_vs_cold']:.0%} "
          f"sooner than a cold one (the article: 37%); a later turn "
          f"{ceil['later_vs_random']:.0%} sooner than random routing expects. Measured, oracle "
          f"vs random, TTFT p50 turn>=2: "
          f"{1 - mean['oracle']['later_ttft_p50_s'] / mean['random']['later_ttft_p50_s']:.0%} "
          f"(shorter prefills of others also shorten the steps a turn waits behind)")


def plot(mean: dict[str, dict[str, float]], session_ids: str) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, (key, title, _, _) in zip(axes, (COLUMNS[0], COLUMNS[1], COLUMNS[3]), strict=True):
        names = list(mean)
        ax.bar(names, [mean[name][key] for name in names],
               color=[COLORS[ROUTERS.index(name)] for name in names])
        ax.set_title(title)
        ax.tick_params(axis="x", labelrotation=20)
    axes[2].axhline(1.25, color="red", linewidth=1, label="target 1.25")
    axes[2].legend()
    fig.suptitle(f"Session affinity on 4 sims: phone-agent conversations, session ids "
                 f"{session_ids}")
    fig.tight_layout()
    fig.savefig(OUT_DIR / f"router_sessions-{session_ids}.png", dpi=120)


def main(args: argparse.Namespace) -> int:
    import tempfile

    args.routers = [name for name in ROUTERS
                    if name in args.routers or name in ("random", "oracle")]
    if args.session_ids == "none" and "vllm-router" in args.routers:
        args.routers.remove("vllm-router")  # it keys by X-Session-ID, which is not sent
    if "vllm-router" in args.routers:
        args.vllm_router = VllmRouter.binary = vllm_router.find_binary()
    if args.rejudge:
        saved = json.loads(Path(args.rejudge).read_text())
        args.seeds = saved["seeds"]
        load = saved["load"]
        args.conversations, args.concurrent = load["conversations"], load["concurrent"]
        args.time_factor = load["time_factor"]
        args.session_ids = saved.get("session_ids", "sent")
        return judge(saved["per_seed"], args)
    per_seed: list[dict[str, dict[str, float]]] = []
    for seed in args.seeds:
        trace = make_trace(seed, args.conversations)
        figures = {}
        for name in args.routers:
            with tempfile.TemporaryDirectory() as folder:
                result = run_one(name, trace, seed, args, Path(folder))
            figures[name] = summarize(result, args.time_factor)
            print(f"seed {seed} {name:<19} " + " ".join(
                f"{k}={v:.3f}" for k, v in figures[name].items()), flush=True)  # fmt: skip
        per_seed.append(figures)
    return judge(per_seed, args)


def judge(per_seed: list[dict[str, dict[str, float]]], args: argparse.Namespace) -> int:
    """Means over seeds, the checks, the report, JSON and PNG; 1 when a target is missed."""
    mean = mean_over_seeds(per_seed)
    judged: list[str] = ["autoglm-router", "autoglm-router-lf2", "autoglm-router-2x", *PEERS]
    checks = {who: check(mean, who) for who in judged if who in mean}
    ceil = ceiling(make_trace(args.seeds[0], args.conversations), args.seeds[0], args.concurrent)
    with results_page("router_sessions", run=f"session ids {args.session_ids}"):
        report(mean, checks, ceil, args)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / f"router_sessions-{args.session_ids}.json").write_text(json.dumps({
        "load": {"replicas": REPLICAS, "conversations": args.conversations,
                 "concurrent": args.concurrent, "turns": [4, 12], "max_tokens": MAX_TOKENS,
                 "think_seconds": THINK_SECONDS, "time_factor": args.time_factor},
        "session_ids": args.session_ids, "seeds": args.seeds, "per_seed": per_seed,
        "mean": mean, "ceiling": ceil,
        "checks": {who: [dict(zip(("target", "measured", "required", "status"), row, strict=True))
                         for row in rows] for who, rows in checks.items()},
    }, indent=2))  # fmt: skip
    plot(mean, args.session_ids)
    return 0 if all(status != "MISSED" for *_, status in checks.get("autoglm-router", [])) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    # Seed 1 and seeds 8-10 chose the defaults (rule 2's recent load, its 3 s); 2-4 judge them.
    parser.add_argument("--seeds", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--conversations", type=int, default=48)
    parser.add_argument("--concurrent", type=int, default=16)
    # Real time: at 0.2 the four sims' engine loops ran five times as many steps a second and,
    # on two cores, their own CPU contention moved TTFT more than routing does (a few %).
    parser.add_argument("--time-factor", type=float, default=1.0)
    parser.add_argument("--routers", nargs="+", choices=ROUTERS, default=list(ROUTERS),
                        help="a subset to run (random and oracle are always run: the targets "
                        "are judged against them)")
    parser.add_argument("--session-ids", choices=SESSION_IDS, default="none",
                        help="none: as the official agent sends (keyed by its prefix); sent: "
                        "session_id in the body and X-Session-ID")
    parser.add_argument("--rejudge", metavar="JSON",
                        help="judge a saved run's per-seed figures again (no run)")
    # The gie-epp row's own process, in its network namespace; not for direct use.
    parser.add_argument("--peer-run", metavar="OUT", help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    sys.exit(peer_run(parsed) if parsed.peer_run else main(parsed))
