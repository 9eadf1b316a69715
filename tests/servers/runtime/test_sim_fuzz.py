"""Fuzz the HTTP surface of sim + middleware: any input gets an answer below 500, none crashes.

Three sources of input: hypothesis over methods, paths, headers and bodies; hypothesis over
requests one change away from a valid one, streamed and not; and a hand-written list of the
inputs random search rarely finds (broken JSON forms, bodies over the limit, broken image data
URLs, odd paths and methods). Every request is counted; the run's summary prints the totals.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from sim_kit import ADMIN_TOKEN, StartSim

from autoglm_api.profiles import DRAIN_PATH, MODE_PATH
from testkit.processes import SimProcess

pytestmark = pytest.mark.timeout(300)

PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
         "/autoglm/v1/mode", "/autoglm/v1/drain", "/v1/responses", "/nope",
         "/v1/chat/completions/x", "/v1/chat/completions?stream=true", "//v1/models",
         "/v1/%63hat/completions", "/v1/chat/completions/", "/%2e%2e/health", "/v1/embeddings"]
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
CONTENT_TYPES = ["application/json", "text/plain", "multipart/form-data",
                 "application/x-www-form-urlencoded", "application/json; charset=utf-16", None]
# Image URLs as clients send them, broken in each way a data URL can be.
IMAGE_URLS = ["data:image/png;base64,AA==", "data:x", "ftp://a", "https://example.invalid/a.png",
              "", "data:image/png;base64,", "data:image/png;base64,!!!!",
              "data:image/png;base64,AAA", "data:image/png,raw-bytes", "data:;base64,AA==",
              "file:///etc/passwd"]
BOUNDARY = "fuzzed runtime HTTP requests (sim + middleware)"
OUTCOME = "answered below 500"
RecordInput = Callable[[str, str, bool], None]
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=4),
    max_leaves=12,
)
FIELDS = ["model", "messages", "prompt", "stream", "max_tokens", "max_completion_tokens",
          "enable_thinking", "return_reasoning", "session_id", "priority", "n", "min_tokens",
          "ignore_eos", "chat_template_kwargs", "include_reasoning", "stream_options", "mode"]
part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "audio", 3])},
                             optional={"text": json_values,
                                       "image_url": st.fixed_dictionaries(
                                           {"url": st.sampled_from(IMAGE_URLS) | json_values})
                                       | json_values})
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", 5])},
    optional={"content": st.text(max_size=50) | st.lists(part, max_size=3) | json_values})
field_values = {
    "model": st.sampled_from(["autoglm-phone-9b", "other"]) | json_values,
    "messages": st.lists(message, max_size=3) | json_values,
    "max_tokens": st.integers(-5, 3000) | json_values,
    "stream": st.booleans() | json_values,
    "mode": st.sampled_from(["streaming", "batching", "x"]) | json_values,
}
bodies = st.dictionaries(
    st.sampled_from(FIELDS), json_values, max_size=6,
).flatmap(lambda base: st.fixed_dictionaries(
    {k: field_values.get(k, st.just(v)) for k, v in base.items()}))


MAX_BODY_BYTES = 1 << 20


@pytest.fixture(scope="module")
def fuzz_sim(start_sim: StartSim) -> Iterator[SimProcess]:
    sim = start_sim("--time-factor", "0.01", config={
        "maxModelLen": 512, "defaultMaxTokens": 64,
        "profiles": {"streaming": {"maxConcurrency": 4, "maxQueue": 8,
                                   "queueTimeoutSeconds": 30}}},
        env={"AUTOGLM_MAX_BODY_BYTES": str(MAX_BODY_BYTES)})
    yield sim
    assert sim.process is not None and sim.process.poll() is None, "the sim died"


def send(record_input: RecordInput, method: str, url: str, content: bytes,
         headers: dict[str, str]) -> httpx.Response:
    """One request, counted: a 5xx (or no answer at all) is a failed case."""
    # Header values as bytes: httpx would refuse to send non-ASCII ones, a server must not.
    raw_headers = {name: value.encode() for name, value in headers.items()}
    try:
        response = httpx.request(method, url, content=content, headers=raw_headers, timeout=30)
    except httpx.HTTPError:
        record_input(BOUNDARY, OUTCOME, False)
        raise
    record_input(BOUNDARY, OUTCOME, response.status_code < 500)
    return response


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    method=st.sampled_from(METHODS),
    path=st.sampled_from(PATHS),
    body=bodies | st.binary(max_size=64),
    token=st.sampled_from([None, ADMIN_TOKEN, "wrong", "x y"]),
    content_type=st.sampled_from(CONTENT_TYPES),
)
# Python's json accepts these non-standard literals; nothing behind it may choke on them.
@example(method="POST", path="/v1/chat/completions", token=None, content_type="application/json",
         body=b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": NaN}')
@example(method="POST", path="/v1/chat/completions", token=None, content_type="application/json",
         body=b'{"messages": [{"role": "user", "content": "x"}], "priority": Infinity}')
@example(method="POST", path="/v1/completions", token=None, content_type="application/json",
         body=b'{"prompt": "x", "max_tokens": 1e400}')
def test_no_5xx(fuzz_sim: SimProcess, record_input: RecordInput, method: str, path: str,
                body: Any, token: str | None, content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = send(record_input, method, fuzz_sim.base_url + path, content, headers)
    event(f"{path} -> {response.status_code}")  # --hypothesis-show-statistics shows the spread
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if (response.status_code >= 400 and path.startswith("/v1/") and method != "HEAD"
            and response.status_code != 404):
        error = response.json().get("error") or response.json()
        assert error, response.text


valid_message = st.fixed_dictionaries({
    "role": st.sampled_from(["user", "system"]),
    "content": st.text(max_size=40) | st.lists(part, min_size=1, max_size=2),
})
overrides = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["autoglm-phone-9b", "autoglm-phone-9b", "other"]) | json_values,
    "messages": st.lists(valid_message, min_size=1, max_size=3) | json_values,
    "max_tokens": st.integers(1, 48) | st.integers(-3, 5000) | json_values,
    "max_completion_tokens": st.integers(-1, 40) | json_values,
    "stream": st.booleans() | json_values,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | json_values,
    "enable_thinking": st.booleans() | json_values,
    "return_reasoning": st.booleans() | json_values,
    "chat_template_kwargs": st.fixed_dictionaries({"enable_thinking": st.booleans()})
    | json_values,
    "session_id": st.text(max_size=20) | json_values,
    "priority": st.integers(-(2**65), 2**65) | json_values,
    "n": st.sampled_from([1, 2]) | json_values,
    "min_tokens": st.integers(-2, 10) | json_values,
    "ignore_eos": st.booleans() | json_values,
    "prompt": st.text(max_size=40) | st.lists(st.integers(0, 100), max_size=5) | json_values,
})


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]), changes=overrides)
def test_requests_near_valid_ones(fuzz_sim: SimProcess, record_input: RecordInput, path: str,
                                  changes: dict[str, Any]) -> None:
    body = {"model": "autoglm-phone-9b", "max_tokens": 16,
            "messages": [{"role": "user", "content": "open the camera"}], "prompt": "hi"}
    body.update(changes)
    response = send(record_input, "POST", fuzz_sim.base_url + path, json.dumps(body).encode(),
                    {"content-type": "application/json"})
    event(f"{path} -> {response.status_code}")
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code == 200 and response.headers["content-type"].startswith(
            "text/event-stream"):
        events = [line for line in response.text.split("\n\n") if line]
        assert events[-1] == "data: [DONE]"
        assert all(json.loads(e[len("data: "):]) for e in events[:-1])
    elif response.status_code == 200:
        assert response.json()["choices"]
    else:
        error = response.json()["error"]
        assert error["message"] and error["code"] == response.status_code


# -- inputs random search rarely builds ----------------------------------------------------------

CHAT = "/v1/chat/completions"


def _chat(stream: bool, content: Any = "open the camera", **fields: Any) -> bytes:
    body = {"model": "autoglm-phone-9b", "max_tokens": 8, "stream": stream,
            "messages": [{"role": "user", "content": content}], **fields}
    return json.dumps(body).encode()


def _image(url: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": "what is on the screen?"},
            {"type": "image_url", "image_url": {"url": url}}]


def _edge_cases(stream: bool) -> list[tuple[str, str, str, bytes, dict[str, str]]]:
    """(id, method, path, body, headers) for one stream setting."""
    json_type = {"content-type": "application/json"}
    huge_text = "x" * (MAX_BODY_BYTES + 1)
    cases: list[tuple[str, str, str, bytes, dict[str, str]]] = [
        # JSON that is not JSON, or not an object
        ("empty-body", "POST", CHAT, b"", json_type),
        ("truncated", "POST", CHAT, _chat(stream)[:-7], json_type),
        ("two-documents", "POST", CHAT, _chat(stream) + _chat(stream), json_type),
        ("array", "POST", CHAT, b"[" + _chat(stream) + b"]", json_type),
        ("string", "POST", CHAT, b'"hi"', json_type),
        ("null", "POST", CHAT, b"null", json_type),
        ("nested-100k-deep", "POST", CHAT, b"[" * 100_000 + b"]" * 100_000, json_type),
        ("nested-object-deep", "POST", CHAT, b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
         json_type),
        ("latin-1-bytes", "POST", CHAT, _chat(stream, "caf\u00e9").replace(b"\\u00e9", b"\xe9"),
         json_type),
        ("byte-order-mark", "POST", CHAT, b"\xef\xbb\xbf" + _chat(stream), json_type),
        ("lone-surrogate", "POST", CHAT, _chat(stream, "\ud800"), json_type),
        ("utf-16-body", "POST", CHAT, _chat(stream).decode().encode("utf-16"),
         {"content-type": "application/json; charset=utf-16"}),
        ("duplicate-keys", "POST", CHAT, _chat(stream)[:-1] + b', "max_tokens": -1}', json_type),
        # wrong types and huge values
        ("messages-an-object", "POST", CHAT, _chat(stream, messages={"role": "user"}), json_type),
        ("content-a-number", "POST", CHAT, _chat(stream, 42), json_type),
        ("max-tokens-10e30", "POST", CHAT, _chat(stream, max_tokens=10**30), json_type),
        ("max-tokens-1e308", "POST", CHAT, _chat(stream, max_tokens=1e308), json_type),
        ("max-tokens-a-string", "POST", CHAT, _chat(stream, max_tokens="8"), json_type),
        ("priority-2e200", "POST", CHAT, _chat(stream, priority=2**200), json_type),
        ("n-a-million", "POST", CHAT, _chat(stream, n=10**6), json_type),
        ("ten-thousand-messages", "POST", CHAT,
         _chat(stream, messages=[{"role": "user", "content": "x"}] * 10_000), json_type),
        ("prompt-over-the-context", "POST", CHAT, _chat(stream, "word " * 20_000), json_type),
        ("body-over-the-limit", "POST", CHAT, _chat(stream, huge_text), json_type),
        ("stream-options-a-list", "POST", CHAT, _chat(stream, stream_options=[1]), json_type),
        ("completions-prompt-of-ints", "POST", "/v1/completions",
         json.dumps({"model": "autoglm-phone-9b", "prompt": [2**64, -1], "stream": stream,
                     "max_tokens": 4}).encode(), json_type),
        # content types
        ("no-content-type", "POST", CHAT, _chat(stream), {}),
        ("form-encoded", "POST", CHAT, b"model=autoglm-phone-9b&stream=true",
         {"content-type": "application/x-www-form-urlencoded"}),
        ("event-stream-type", "POST", CHAT, _chat(stream), {"content-type": "text/event-stream"}),
        # paths and methods
        ("chat-by-get", "GET", CHAT, b"", {}),
        ("chat-by-patch", "PATCH", CHAT, _chat(stream), json_type),
        ("chat-options", "OPTIONS", CHAT, b"", {}),
        ("models-by-post", "POST", "/v1/models", _chat(stream), json_type),
        ("models-head", "HEAD", "/v1/models", b"", {}),
        ("query-string", "POST", CHAT + "?stream=true&model=x", _chat(stream), json_type),
        ("double-slash", "POST", "/v1//chat/completions", _chat(stream), json_type),
        ("encoded-dot-dot", "GET", "/v1/%2e%2e/metrics", b"", {}),
        ("non-ascii-path", "POST", "/v1/ch%C3%A4t/completions", _chat(stream), json_type),
        ("bad-percent-escape", "GET", "/v1/models%zz", b"", {}),
        ("long-path", "GET", "/v1/" + "a" * 8000, b"", {}),
        # the admin API's paths, which the API port does not serve
        ("admin-path-on-the-api-port", "PUT", MODE_PATH, b'{"mode": "batching"}',
         {**json_type, "authorization": f"Bearer {ADMIN_TOKEN}"}),
    ]
    images: list[tuple[str, Any]] = [
        *((f"image-{i}-{url[:20]}", url) for i, url in enumerate(IMAGE_URLS)),
        ("image-huge-base64", "data:image/png;base64," + "A" * (MAX_BODY_BYTES // 2)),
        ("image-url-a-number", 5),
        ("image-url-null", None),
    ]
    for name, url in images:
        cases.append((name, "POST", CHAT, _chat(stream, _image(url)), json_type))
    cases.append(("image-url-a-string", "POST", CHAT,
                  _chat(stream, [{"type": "image_url", "image_url": "data:image/png;base64,AA=="}]),
                  json_type))
    cases.append(("image-part-without-url", "POST", CHAT,
                  _chat(stream, [{"type": "image_url"}]), json_type))
    return [(f"{name}-{'stream' if stream else 'whole'}", *rest) for name, *rest in cases]


EDGE_CASES = _edge_cases(stream=True) + _edge_cases(stream=False)


@pytest.mark.parametrize(("method", "path", "body", "headers"), [c[1:] for c in EDGE_CASES],
                         ids=[c[0] for c in EDGE_CASES])
def test_edge_input_gets_a_4xx_or_an_answer(fuzz_sim: SimProcess, record_input: RecordInput,
                                            method: str, path: str, body: bytes,
                                            headers: dict[str, str]) -> None:
    response = send(record_input, method, fuzz_sim.base_url + path, body, headers)
    assert response.status_code < 500, (response.status_code, response.text[:300])
    # An unknown route or method is the web framework's plain 404/405, as in vLLM itself.
    if response.status_code in (404, 405) or method == "HEAD":
        return
    if response.status_code >= 400 and path.startswith("/v1/"):
        error = response.json()["error"]
        assert error["message"] and error["code"] == response.status_code, response.text


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    method=st.sampled_from(METHODS),
    path=st.sampled_from([MODE_PATH, DRAIN_PATH, MODE_PATH + "/", "/", "/health", "/nope"]),
    body=bodies | st.binary(max_size=64),
    token=st.sampled_from([None, ADMIN_TOKEN, "wrong", "x y"]),
    content_type=st.sampled_from(CONTENT_TYPES),
)
@example(method="PUT", path=MODE_PATH, token=ADMIN_TOKEN, content_type="application/json",
         body={"mode": ["batching"]})
@example(method="PUT", path=MODE_PATH, token=ADMIN_TOKEN, content_type="application/json",
         body=b'{"mode": "' + b"b" * 100_000 + b'"}')
@example(method="PUT", path=MODE_PATH, token="t\u00f6ken", content_type="application/json",
         body={"mode": "batching"})
def test_the_admin_port_answers_below_500(fuzz_sim: SimProcess, record_input: RecordInput,
                                          method: str, path: str, body: Any, token: str | None,
                                          content_type: str | None) -> None:
    if path == DRAIN_PATH and token == ADMIN_TOKEN:
        token = "wrong"  # draining would end the fuzz: drain is covered elsewhere
    headers = {"content-type": content_type} if content_type else {}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = send(record_input, method, fuzz_sim.admin_url + path, content, headers)
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if method != "HEAD":
        assert response.json()["error" if response.status_code >= 400 else "mode"], response.text


def test_the_sim_answers_after_the_fuzz(fuzz_sim: SimProcess) -> None:
    """Nothing above left it wedged: a plain request still streams to [DONE]."""
    response = httpx.post(fuzz_sim.base_url + CHAT, content=_chat(True), timeout=30,
                          headers={"content-type": "application/json"})
    assert response.status_code == 200
    assert response.text.rstrip().endswith("data: [DONE]")
