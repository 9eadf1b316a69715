"""Hostile requests straight to a serving pod (`<name>-streaming`/`-batching` reach it past the
router): image URLs the engine would fetch, bad numbers, sampling fan-out, and what already
held up, against
`testkit.sim` with the mode middleware."""

from __future__ import annotations

import json

import httpx
import pytest
from abuse_kit import exchange, request

from autoglm_api.engine_args import EngineSettings, build_vllm_argv, refused_extra_arg
from testkit.processes import SimProcess

pytestmark = pytest.mark.timeout(60)

CHAT = "/v1/chat/completions"
PNG_1X1 = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4"
           "nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg==")


def chat(*parts: dict[str, object], **extra: object) -> dict[str, object]:
    content = [{"type": "text", "text": "what is on the screen?"}, *parts]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def image(url: str) -> dict[str, object]:
    return {"type": "image_url", "image_url": {"url": url}}


def post(server: SimProcess, body: object, path: str = CHAT, **kwargs: object) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=20, **kwargs)  # type: ignore[arg-type]


def error_of(reply: httpx.Response) -> dict[str, object]:
    error = reply.json()["error"]
    assert isinstance(error, dict)
    return error


# --- the engine fetches whatever image_url names -------------------------------------------------

REFUSED_MEDIA = [
    "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://kubernetes.default.svc/api/v1/secrets",
    "http://my-db.prod.svc.cluster.local:5432/",
    "http://10.0.0.1:2379/v3/kv/range",
    "http://192.168.1.1/",
    "http://172.16.0.1/",
    "http://127.0.0.1:8000/metrics",
    "http://localhost:8000/autoglm/v1/mode",
    "http://[::1]:8000/",
    "http://0x7f000001/",
    "http://2130706433/",
    "file:///etc/passwd",
    "https://example.com/screenshot.png",  # remote, and no domain is allowed by default
]


@pytest.mark.parametrize("url", REFUSED_MEDIA)
def test_an_image_url_the_engine_must_not_fetch_is_a_400(sim: SimProcess, url: str) -> None:
    reply = post(sim, chat(image(url)))
    assert reply.status_code == 400, reply.text
    assert "image_url" in str(error_of(reply)["message"])


def test_more_images_than_the_limit_is_a_400_naming_the_limit(sim: SimProcess) -> None:
    reply = post(sim, chat(*[image(PNG_1X1)] * 1000))
    assert reply.status_code == 400, reply.text
    assert "images per prompt" in str(error_of(reply)["message"])


def test_an_inline_screenshot_is_served(sim: SimProcess) -> None:
    assert post(sim, chat(image(PNG_1X1))).status_code == 200


RENDERING_ROUTES = ["/tokenize", "/detokenize", "/v1/chat/completions/render",
                    "/v1/completions/render", "/v1/responses/render", "/v1/messages/render",
                    "/v1/messages/count_tokens", "/v1/chat/completions/derender"]


@pytest.mark.parametrize("path", RENDERING_ROUTES)
def test_routes_that_render_messages_are_refused_by_the_runtime(sim: SimProcess,
                                                                path: str) -> None:
    reply = post(sim, chat(image("http://169.254.169.254/")), path=path)
    assert reply.status_code == 404
    assert "not served by this runtime" in str(error_of(reply)["message"])


@pytest.mark.parametrize("path", RENDERING_ROUTES)
def test_routes_that_render_messages_need_the_api_key(keyed_sim: SimProcess,
                                                      path: str) -> None:
    reply = post(keyed_sim, chat(), path=path)
    assert reply.status_code == 401 and reply.json() == {"error": "Unauthorized"}


def test_the_engine_is_told_the_media_rules_and_they_cannot_be_overridden() -> None:
    argv = build_vllm_argv(EngineSettings(model="m"))
    assert json.loads(argv[argv.index("--limit-mm-per-prompt") + 1])["image"] >= 1
    assert argv[argv.index("--allowed-media-domains") + 1].endswith(".invalid")
    for arg in ["--limit-mm-per-prompt={\"image\":999}", "--limit-mm-per-prompt.image=999",
                "--limit_mm_per_prompt", "--allowed-media-domains", "--allowed-media=x",
                "--allowed-local-media-path=/", "--allowed_local_media_path",
                "--allowed-l=/"]:
        assert refused_extra_arg(arg) is not None, arg


