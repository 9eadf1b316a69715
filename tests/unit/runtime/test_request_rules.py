from __future__ import annotations

import json

import pytest

from autoglm_api.paths import CHAT_PATH, COMPLETIONS_PATH, RESPONSES_PATH
from autoglm_runtime.requests import (
    RequestError,
    RequestRules,
    SessionHeaders,
    error_body,
    parse_json_object,
    prepare,
)

RULES = RequestRules("autoglm-phone-9b", 2048, 512, 32)


def chat(**extra: object) -> dict[str, object]:
    return {"model": "autoglm-phone-9b", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_defaults_and_priority_in_streaming_mode() -> None:
    streamed = prepare(CHAT_PATH, chat(stream=True, priority=-100), RULES, True)
    plain = prepare(CHAT_PATH, chat(), RULES, True)
    assert streamed.body["max_tokens"] == 512 and streamed.stream
    assert streamed.body["priority"] < plain.body["priority"]  # lower is served first
    assert prepare(CHAT_PATH, chat(stream=True), RULES, False).body["priority"] == 0


def test_langchain_extra_body_maps_onto_vllm() -> None:
    body = prepare(CHAT_PATH, chat(enable_thinking=True, return_reasoning=True,
                                   session_id="abc"), RULES, True)
    assert body.body["chat_template_kwargs"] == {"enable_thinking": True}
    assert body.body["include_reasoning"] is True
    assert "enable_thinking" not in body.body and "return_reasoning" not in body.body
    assert body.body["session_id"] == "abc"  # vLLM 0.32 reads it from the body
    assert body.session_id == "abc"


def test_completions_drop_the_chat_only_switches() -> None:
    """vLLM's CompletionRequest has no chat_template_kwargs nor include_reasoning."""
    body = prepare(COMPLETIONS_PATH, {"prompt": "hi", "enable_thinking": True,
                                      "return_reasoning": False}, RULES, True).body
    assert set(body) == {"prompt", "max_tokens", "priority"}


def test_explicit_chat_template_kwargs_win() -> None:
    body = prepare(CHAT_PATH, chat(enable_thinking=True,
                                   chat_template_kwargs={"enable_thinking": False}), RULES, True)
    assert body.body["chat_template_kwargs"] == {"enable_thinking": False}


def test_max_completion_tokens_means_no_default() -> None:
    body = prepare(CHAT_PATH, chat(max_completion_tokens=7), RULES, True).body
    assert "max_tokens" not in body


@pytest.mark.parametrize("body, headers, session, in_body", [
    # vLLM 0.32: body `session_id` first, then `X-Session-ID`; the project's header after both.
    (chat(session_id="b"), SessionHeaders("v", "p"), "b", "b"),
    (chat(), SessionHeaders("v", "p"), "v", None),
    (chat(session_id=""), SessionHeaders("v", None), "v", ""),
    (chat(), SessionHeaders(None, "p"), "p", "p"),
    (chat(session_id=""), SessionHeaders(None, "p"), "p", "p"),
    (chat(), SessionHeaders(), None, None),
])
def test_session_id_order(body: dict[str, object], headers: SessionHeaders,
                          session: str | None, in_body: str | None) -> None:
    prepared = prepare(CHAT_PATH, body, RULES, True, headers)
    assert prepared.session_id == session
    assert prepared.body.get("session_id") == in_body


def test_responses_get_the_mode_priority_and_refuse_background() -> None:
    body = {"input": "hi", "stream": True, "priority": -100, "session_id": "s"}
    prepared = prepare(RESPONSES_PATH, body, RULES, True)
    assert prepared.body == {"input": "hi", "stream": True, "priority": 0, "session_id": "s"}
    assert prepare(RESPONSES_PATH, {"input": "hi"}, RULES, True).priority == 1
    with pytest.raises(RequestError) as err:
        prepare(RESPONSES_PATH, {"input": "hi", "background": True}, RULES, True)
    assert err.value.param == "background"


@pytest.mark.parametrize("body, param", [
    (chat(model="gpt-4"), "model"),
    (chat(max_tokens=-1), "max_tokens"),
    (chat(max_tokens=0), "max_tokens"),
    (chat(max_tokens="5"), "max_tokens"),
    (chat(max_tokens=True), "max_tokens"),
    (chat(max_completion_tokens=4.5), "max_completion_tokens"),
    (chat(stream="yes"), "stream"),
    ({"messages": []}, "messages"),
    ({"messages": ["hi"]}, "messages"),
    ({"messages": [{"role": "user", "content": "x" * (2048 * 32 + 1)}]}, "messages"),
    (chat(enable_thinking="on"), "enable_thinking"),
    (chat(session_id=["a"]), "session_id"),
    (chat(session_id=7), "session_id"),  # vLLM's field is a string; pydantic refuses an int
    (chat(session_id="a\nb"), "session_id"),
])
def test_bad_chat_requests(body: dict[str, object], param: str) -> None:
    with pytest.raises(RequestError) as err:
        prepare(CHAT_PATH, body, RULES, True)
    assert err.value.param == param and err.value.status == 400


def test_completions_prompt() -> None:
    assert prepare(COMPLETIONS_PATH, {"prompt": "hello"}, RULES, True).body["max_tokens"] == 512
    with pytest.raises(RequestError):
        prepare(COMPLETIONS_PATH, {"prompt": 5}, RULES, True)


@pytest.mark.parametrize("raw", [b"{", b"[1]", b"\xff\xfe", b"null", b"[" * 100000])
def test_parse_json_object_rejects(raw: bytes) -> None:
    with pytest.raises(RequestError):
        parse_json_object(raw)


def test_error_body_shape() -> None:
    payload = json.loads(error_body("bad", 400, "model"))
    assert payload == {"error": {"message": "bad", "type": "invalid_request_error",
                                 "param": "model", "code": 400}}
