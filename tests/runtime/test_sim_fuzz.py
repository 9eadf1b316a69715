"""Fuzz the HTTP surface of sim + middleware: any input gets an answer below 500, none crashes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from sim_kit import ADMIN_TOKEN, StartSim

from autoglm_runtime.sim.process import SimProcess

pytestmark = pytest.mark.timeout(300)

PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
         "/autoglm/v1/mode", "/autoglm/v1/drain", "/v1/responses", "/nope",
         "/v1/chat/completions/x"]
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
                                           {"url": st.sampled_from(
                                               ["data:image/png;base64,AA==", "data:x", "ftp://a",
                                                "https://example.invalid/a.png", ""])})})
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


@pytest.fixture(scope="module")
def fuzz_sim(start_sim: StartSim) -> Iterator[SimProcess]:
    sim = start_sim("--time-factor", "0.01", config={
        "maxModelLen": 512, "defaultMaxTokens": 64,
        "profiles": {"streaming": {"maxConcurrency": 4, "maxQueue": 8,
                                   "queueTimeoutSeconds": 30}}})
    yield sim
    assert sim.process is not None and sim.process.poll() is None, "the sim died"


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
    path=st.sampled_from(PATHS),
    body=bodies | st.binary(max_size=64),
    token=st.sampled_from([None, ADMIN_TOKEN, "wrong", "x y"]),
    content_type=st.sampled_from(["application/json", "text/plain", "multipart/form-data"]),
)
# Python's json accepts these non-standard literals; nothing behind it may choke on them.
@example(method="POST", path="/v1/chat/completions", token=None, content_type="application/json",
         body=b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": NaN}')
@example(method="POST", path="/v1/chat/completions", token=None, content_type="application/json",
         body=b'{"messages": [{"role": "user", "content": "x"}], "priority": Infinity}')
@example(method="POST", path="/v1/completions", token=None, content_type="application/json",
         body=b'{"prompt": "x", "max_tokens": 1e400}')
def test_no_5xx(fuzz_sim: SimProcess, method: str, path: str, body: Any, token: str | None,
                content_type: str) -> None:
    if path == "/autoglm/v1/drain" and token == ADMIN_TOKEN:
        token = "wrong"  # draining would end the fuzz: drain is covered elsewhere
    headers = {"content-type": content_type}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.request(method, fuzz_sim.base_url + path, content=content,
                             headers=headers, timeout=30)
    event(f"{path} -> {response.status_code}")  # --hypothesis-show-statistics shows the spread
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.status_code >= 400 and path.startswith("/v1/") and response.status_code != 404:
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
def test_requests_near_valid_ones(fuzz_sim: SimProcess, path: str, changes: dict[str, Any]) -> None:
    body = {"model": "autoglm-phone-9b", "max_tokens": 16,
            "messages": [{"role": "user", "content": "open the camera"}], "prompt": "hi"}
    body.update(changes)
    response = httpx.post(fuzz_sim.base_url + path, json=body, timeout=30)
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
