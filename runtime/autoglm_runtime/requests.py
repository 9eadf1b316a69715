"""Request checks and rewrites the middleware applies before a request reaches the engine.

Pure functions on parsed JSON: the middleware owns the I/O, these own the rules. Errors use
OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`) so clients raise their usual
`BadRequestError` instead of failing to parse.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from autoglm_runtime.routes import CHAT_PATH, RESPONSES_PATH

# The project's session header: read from requests, echoed on responses.
SESSION_HEADER = "x-autoglm-session-id"
# vLLM 0.33's own session header (GenerateBaseServing.SESSION_ID_HEADER).
VLLM_SESSION_HEADER = "x-session-id"
# vLLM 0.33 takes this header's priority over the body's (GenerateBaseServing._get_priority),
# so the middleware removes it: the mode, not the client, sets the order.
VLLM_PRIORITY_HEADER = "x-vllm-priority"
_MAX_SESSION_CHARS = 256
# vLLM priority: lower is served first.
STREAM_PRIORITY = 0
DEFAULT_PRIORITY = 1


class RequestError(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


def error_body(
    message: str, status: int, param: str | None = None, err_type: str | None = None
) -> bytes:
    if err_type is None:
        err_type = "invalid_request_error" if status < 500 else "service_unavailable"
    payload = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return json.dumps(payload).encode()


@dataclass(frozen=True)
class RequestRules:
    served_model_name: str
    max_model_len: int
    default_max_tokens: int
    max_chars_per_token: int


@dataclass
class PreparedRequest:
    body: dict[str, Any]
    stream: bool
    session_id: str | None
    priority: int


@dataclass(frozen=True)
class SessionHeaders:
    """The session ids a request's headers carry (vLLM's `X-Session-ID`, then the project's)."""

    vllm: str | None = None
    project: str | None = None


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"The request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError("The request body nests too deeply.") from None
    if not isinstance(data, dict):
        raise RequestError("The request body must be a JSON object.")
    return data


