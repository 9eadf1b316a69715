"""The demand path under attack from both ends (docs/operations/scale-to-zero.md).

A compromised router answers the operator's read of its report (`RouterReader`, the operator's
side of GET /autoglm/v1/demand) with hostile bytes: each answer counts as no report (the router
is silent, and a silent router keeps nothing awake), the read never raises and ends within its
timeout. And hostile clients send the router's ops port what its demand path must refuse.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType

import pytest
from abuse_kit import (
    MIB,
    RecordingReplica,
    RouterProcess,
    StartRouter,
    closed_within,
    exchange,
    read_reply,
)
from abuse_kit import request as raw_request

from autoglm_api.standby import (
    DEMAND_PATH,
    Activity,
    Reading,
    RouterReport,
    activity_of,
    decode_report,
)
from autoglm_operator.io.router_client import RouterReader
from testkit.processes import free_port
from testkit.waiting import TIME_SCALE

pytestmark = pytest.mark.timeout(60)

RecordInput = Callable[[str, str, bool], None]
MAX_COUNT = 8  # what the router may hold or relay at all
ROUTER_POD = ("phone-9b-router-abc", "127.0.0.1")
VALID = RouterReport(holding=1, held_for=2.5, inflight=3, idle_for=0.5, last_wait=1.0)
# The read's bound: its timeout (READ_TIMEOUT_SECONDS, 1 s) with room for a loaded machine.
READ_BOUND_SECONDS = 2.0 * TIME_SCALE
STALE_AFTER_SECONDS = 181.0  # hold.waitSeconds + 1 s, the operator's default
# Elsewhere on the pod network: where a compromised router would send the operator's GET.
ELSEWHERE = "127.0.0.9"


# --- a compromised router's ops port ------------------------------------------------------------


Respond = Callable[["FakeRouter", asyncio.StreamWriter], Awaitable[None]]


@dataclass
class FakeRouter:
    """An ops port that reads each request's head and answers with whatever `respond` writes,
    as raw bytes: framing a real HTTP server would refuse to send is part of the attack."""

    respond: Respond
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    requests: int = 0
    written: int = 0  # body bytes the reader took before it hung up
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def __aenter__(self) -> FakeRouter:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            await self.respond(self, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the reader hung up: what the attack is meant to cause
        except asyncio.CancelledError:
            pass  # the test is over (the task is start_server's own: nothing awaits it)
        finally:
            writer.close()

    async def send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()


def head(status: int = 200, length: int | None = None, content_type: str = "application/json",
         extra: str = "") -> bytes:
    framing = f"Content-Length: {length}\r\n" if length is not None else ""
    return (f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n{framing}{extra}"
            "\r\n").encode()


def answer(body: bytes, status: int = 200, content_type: str = "application/json") -> Respond:
    async def respond(router: FakeRouter, writer: asyncio.StreamWriter) -> None:
        await router.send(writer, head(status, len(body), content_type) + body)
    return respond


def report(**fields: object) -> bytes:
    """A report's JSON with `fields` over a valid one's; NaN and Infinity as Python writes them."""
    base = json.loads(VALID.encode())
    return json.dumps({**base, **fields}).encode()


def flood(prefix: bytes, size: int, pause: float = 0.0) -> Respond:
    """`prefix`, then spaces up to `size` bytes in 64 KiB writes (after `pause` seconds)."""
    async def respond(router: FakeRouter, writer: asyncio.StreamWriter) -> None:
        await router.send(writer, head(200, size) + prefix)
        await asyncio.sleep(pause)
        chunk = b" " * 65536
        left = size - len(prefix)
        while left > 0:
            await router.send(writer, chunk[:left])
            router.written += min(left, len(chunk))
            left -= len(chunk)
    return respond


def silent(sends: bytes = b"") -> Respond:
    """Sends `sends` (nothing: not even a status line), then never another byte."""
    async def respond(router: FakeRouter, writer: asyncio.StreamWriter) -> None:
        if sends:
            await router.send(writer, sends)
        await asyncio.Event().wait()
    return respond


def drip(data: bytes, every: float = 0.05) -> Respond:
    """A head that promises a 1 MiB report, then `data` a byte at a time, then spaces, for
    ever: never a whole answer."""
    async def respond(router: FakeRouter, writer: asyncio.StreamWriter) -> None:
        await router.send(writer, head(200, MIB))
        for byte in data + b" " * MIB:
            await router.send(writer, bytes([byte]))
            await asyncio.sleep(every)
    return respond


def redirect(to: str) -> Respond:
    async def respond(router: FakeRouter, writer: asyncio.StreamWriter) -> None:
        await router.send(writer, head(302, 0, extra=f"Location: {to}\r\n"))
    return respond


async def hang_up(router: FakeRouter, writer: asyncio.StreamWriter) -> None:
    sock = writer.transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()  # an RST, no answer


async def long_header(router: FakeRouter, writer: asyncio.StreamWriter) -> None:
    body = VALID.encode()
    await router.send(writer, head(200, len(body), extra=f"X-Pad: {'a' * 100 * 1024}\r\n") + body)


async def cut_short(router: FakeRouter, writer: asyncio.StreamWriter) -> None:
    body = VALID.encode()
    await router.send(writer, head(200, len(body)) + body[:20])  # then the close


def nested(depth: int) -> bytes:
    """A report with a field `depth` arrays deep (within the size limit at depth ~2000)."""
    return (b'{"holding":0,"inflight":0,"x":' + b"[" * depth + b"]" * depth + b"}")


# Each a router's answer that must count as no report.
HOSTILE: dict[str, Respond] = {
    # Size: a JSON string 100 MB long, cut at any length; and a valid report padded with JSON
    # whitespace to 100 MB, in one stream (valid JSON if read whole: only the size refuses it).
    "a 100 MB body": flood(b'{"holding":0,"inflight":0,"x":"', 100 * 1000 * 1000),
    "a report padded to 100 MB": flood(VALID.encode(), 100 * 1000 * 1000),
    "a report, then 100 MB of padding a moment later": flood(VALID.encode(),
                                                              100 * 1000 * 1000, pause=0.2),
    "nested 100,000 deep (over the size limit)": answer(nested(100_000)),
    "nested 2,000 deep (within the size limit)": answer(nested(2000)),
    # Ages: JSON's own and Python's extensions; counts: beyond the bound, of the wrong type.
    "NaN held age": answer(report(heldForSeconds=float("nan"))),
    "Infinity idle age": answer(report(idleForSeconds=float("inf"))),
    "-Infinity last wait": answer(report(lastWaitSeconds=float("-inf"))),
    "1e999 held age": answer(VALID.encode().replace(b'"heldForSeconds":2.5',
                                                      b'"heldForSeconds":1e999')),
    "a negative held age": answer(report(heldForSeconds=-5.0)),
    "a negative idle age": answer(report(idleForSeconds=-0.001)),
    "an age as a string": answer(report(heldForSeconds="2.5")),
    "an age as true": answer(report(idleForSeconds=True)),
    "holding above the bound": answer(report(holding=MAX_COUNT + 1)),
    "inflight of a billion": answer(report(inflight=10**9)),
    "a negative count": answer(report(inflight=-1)),
    "holding as true": answer(report(holding=True)),
    "inflight as 1.0": answer(report(inflight=1.0)),
    "holding as a string": answer(report(holding="1")),
    "a count of 2**64": answer(report(holding=2**64)),
    "holding with no held age": answer(report(holding=2, heldForSeconds=None)),
    "no holding field": answer(b'{"inflight":0}'),
    # Not a report at all.
    "an empty body": answer(b""),
    "a JSON array": answer(b"[0, 0]"),
    "JSON null": answer(b"null"),
    "not JSON": answer(b"holding=5&inflight=5"),
    "invalid UTF-8": answer(b'{"holding":0,"inflight":0,"x":"\xff\xfe"}'),
    # Status and framing.
    "a 500 with a valid report": answer(VALID.encode(), 500),
    "a 204": answer(b"", 204),
    "accepts and never answers": silent(),
    "a status line, then nothing": silent(b"HTTP/1.1 200 OK\r\n"),
    "a slow drip of a report": drip(VALID.encode()),
    "a header line of 100 KiB": long_header,
    "not HTTP": silent(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"),
    "a reset instead of an answer": hang_up,
    "a Content-Length past the body, then a close": cut_short,
}


async def read_report(router: FakeRouter) -> tuple[dict[str, Reading], float]:
    """The operator's read of `router`, as the reconcile pass makes it, and the seconds it
    took; a read that raises fails the test (it would end the pass)."""
    reader = RouterReader(router.port)
    started = time.monotonic()
    try:
        readings = await reader.read([ROUTER_POD], MAX_COUNT)
    except Exception as exc:
        pytest.fail(f"the read raised {exc!r}")
    finally:
        await reader.close()
    return dict(readings), time.monotonic() - started


async def test_a_valid_report_is_read(record_input: RecordInput) -> None:
    """The positive control: the same reader and server give a reading when the answer is a
    report, so the silences below are the answers' doing."""
    async with FakeRouter(answer(VALID.encode())) as router:
        readings, took = await read_report(router)
    assert list(readings) == [ROUTER_POD[0]], readings
    assert readings[ROUTER_POD[0]].report == VALID
    assert took < READ_BOUND_SECONDS


