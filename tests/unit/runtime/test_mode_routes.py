"""Which routes reach the engine, at what priority, for whom: the route table of
docs/runtime/requests.md, row by row, and the header and key rules every request passes first."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from asgi_kit import FakeEngine, MakeClient

from autoglm_runtime.routes import ADMITTED_PATHS, REFUSED_PREFIXES, REFUSED_ROUTES
from testkit.virtual_time import on_virtual_clock

ROUTES_PAGE = Path(__file__).resolve().parents[3] / "docs" / "runtime" / "requests.md"
_ROW = re.compile(r"^\| `(?P<method>[A-Z]+) (?P<path>/[^`]*)` \| (?P<action>[a-z ]+) \|")
KEY = "client-key"
# A body each admitted route accepts.
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/v1/responses": {"input": "hi"},
}


def route_table() -> list[tuple[str, str, str]]:
    text = ROUTES_PAGE.read_text(encoding="utf-8")
    section = text[text.index("\n## Routes\n"):]
    rows = [m.group("method", "path", "action") for line in section.splitlines()
            if (m := _ROW.match(line))]
    assert len(rows) > 30, "the route table in docs/runtime/requests.md did not parse"
    return rows


def sample(middleware: Any, name: str, labels: dict[str, str] | None = None) -> float:
    """A sample the middleware exports; a name or label it does not export is a failure, not 0."""
    value = middleware.registry.get_sample_value(name, labels or {})
    assert value is not None, f"no sample {name}{labels or ''}"
    return value


def header_names(engine: FakeEngine) -> set[bytes]:
    return {name.lower() for name, _ in engine.headers[-1]}


def test_the_table_lists_every_admitted_and_refused_route() -> None:
    rows = {(path, action) for _, path, action in route_table()}
    assert {(path, "admitted") for path in ADMITTED_PATHS} <= rows
    assert {(path, "refused") for path in REFUSED_ROUTES} <= rows
    refused_paths = {path for path, action in rows if action == "refused"}
    assert all(any(p.startswith(prefix) for p in refused_paths) for prefix in REFUSED_PREFIXES)


@pytest.mark.parametrize("method, path, action", route_table())
async def test_route_table_row(make_client: MakeClient, engine: FakeEngine,
                               method: str, path: str, action: str) -> None:
    middleware, client = make_client()
    body = {**BODIES.get(path, {"model": "autoglm-phone-9b"}), "priority": -100}
    headers = {"X-Vllm-Priority": "-100"}
    response = await client.request(method, path, headers=headers,
                                    json=body if method == "POST" else None)
    if action == "refused":
        assert response.status_code == 404
        error = response.json()["error"]
        assert error["message"].startswith(f"{method} {path} is not served by this runtime: ")
        assert error["type"] == "invalid_request_error" and error["code"] == 404
        assert engine.paths == []
        assert sample(middleware, "autoglm_requests_rejected_total",
                      {"reason": "not_served"}) == 1
        return
    assert response.status_code == 200, response.text
    assert engine.paths == [path]
    assert b"x-vllm-priority" not in header_names(engine)
    admitted = sample(middleware, "autoglm_requests_admitted_total")
    if action == "admitted":
        assert engine.bodies[-1]["priority"] == 1  # streaming mode, not streamed
        assert admitted == 1
    else:
        assert action == "passed on"
        assert admitted == 0
        if method == "POST":
            assert engine.bodies[-1] == body  # untouched


@pytest.mark.parametrize("spelling", ["X-Vllm-Priority", "x-vllm-priority", "X-VLLM-PRIORITY"])
async def test_no_client_priority_header_reaches_vllm(
    make_client: MakeClient, engine: FakeEngine, spelling: str
) -> None:
    """vLLM 0.32 reads `X-Vllm-Priority` before the body: the mode's body value must stand."""
    _, client = make_client()
    headers = [(spelling, "-100"), ("x-vllm-priority", "-7"), ("x-other", "kept")]
    await client.post("/v1/chat/completions", headers=headers,
                      json={**BODIES["/v1/chat/completions"], "stream": True})
    assert b"x-vllm-priority" not in header_names(engine)
    assert b"x-other" in header_names(engine)
    assert engine.bodies[-1]["priority"] == 0  # streaming mode, streamed


async def test_responses_are_admitted_with_the_mode_priority(
    make_client: MakeClient, engine: FakeEngine
) -> None:
    _, client = make_client()
    response = await client.post("/v1/responses", json={"input": "hi", "priority": -100,
                                                        "stream": True})
    assert response.status_code == 200
    assert engine.bodies[-1]["priority"] == 0
    background = await client.post("/v1/responses", json={"input": "hi", "background": True})
    assert background.status_code == 400
    assert background.json()["error"]["param"] == "background"


# --- session_id -------------------------------------------------------------------------------