def _text_chars(content: Any) -> int:
    """Characters of text a prompt carries (images are bounded by the engine, not here)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, str):
                total += len(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                total += len(part["text"])
        return total
    return 0


def _check_int_param(body: dict[str, Any], name: str, rules: RequestRules) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"`{name}` must be an integer.", param=name)
    if value < 1:
        raise RequestError(f"`{name}` must be at least 1, got {value}.", param=name)
    if value > rules.max_model_len:
        raise RequestError(
            f"`{name}` is {value}, more than the model's context of "
            f"{rules.max_model_len} tokens.",
            param=name,
        )


def prepare(
    path: str,
    body: dict[str, Any],
    rules: RequestRules,
    prioritize_streams: bool,
    session_headers: SessionHeaders = SessionHeaders(),
) -> PreparedRequest:
    """Validate a request to an admitted path and rewrite it into what vLLM 0.33 reads."""
    _check_model(body, rules)
    stream = _stream_of(body)
    if path == RESPONSES_PATH:
        _check_responses(body)
    else:
        _check_prompt(path, body, rules)
        _check_and_default_max_tokens(body, rules)
        if path == CHAT_PATH:
            _move_langchain_extras(body)
        else:
            # Chat-template switches: vLLM's CompletionRequest has neither field nor target.
            body.pop("enable_thinking", None)
            body.pop("return_reasoning", None)
    session = resolve_session(body, session_headers)
    # The mode owns scheduling order; a client-chosen priority would let anyone jump the line.
    priority = mode_priority(stream, prioritize_streams)
    body["priority"] = priority
    return PreparedRequest(body=body, stream=stream, session_id=session, priority=priority)


def mode_priority(stream: bool, prioritize_streams: bool) -> int:
    if not prioritize_streams:
        return 0
    return STREAM_PRIORITY if stream else DEFAULT_PRIORITY


def _check_model(body: dict[str, Any], rules: RequestRules) -> None:
    model = body.get("model")
    if model is not None and model != rules.served_model_name:
        raise RequestError(
            f"The model `{model}` does not exist; this server serves "
            f"`{rules.served_model_name}`.",
            param="model",
        )


def _stream_of(body: dict[str, Any]) -> bool:
    stream = body.get("stream", False)
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise RequestError("`stream` must be a boolean.", param="stream")
    return stream


def _check_responses(body: dict[str, Any]) -> None:
    if body.get("background") is True:
        # vLLM answers at once and generates later, after the admission slot is given back.
        raise RequestError(
            "`background` responses are not served: the mode admits a request only while "
            "its connection is open.",
            param="background",
        )


def _check_prompt(path: str, body: dict[str, Any], rules: RequestRules) -> None:
    if path == CHAT_PATH:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError("`messages` must be a non-empty list.", param="messages")
        if not all(isinstance(m, dict) for m in messages):
            raise RequestError("Each message must be an object.", param="messages")
        chars = sum(_text_chars(m.get("content")) for m in messages)
        prompt_param = "messages"
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            chars = len(prompt)
        elif isinstance(prompt, list) and prompt:
            chars = sum(len(p) for p in prompt if isinstance(p, str))
            chars += sum(len(p) for p in prompt if isinstance(p, list))
        else:
            raise RequestError("`prompt` must be a string or a non-empty list.", param="prompt")
        prompt_param = "prompt"
    # The longest token has max_chars_per_token characters, so more than this cannot fit.
    if chars > rules.max_model_len * rules.max_chars_per_token:
        raise RequestError(
            f"This model's maximum context length is {rules.max_model_len} tokens. "
            f"However, your prompt contains {chars} characters, more than can fit.",
            param=prompt_param,
        )


def _check_and_default_max_tokens(body: dict[str, Any], rules: RequestRules) -> None:
    for name in ("max_tokens", "max_completion_tokens"):
        _check_int_param(body, name, rules)
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = min(rules.default_max_tokens, rules.max_model_len)


def _move_langchain_extras(body: dict[str, Any]) -> None:
    """LangChain's extra_body puts these at the top level; vLLM's chat reads them elsewhere."""
    enable_thinking = body.pop("enable_thinking", None)
    return_reasoning = body.pop("return_reasoning", None)
    if enable_thinking is not None:
        if not isinstance(enable_thinking, bool):
            raise RequestError("`enable_thinking` must be a boolean.", param="enable_thinking")
        kwargs = body.get("chat_template_kwargs")
        if kwargs is None:
            kwargs = {}
        if not isinstance(kwargs, dict):
            raise RequestError(
                "`chat_template_kwargs` must be an object.", param="chat_template_kwargs"
            )
        kwargs.setdefault("enable_thinking", enable_thinking)
        body["chat_template_kwargs"] = kwargs
    if return_reasoning is not None:
        if not isinstance(return_reasoning, bool):
            raise RequestError("`return_reasoning` must be a boolean.", param="return_reasoning")
        body["include_reasoning"] = return_reasoning


def resolve_session(body: dict[str, Any], headers: SessionHeaders) -> str | None:
    """The session vLLM 0.33 will use (body `session_id`, else `X-Session-ID`), or the
    project's header, which is written into the body so that vLLM sees it too."""
    from_body = body.get("session_id")
    if from_body is not None and not isinstance(from_body, str):
        raise RequestError("`session_id` must be a string.", param="session_id")
    if from_body:
        session = from_body  # vLLM's `if request.session_id:`: an empty one falls through
    elif headers.vllm:
        session = headers.vllm
    elif headers.project:
        session = body["session_id"] = headers.project
    else:
        return None
    # It is echoed in a response header: keep it to one printable, bounded line.
    if len(session) > _MAX_SESSION_CHARS or not session.isprintable():
        raise RequestError(
            f"`session_id` must be printable and at most {_MAX_SESSION_CHARS} characters.",
            param="session_id",
        )
    return session