def assert_silent(case: str, readings: dict[str, Reading], took: float,
                  record_input: RecordInput) -> None:
    """No reading, in bounded time; and so nothing wakes the deployment or keeps it awake."""
    ignored = readings == {}
    record_input("operator's read of a router's demand report", "ignored", ignored)
    assert ignored, f"{case}: read as {readings}"
    assert took < READ_BOUND_SECONDS, f"{case}: the read took {took:.2f}s"
    activity = activity_of(list(readings.values()), time.time(), STALE_AFTER_SECONDS)
    assert activity == Activity() and not activity.busy


@pytest.mark.parametrize("case", list(HOSTILE))
async def test_a_hostile_report_counts_as_silence(case: str, record_input: RecordInput) -> None:
    async with FakeRouter(HOSTILE[case]) as router:
        readings, took = await read_report(router)
    if "100 MB" in case:
        print(f"{case}: the reader hung up after {router.written / MIB:.1f} MiB of padding "
              "was written (socket buffers included)")
        assert router.written < 50 * MIB
    assert_silent(case, readings, took, record_input)


async def test_a_redirect_to_another_address_is_not_followed(record_input: RecordInput) -> None:
    """A compromised router would send the operator's GET anywhere on the pod network, and
    pass another server's answer off as its own report."""
    async with FakeRouter(answer(VALID.encode()), host=ELSEWHERE) as elsewhere:
        target = f"http://{ELSEWHERE}:{elsewhere.port}{DEMAND_PATH}"
        async with FakeRouter(redirect(target)) as router:
            readings, took = await read_report(router)
    assert router.requests == 1
    assert elsewhere.requests == 0, "the operator followed the redirect"
    assert_silent("a 302 to another address", readings, took, record_input)