# --- bad numbers ---------------------------------------------------------------------------------

BAD_NUMBERS = [
    ("max_tokens", b"1" + b"0" * 5000),
    ("max_tokens", b"NaN"),
    ("temperature", b"NaN"),
    ("temperature", b"Infinity"),
    ("top_p", b"-Infinity"),
    ("n", b"9" * 5000),
]


@pytest.mark.parametrize(("field", "value"), BAD_NUMBERS)
def test_a_bad_number_is_a_400_naming_its_field(sim: SimProcess, field: str,
                                                value: bytes) -> None:
    body = (b'{"messages": [{"role": "user", "content": "hi"}], "%s": %s}'
            % (field.encode(), value))
    reply = exchange(sim.port, request("POST", CHAT, body, {"Content-Type": "application/json"}))
    assert reply.status == 400, reply
    assert field in json.loads(reply.body)["error"]["message"]


# --- sampling fan-out ----------------------------------------------------------------------------

FAN_OUT = [("n", 64), ("best_of", 64), ("top_logprobs", 1000), ("logprobs", 1000)]


@pytest.mark.parametrize(("field", "value"), FAN_OUT)
def test_sampling_fan_out_past_its_bound_is_a_400(sim: SimProcess, field: str,
                                                  value: int) -> None:
    extra: dict[str, object] = {field: value}
    if field == "top_logprobs":
        extra["logprobs"] = True
    path = "/v1/completions" if field in ("best_of", "logprobs") else CHAT
    body = {"prompt": "hi", "max_tokens": 4, **extra} if path != CHAT else chat(**extra)
    reply = post(sim, body, path=path)
    assert reply.status_code == 400, reply.text
    assert error_of(reply)["param"] == field


# --- what held up --------------------------------------------------------------------------------

CLEAR_400S = [
    ("deep nesting", b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    ("not UTF-8", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}'),
    # One over the context is lowered to it (the phone agent asks 3000); 41 digits are refused.
    ("absurd max_tokens", b'{"messages": [{"role": "user", "content": "hi"}], '
                          b'"max_tokens": 1' + b"0" * 40 + b"}"),
    ("a prompt larger than the context", json.dumps(
        {"messages": [{"role": "user", "content": "a" * 2_000_000}]}).encode()),
    ("an array body", b'[{"messages": []}]'),
    ("a session id that is not a string", b'{"messages": [{"role": "user", "content": "hi"}], '
                                          b'"session_id": {"a": 1}}'),
    ("a session id too long", json.dumps({"messages": [{"role": "user", "content": "hi"}],
                                          "session_id": "s" * 10_000}).encode()),
]


@pytest.mark.parametrize(("case", "body"), CLEAR_400S)
def test_malformed_requests_get_a_clear_400(sim: SimProcess, case: str, body: bytes) -> None:
    reply = exchange(sim.port, request("POST", CHAT, body, {"Content-Type": "application/json"}))
    assert reply.status == 400, (case, reply)
    assert json.loads(reply.body)["error"]["message"], case


@pytest.mark.parametrize(("extra", "headers"), [
    ({"service_tier": {"tier": "flex"}}, {}),
    ({"service_tier": "x" * 10_000}, {}),
    ({}, {"X-AutoGLM-Traffic-Class": "batch" * 2000}),
    ({}, {"X-AutoGLM-Traffic-Class": "interactive, batch"}),
    ({"service_tier": "priority", "max_tokens": 3000}, {}),
])  # fmt: skip
def test_a_declared_class_or_a_large_budget_is_served_whatever_its_value(
    sim: SimProcess, extra: dict[str, object], headers: dict[str, str]
) -> None:
    """service_tier, X-AutoGLM-Traffic-Class and max_tokens choose a class or are lowered:
    an odd value falls back to the undeclared rule and the request is served, never a 500."""
    reply = post(sim, chat(**extra), headers=headers)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"]
