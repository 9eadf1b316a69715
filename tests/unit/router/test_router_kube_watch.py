"""The pod watch against a scripted apiserver: list, watch from the list's version, go on after
a closed watch, back off after an error, list again after 410 Gone."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from autoglm_api.profiles import Mode
from autoglm_router.kube import ApiAccess, KubernetesDiscovery
from testkit.waiting import eventually_async

pytestmark = pytest.mark.timeout(30)


def pod(name: str, mode: str, version: str, ip: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": version,
                     "labels": {"autoglm.io/mode": mode}},
        "spec": {"containers": [{"name": "runtime",
                                 "ports": [{"name": "http", "containerPort": 8000}]}]},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


class FakeApi:
    """Lists `pods` at `version`; each watch request plays the next step of `script`."""

    def __init__(self) -> None:
        self.pods = [pod("a", "streaming", "10", "10.1.0.1")]
        self.version = "10"
        self.script: list[tuple[int, list[dict[str, Any]]]] = []
        self.list_versions: list[str] = []
        self.watch_versions: list[str] = []
        self.tokens: set[str] = set()
        self.closing = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.tokens.add(request.headers.get("Authorization", ""))
        assert request.query["labelSelector"] == "app.kubernetes.io/instance=demo"
        if "watch" not in request.query:
            self.list_versions.append(self.version)
            return web.json_response({"kind": "PodList", "items": self.pods,
                                      "metadata": {"resourceVersion": self.version}})
        assert request.query["allowWatchBookmarks"] == "true"
        self.watch_versions.append(request.query["resourceVersion"])
        # With the script played, the watch stays open and quiet until the test ends.
        if not self.script:
            await self.closing.wait()
        status, events = self.script.pop(0) if self.script else (200, [])
        if status != 200:
            return web.json_response({"kind": "Status", "code": status}, status=status)
        response = web.StreamResponse()
        await response.prepare(request)
        for event in events:
            # Split each line in two writes: lines must be joined across chunks.
            line = json.dumps(event).encode() + b"\n"
            await response.write(line[:7])
            await response.write(line[7:])
        return response  # the apiserver ends the watch (its timeoutSeconds)


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeApi, str]]:
    fake = FakeApi()
    app = web.Application()
    app.router.add_get("/api/v1/namespaces/serving/pods", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield fake, f"http://127.0.0.1:{port}"
    fake.closing.set()
    await runner.cleanup()


async def test_watch_goes_on_after_close_error_and_gone(api: tuple[FakeApi, str]) -> None:
    fake, server = api
    flip = pod("a", "batching", "11", "10.1.0.1")
    fake.script = [
        (200, [{"type": "MODIFIED", "object": flip},
               {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}]),
        (500, []),  # reconnect after a backoff, from the last version seen
        (200, [{"type": "ERROR", "object": {"kind": "Status", "code": 410}}]),  # list again
    ]
    watch = KubernetesDiscovery(ApiAccess(server, token="tok"), "serving",
                                "app.kubernetes.io/instance=demo", "http")
    await watch.start()
    try:
        assert [(e.name, e.mode) for e in watch.endpoints()] in (
            [("http://10.1.0.1:8000", Mode.STREAMING)], [("http://10.1.0.1:8000", Mode.BATCHING)])
        await eventually_async(lambda: fake.watch_versions[-1:] == ["15"], 10, every=0.01,
                               what="a watch from the bookmark's version")
        assert watch.endpoints()[0].mode is Mode.BATCHING
        # While the watch is down, b replaces a; the 410 makes the watch list again.
        fake.pods, fake.version = [pod("b", "streaming", "20", "10.1.0.2")], "20"
        await eventually_async(lambda: len(fake.watch_versions) == 4, 10, every=0.01,
                               what="the watch after the list that followed 410 Gone")
        assert fake.watch_versions == ["10", "15", "15", "20"]
        assert fake.list_versions == ["10", "20"]
        assert [(e.name, e.mode) for e in watch.endpoints()] == [
            ("http://10.1.0.2:8000", Mode.STREAMING)]
        assert fake.tokens == {"Bearer tok"}
    finally:
        await watch.stop()


async def test_an_unreachable_replica_is_out_until_its_health_answers(
        api: tuple[FakeApi, str]) -> None:
    fake, server = api
    health = web.Application()
    answers = {"status": 503}
    probes: list[int] = []  # the status each /health probe got

    async def answer(_: web.Request) -> web.Response:
        probes.append(answers["status"])
        return web.Response(status=answers["status"])

    health.router.add_get("/health", answer)
    runner = web.AppRunner(health)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    fake.pods = [pod("a", "streaming", "10", "127.0.0.1")]
    watch = KubernetesDiscovery(ApiAccess(server), "serving", "app.kubernetes.io/instance=demo",
                                port, probe_interval=0.05)
    await watch.start()
    try:
        url = f"http://127.0.0.1:{port}"
        watch.report_unreachable(url)
        watch.report_unreachable("http://10.9.9.9:1")  # not a pod of ours: ignored
        assert [(e.name, e.ready) for e in watch.endpoints()] == [(url, False)]
        # A probe goes out only once the last answer is read: by the third, two 503s were.
        await eventually_async(lambda: len(probes) >= 3, 5, every=0.01, what="3 probes")
        assert not watch.endpoints()[0].ready  # /health still 503
        answers["status"] = 200
        await eventually_async(lambda: watch.endpoints()[0].ready, 5, every=0.01,
                               what="the replica ready")
        # A draining answer holds the address out while its /health fails (a draining runtime
        # answers 503 there) and no longer: a new pod that got a leaving pod's address is used
        # once it answers.
        answers["status"] = 503
        watch.report_draining(url)
        assert watch.endpoints()[0].draining
        answered = len(probes)
        await eventually_async(lambda: len(probes) > answered + 1, 5, every=0.01,
                               what="two probes more")
        assert watch.endpoints()[0].draining
        answers["status"] = 200
        await eventually_async(lambda: not watch.endpoints()[0].draining, 5, every=0.01,
                               what="the address back in use")
    finally:
        await watch.stop()
        await runner.cleanup()