async def test_session_id_reaches_vllm_as_it_reads_it(make_client: MakeClient,
                                                      engine: FakeEngine) -> None:
    _, client = make_client()
    chat = BODIES["/v1/chat/completions"]
    in_body = await client.post("/v1/chat/completions", json={**chat, "session_id": "s-body"},
                                headers={"x-session-id": "s-vllm"})
    assert engine.bodies[-1]["session_id"] == "s-body"
    assert in_body.headers["x-autoglm-session-id"] == "s-body"
    # vLLM reads its own header itself: it passes through, the body stays without the field.
    vllm_header = await client.post("/v1/completions", json={"prompt": "hi"},
                                    headers={"X-Session-ID": "s-vllm",
                                             "x-autoglm-session-id": "s-project"})
    assert "session_id" not in engine.bodies[-1]
    assert (b"x-session-id", b"s-vllm") in engine.headers[-1]
    assert vllm_header.headers["x-autoglm-session-id"] == "s-vllm"
    # The project's header alone: written into the body, where vLLM looks first.
    project = await client.post("/v1/responses", json={"input": "hi"},
                                headers={"x-autoglm-session-id": "s-project"})
    assert engine.bodies[-1]["session_id"] == "s-project"
    assert project.headers["x-autoglm-session-id"] == "s-project"


@pytest.mark.parametrize("value", [7, ["a"], {"id": "a"}, True])
async def test_a_session_id_that_is_not_a_string_is_a_400(
    make_client: MakeClient, engine: FakeEngine, value: object
) -> None:
    _, client = make_client()
    response = await client.post("/v1/chat/completions",
                                 json={**BODIES["/v1/chat/completions"], "session_id": value})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "session_id"
    assert engine.bodies == []


# --- chat-only switches on completions --------------------------------------------------------


async def test_completions_reach_vllm_without_chat_only_fields(
    make_client: MakeClient, engine: FakeEngine
) -> None:
    _, client = make_client()
    await client.post("/v1/completions", json={"prompt": "hi", "enable_thinking": True,
                                               "return_reasoning": True})
    assert set(engine.bodies[-1]) == {"prompt", "max_tokens", "priority"}


# --- the API key ------------------------------------------------------------------------------


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("method, path", [
    ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/responses"),
    ("GET", "/v1/models"), ("POST", "/v2/rerank"), ("POST", "/inference/v1/generate"),
    ("POST", "/cohere/v2/chat"), ("POST", "/v1/messages"),
])
@pytest.mark.parametrize("headers", [
    {}, bearer("wrong"), {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"},
    {"Authorization": f"Bearer  {KEY}"},  # vLLM takes everything after the first space
])
async def test_without_the_key_vllms_401_comes_before_admission(
    make_client: MakeClient, engine: FakeEngine, method: str, path: str, headers: dict[str, str]
) -> None:
    middleware, client = make_client(vllm_api_key=KEY)
    response = await client.request(method, path, headers=headers,
                                    json=BODIES.get(path, {}) if method == "POST" else None)
    assert response.status_code == 401
    # vLLM 0.32's AuthenticationMiddleware: JSONResponse({"error": "Unauthorized"}, 401).
    assert response.content == b'{"error":"Unauthorized"}'
    assert response.headers["content-type"] == "application/json"
    assert set(response.headers) == {"content-type", "content-length"}
    assert engine.paths == []
    assert sample(middleware, "autoglm_requests_rejected_total", {"reason": "unauthorized"}) == 1
    assert sample(middleware, "autoglm_requests_admitted_total") == 0


@on_virtual_clock  # each sleep returns once the requests have gone as far as they can
async def test_unauthenticated_requests_take_no_slot(make_client: MakeClient,
                                                     engine: FakeEngine) -> None:
    profiles = {"streaming": {"maxConcurrency": 1, "maxQueue": 0, "queueTimeoutSeconds": 1}}
    middleware, client = make_client({"profiles": profiles}, vllm_api_key=KEY)
    engine.release.clear()
    chat = BODIES["/v1/chat/completions"]
    running = asyncio.create_task(client.post("/v1/chat/completions", json=chat,
                                              headers=bearer(KEY)))
    await asyncio.sleep(0.05)
    assert middleware.controller.inflight == 1  # the one slot is taken
    refused = await client.post("/v1/chat/completions", json=chat)
    assert refused.status_code == 401  # not 429: it never reached admission
    engine.release.set()
    assert (await running).status_code == 200
    assert sample(middleware, "autoglm_requests_rejected_total", {"reason": "queue_full"}) == 0


@pytest.mark.parametrize("method, path, headers", [
    ("POST", "/v1/chat/completions", bearer(KEY)),
    ("POST", "/v1/chat/completions", {"Authorization": f"bearer {KEY}"}),
    ("OPTIONS", "/v1/chat/completions", {}),  # CORS preflight, as vLLM lets it through
    ("GET", "/health", {}),
    ("GET", "/metrics", {}),
])
async def test_what_needs_no_key_or_has_it(make_client: MakeClient, engine: FakeEngine,
                                           method: str, path: str,
                                           headers: dict[str, str]) -> None:
    _, client = make_client(vllm_api_key=KEY)
    response = await client.request(method, path, headers=headers,
                                    json=BODIES.get(path) if method == "POST" else None)
    assert response.status_code == 200
    assert engine.paths == [path]


async def test_the_key_comes_from_vllms_own_variable(
    make_client: MakeClient, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    _, client = make_client()
    chat = BODIES["/v1/chat/completions"]
    assert (await client.post("/v1/chat/completions", json=chat)).status_code == 401
    ok = await client.post("/v1/chat/completions", json=chat, headers=bearer(KEY))
    assert ok.status_code == 200


async def test_an_empty_key_means_no_check(
    make_client: MakeClient, engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "")  # vLLM: `[key for key in ... if key]`
    _, client = make_client()
    response = await client.post("/v1/chat/completions", json=BODIES["/v1/chat/completions"])
    assert response.status_code == 200