async def test_a_valid_report_with_another_content_type_is_read() -> None:
    """Accepted: the bytes are decoded and checked whatever the header says, so refusing a
    text/plain report would add no safety, only a way for a proxy's rewrite to blind the
    operator."""
    async with FakeRouter(answer(VALID.encode(), content_type="text/html")) as router:
        readings, _ = await read_report(router)
    assert [r.report for r in readings.values()] == [VALID]


# --- hostile clients at the router's demand path ------------------------------------------------


@pytest.fixture(scope="module")
def router(start_router: StartRouter, recorder: RecordingReplica) -> RouterProcess:
    return start_router([recorder.base_url])


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_a_write_to_the_demand_path_gets_405_before_its_body_is_read(
    router: RouterProcess, method: str, record_input: RecordInput
) -> None:
    """A 100 MiB body announced, 64 KiB of it sent: the answer comes at once and the router
    closes the connection instead of reading the rest."""
    with socket.create_connection(("127.0.0.1", router.metrics_port), timeout=5) as sock:
        sock.sendall(f"{method} {DEMAND_PATH} HTTP/1.1\r\nHost: x\r\n"
                     f"Content-Length: {100 * MIB}\r\n\r\n".encode() + b"x" * 65536)
        started = time.monotonic()
        reply = read_reply(sock, 5)
        took = time.monotonic() - started
        refused = reply.status == 405 and reply.headers.get("allow") == "GET"
        record_input("router's ops port, the demand path", "refused", refused)
        assert refused, reply
        assert took < 1.0 * TIME_SCALE, took
        assert closed_within(sock, 2 * TIME_SCALE), "the router kept reading the body"


ODD_TARGETS = [
    # (raw request-target, status): what is not the demand path exactly is no route.
    ("/autoglm/v1/demand/", 404),
    ("/autoglm/v1/DEMAND", 404),
    ("//autoglm/v1/demand", 404),
    ("/autoglm/v1/../v1/demand", 404),
    ("/autoglm/v1/demand%00", 404),
    ("/autoglm/v1/demand/../../../metrics", 404),
    ("*", 404),
]


@pytest.mark.parametrize(("target", "status"), ODD_TARGETS)
def test_odd_targets_near_the_demand_path_get_no_report(
    router: RouterProcess, target: str, status: int, record_input: RecordInput
) -> None:
    reply = exchange(router.metrics_port, raw_request("GET", target))
    record_input("router's ops port, the demand path", "refused", reply.status == status)
    assert reply.status == status, reply
    assert b"holding" not in reply.body


def test_the_demand_path_answers_a_report_to_get_and_head(router: RouterProcess) -> None:
    """The positive control: the path the odd targets miss answers a report; HEAD no body."""
    got = exchange(router.metrics_port, raw_request("GET", DEMAND_PATH))
    assert got.status == 200 and decode_report(got.body, MAX_COUNT) is not None, got
    headed = exchange(router.metrics_port, raw_request("HEAD", DEMAND_PATH))
    assert headed.status == 200 and headed.body == b"", headed


def test_the_demand_path_is_not_on_the_api_port(router: RouterProcess,
                                                recorder: RecordingReplica) -> None:
    before = len(recorder.forwarded())
    assert exchange(router.port, raw_request("GET", DEMAND_PATH)).status == 404
    assert len(recorder.forwarded()) == before
