"""At zero replicas through real Envoy: the picker holds a request within the ext_proc exchange
(the HTTP router's hold queue), asks Envoy for the time it needs, and sends the request on when
a replica comes up; past the hold's bounds the HTTP router's 503 with Retry-After."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from gateway_kit import ADMIN_TOKEN, MODEL, StartGateway, client

from autoglm_router.answers import HOLD_RETRY_AFTER_SECONDS
from testkit.gateway import Gateway, GatewayLimits
from testkit.probe import metric
from testkit.sims import LaterSim, later_sims
from testkit.waiting import TIME_SCALE, eventually

pytestmark = pytest.mark.timeout(90)
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Open the settings."}],
        "max_tokens": 8}
HOLD = ("--hold-queue-size", "8")


@pytest.fixture(scope="module")
def later_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LaterSim]:
    """later_sim(mode, *args): a replica that is not up yet (testkit.sims.later_sims)."""
    with later_sims(tmp_path_factory, {"AUTOGLM_ADMIN_TOKEN": ADMIN_TOKEN}) as make:
        yield make


def held(gateway: Gateway) -> float:
    return metric(gateway.picker.ops_url, "autoglm_router_held_requests")


def post(gateway: Gateway, timeout: float = 30, **transport: Any) -> httpx.Response:
    with httpx.Client(timeout=timeout, transport=httpx.HTTPTransport(**transport)) as http:
        return http.post(gateway.base_url + "/v1/chat/completions", json=CHAT)


class Posted(threading.Thread):
    """A request through the gateway, in a thread: its response or error."""

    def __init__(self, gateway: Gateway, **transport: Any) -> None:
        super().__init__(daemon=True)
        self.gateway, self.transport = gateway, transport
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.response = post(self.gateway, **self.transport)
        except BaseException as exc:  # handed to the test
            self.error = exc

    def result(self, timeout: float = 30) -> httpx.Response:
        self.join(timeout)
        assert not self.is_alive(), "no answer"
        if self.error is not None:
            raise self.error
        assert self.response is not None
        return self.response


class StreamedChat(threading.Thread):
    """A streamed chat through the official client, in a thread: its text."""

    def __init__(self, gateway: Gateway) -> None:
        super().__init__(daemon=True)
        self.gateway = gateway
        self.text = ""
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            stream = client(self.gateway, timeout=60).chat.completions.create(
                model=MODEL, messages=CHAT["messages"], stream=True, max_tokens=8)
            self.text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        except BaseException as exc:  # handed to the test
            self.error = exc

    def result(self, timeout: float = 30) -> str:
        self.join(timeout)
        assert not self.is_alive(), "the chat did not end"
        if self.error is not None:
            raise self.error
        return self.text


@pytest.mark.parametrize("mode", ["FULL_DUPLEX_STREAMED", "BUFFERED"])
def test_a_streamed_chat_at_zero_is_held_then_served_when_a_replica_comes_up(
    gateways: StartGateway, later_sim: LaterSim, mode: str
) -> None:
    sim = later_sim()
    # Envoy's own wait for the picker is 1 s: the hold outlasts it only by the picker's ask.
    gateway = gateways([sim], *HOLD, "--hold-seconds", "60", request_body_mode=mode,
                       message_timeout=1, limits=GatewayLimits(hold_seconds=60))
    chat = StreamedChat(gateway)
    chat.start()
    eventually(lambda: held(gateway) == 1, 10, every=0.05, what="the chat held by the picker")
    time.sleep(1.5)  # past Envoy's message_timeout, still held
    assert held(gateway) == 1 and chat.is_alive()
    sim.start()
    assert chat.result(), "served, not refused"
    assert held(gateway) == 0
    ops = gateway.picker.ops_url
    assert metric(ops, "autoglm_router_hold_seconds_sum") >= 1.5
    assert metric(ops, "autoglm_router_hold_seconds_count") == 1
    stats = gateway.envoy.stats()
    # BUFFERED: Envoy times the body message and takes the picker's ask. Full duplex: Envoy
    # 1.40 times no message while the body streams, and ignores the ask.
    taken = "received" if mode == "BUFFERED" else "ignored"
    assert stats[f"http.gateway.ext_proc.override_message_timeout_{taken}"] == 1
    assert stats["http.gateway.ext_proc.message_timeouts"] == 0
    eventually(lambda: metric(ops, "autoglm_router_inflight") == 0, 3, every=0.05,
               what="nothing in flight at the picker")


def test_a_hold_past_its_bound_gets_the_http_routers_503_with_retry_after(
    gateways: StartGateway, later_sim: LaterSim
) -> None:
    gateway = gateways([later_sim()], *HOLD, "--hold-seconds", "2",
                       limits=GatewayLimits(hold_seconds=2))
    through_gateway = post(gateway)
    direct = httpx.post(gateway.picker.base_url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert through_gateway.status_code == direct.status_code == 503
    assert through_gateway.headers["retry-after"] == direct.headers["retry-after"] \
        == str(HOLD_RETRY_AFTER_SECONDS)
    error = through_gateway.json()["error"]
    assert error["message"].startswith("No replica could take the request within 2")
    assert (error["type"], error["code"]) == (direct.json()["error"]["type"], 503)
    assert float(through_gateway.headers["x-autoglm-held-seconds"]) >= 2
    assert metric(gateway.picker.ops_url, "autoglm_router_hold_overflows_total",
                  reason="timeout") == 2
    assert held(gateway) == 0


def test_without_room_to_wait_envoy_cuts_the_hold_short(
    gateways: StartGateway, later_sim: LaterSim
) -> None:
    """The positive control: with no max_message_timeout Envoy ignores the picker's ask and
    fails the request at its message_timeout (504, BUFFERED); the picker's ticket leaves with
    the stream."""
    gateway = gateways([later_sim()], *HOLD, "--hold-seconds", "20", message_timeout=1,
                       limits=GatewayLimits(hold_seconds=0))
    started = time.monotonic()
    failed = post(gateway)
    took = time.monotonic() - started
    assert failed.status_code == 504 and took < 5 * TIME_SCALE  # the hold was 20 s
    assert b"No replica" not in failed.content  # Envoy's answer, not the picker's
    eventually(lambda: held(gateway) == 0, 3, every=0.05, what="the ticket gone")
    assert gateway.envoy.stats()["http.gateway.ext_proc.override_message_timeout_ignored"] == 1


def test_a_client_that_leaves_while_held_leaves_the_queue(
    gateways: StartGateway, later_sim: LaterSim
) -> None:
    gateway = gateways([later_sim()], *HOLD, "--hold-seconds", "60",
                       limits=GatewayLimits(hold_seconds=60))
    with pytest.raises(httpx.TimeoutException):
        post(gateway, timeout=1.5)
    # Envoy closes the picker's stream with the client's connection: nothing left held.
    eventually(lambda: held(gateway) == 0, 3, every=0.05, what="the ticket gone")
    assert metric(gateway.picker.ops_url, "autoglm_router_requests_total",
                  outcome="client_gone") == 1
    report = httpx.get(gateway.picker.ops_url + "/autoglm/v1/demand", timeout=5).json()
    assert report["holding"] == 0 and report["inflight"] == 0


def test_one_client_cannot_take_the_whole_queue(
    gateways: StartGateway, later_sim: LaterSim
) -> None:
    """Envoy names each client (`source.address`): one client's share of the queue is taken,
    another's is not. Two loopback addresses are two clients."""
    gateway = gateways([later_sim()], "--hold-queue-size", "4", "--hold-per-client", "1",
                       "--hold-seconds", "4", limits=GatewayLimits(hold_seconds=4))
    first = Posted(gateway, local_address="127.0.0.1")
    first.start()
    eventually(lambda: held(gateway) == 1, 10, every=0.05, what="the first request held")
    again = post(gateway, local_address="127.0.0.1")
    assert again.status_code == 503
    assert "as one client may" in again.json()["error"]["message"]
    other = Posted(gateway, local_address="127.0.0.2")
    other.start()
    eventually(lambda: held(gateway) == 2, 10, every=0.05, what="the other client held")
    # Both wait out the hold: the bound's answer, not the client's.
    for posted in (first, other):
        assert "within 4" in posted.result().json()["error"]["message"]
    assert metric(gateway.picker.ops_url, "autoglm_router_hold_overflows_total",
                  reason="client_full") == 1


def test_the_model_list_at_zero_is_answered_and_holds_nothing(
    gateways: StartGateway, later_sim: LaterSim
) -> None:
    gateway = gateways([later_sim()], *HOLD, "--served-model-name", MODEL)
    models = client(gateway).models.list()
    assert [m.id for m in models] == [MODEL]
    assert held(gateway) == 0
    assert metric(gateway.picker.ops_url, "autoglm_router_hold_seconds_count") == 0
    report = httpx.get(gateway.picker.ops_url + "/autoglm/v1/demand", timeout=5).json()
    assert report["holding"] == 0 and report["idleForSeconds"] is None


def test_the_picker_is_ready_at_zero_while_it_holds(
    gateways: StartGateway, later_sim: LaterSim
) -> None:
    gateway = gateways([later_sim()], *HOLD)
    eventually(lambda: gateway.envoy.stats().get("cluster.picker.health_check.success", 0) >= 1,
               5, every=0.1, what="a health check of the picker")
    assert gateway.envoy.stats().get("cluster.picker.health_check.failure", 0) == 0
