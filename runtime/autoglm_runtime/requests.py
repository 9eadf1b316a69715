"""Request checks and rewrites the middleware applies before a request reaches the engine.

Pure functions on parsed JSON: the middleware owns the I/O, these own the rules. Errors use
OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`) so clients raise their usual
`BadRequestError` instead of failing to parse.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from autoglm_api.media_hosts import INTERNAL_HOST_SUFFIXES
from autoglm_api.paths import CHAT_PATH, COMPLETIONS_PATH, RESPONSES_PATH
from autoglm_api.traffic import (
    TRAFFIC_CLASS_HEADER,
    VLLM_SERVICE_TIERS,
    TrafficClass,
    traffic_class,
)

# The project's session header: read from requests, echoed on responses.
SESSION_HEADER = "x-autoglm-session-id"
# vLLM 0.32's own session header (GenerateBaseServing.SESSION_ID_HEADER).
VLLM_SESSION_HEADER = "x-session-id"
# vLLM 0.32 takes this header's priority over the body's (GenerateBaseServing._get_priority),
# so the middleware removes it: the mode, not the client, sets the order.
VLLM_PRIORITY_HEADER = "x-vllm-priority"
_MAX_SESSION_CHARS = 256
# vLLM priority: lower is served first.
STREAM_PRIORITY = 0
DEFAULT_PRIORITY = 1
# vLLM's default --max-logprobs.
MAX_LOGPROBS = 20
# Longer integers are refused before int() (Python's own limit is 4300 digits, a ValueError).
_MAX_INT_DIGITS = 30
IMAGE_PART_TYPES = frozenset({"image_url", "image", "input_image", "image_pil", "image_embeds"})
# Media the model does not take here: refused rather than fetched.
REFUSED_PART_TYPES = frozenset({"video_url", "video", "audio_url", "input_audio", "audio",
                                "file", "input_file"})


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
    images_per_prompt: int = 2
    # Hosts an image_url may name besides data: URLs (vLLM's --allowed-media-domains).
    allowed_media_domains: tuple[str, ...] = field(default=())
    # The smallest concurrency cap of the modes: a request's `n` sequences must fit in it.
    max_sequences: int = 8


@dataclass
class PreparedRequest:
    body: dict[str, Any]
    stream: bool
    session_id: str | None
    priority: int
    sequences: int = 1  # its `n`: admission slots it takes
    traffic_class: TrafficClass = TrafficClass.OTHER


@dataclass(frozen=True)
class SessionHeaders:
    """The session ids a request's headers carry (vLLM's `X-Session-ID`, then the project's)."""

    vllm: str | None = None
    project: str | None = None


class _BadNumber(ValueError):
    def __init__(self, token: str) -> None:
        super().__init__(token)
        self.token = token


def _refuse_constant(token: str) -> Any:
    raise _BadNumber(token)  # NaN, Infinity, -Infinity: not JSON, and no setting takes them


def _bounded_int(token: str) -> int:
    if len(token.lstrip("-")) > _MAX_INT_DIGITS:
        raise _BadNumber(token)
    return int(token)


def _finite_float(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise _BadNumber(token)  # 1e400
    return value


def _field_holding(raw: bytes, token: str) -> str | None:
    """The key whose value is `token` (the first one), to name it in the error."""
    text = raw.decode("utf-8", "replace")
    match = re.search(r'"([^"\\]{1,64})"\s*:\s*' + re.escape(token[:64]), text)
    return match.group(1) if match else None


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw, parse_constant=_refuse_constant, parse_int=_bounded_int,
                          parse_float=_finite_float)
    except _BadNumber as exc:
        name = _field_holding(raw, exc.token)
        where = f"`{name}`" if name else "A field"
        raise RequestError(f"{where} holds a number that is not allowed: {exc.token[:20]}"
                           f"{'...' if len(exc.token) > 20 else ''} (too long, or not finite).",
                           param=name) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"The request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError("The request body nests too deeply.") from None
    except ValueError as exc:
        raise RequestError(f"The request body holds a value that cannot be read: {exc}") from None
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


def _clamp_completion_budget(body: dict[str, Any], name: str, rules: RequestRules) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"`{name}` must be an integer.", param=name)
    if value < 1:
        raise RequestError(f"`{name}` must be at least 1, got {value}.", param=name)
    if value > rules.max_model_len:
        # vLLM refuses a completion budget over the context, and clamps one within it to what
        # the prompt leaves (its get_max_tokens, after it counted the prompt, images
        # included). The phone agent always asks 3000: clamp, never refuse.
        body[name] = rules.max_model_len


def prepare(
    path: str,
    body: dict[str, Any],
    rules: RequestRules,
    prioritize_streams: bool,
    session_headers: SessionHeaders = SessionHeaders(),
    declared_class: str | None = None,
) -> PreparedRequest:
    """Validate a request to an admitted path and rewrite it into what vLLM 0.32 reads.
    `declared_class` is the request's TRAFFIC_CLASS_HEADER."""
    _check_model(body, rules)
    stream = _stream_of(body)
    klass = traffic_class(path, body, {TRAFFIC_CLASS_HEADER: declared_class or ""})
    _strip_service_tier(path, body)
    sequences = _check_fan_out(path, body, rules)
    _check_media(path, body, rules)
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
    priority = mode_priority(klass, prioritize_streams)
    body["priority"] = priority
    return PreparedRequest(body=body, stream=stream, session_id=session, priority=priority,
                           sequences=sequences, traffic_class=klass)


def _strip_service_tier(path: str, body: dict[str, Any]) -> None:
    """`service_tier` chose the class; vLLM's chat and completions ignore it (and log each
    request that has it), its Responses API refuses values other than OpenAI's."""
    tier = body.get("service_tier")
    if path != RESPONSES_PATH or not (isinstance(tier, str) and tier in VLLM_SERVICE_TIERS):
        body.pop("service_tier", None)


def _check_fan_out(path: str, body: dict[str, Any], rules: RequestRules) -> int:
    """The request's sequences (`n`, `best_of`), each bounded, and the logprobs it asks for."""
    sequences = 1
    for name in ("n", "best_of"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RequestError(f"`{name}` must be a positive integer.", param=name)
        if value > rules.max_sequences:
            raise RequestError(
                f"`{name}` is {value}; at most {rules.max_sequences} sequences fit in one "
                "request (the smallest mode's concurrency cap).", param=name)
        sequences = max(sequences, value)
    for name in ("top_logprobs", "logprobs", "prompt_logprobs"):
        value = body.get(name)
        if isinstance(value, bool) or value is None:
            continue  # chat's `logprobs` is a switch
        if not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS:
            raise RequestError(f"`{name}` must be an integer from 0 to {MAX_LOGPROBS}.",
                               param=name)
    return sequences


def _check_media(path: str, body: dict[str, Any], rules: RequestRules) -> None:
    """Images inline (data:) or from an allowed domain, never an internal address, and no
    more of them than the engine is told to take."""
    images = 0
    for part in _content_parts_of(path, body):
        kind = part.get("type")
        if kind in REFUSED_PART_TYPES:
            raise RequestError(f"`{kind}` parts are not served: the model takes text and images.",
                               param="messages")
        if kind not in IMAGE_PART_TYPES and "image_url" not in part:
            continue
        images += 1
        if images > rules.images_per_prompt:
            raise RequestError(
                f"The request has more than {rules.images_per_prompt} images per prompt, this "
                "server's limit.", param="messages")
        url = _image_url_of(part)
        if url is not None:
            problem = media_url_problem(url, rules.allowed_media_domains)
            if problem:
                raise RequestError(f"This `image_url` is not allowed: {problem}.",
                                   param="messages")


def _content_parts_of(path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    found = body.get("input") if path == RESPONSES_PATH else body.get("messages")
    messages: list[Any] = found if isinstance(found, list) and path != COMPLETIONS_PATH else []
    parts: list[dict[str, Any]] = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            parts += [p for p in content if isinstance(p, dict)]
        if isinstance(message, dict) and message.get("type") in IMAGE_PART_TYPES:
            parts.append(message)
    return parts


def _image_url_of(part: dict[str, Any]) -> str | None:
    value = part.get("image_url", part.get("image"))
    if isinstance(value, dict):
        value = value.get("url")
    return value if isinstance(value, str) else None


def media_url_problem(url: str, allowed_domains: tuple[str, ...]) -> str | None:
    """Why the engine may not fetch `url`, or None. data: URLs are inline, never fetched."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme == "data":
        return None
    if scheme not in ("http", "https"):
        return f"only data: and http(s) URLs are taken, not {scheme or 'this'}:"
    host = (parts.hostname or "").lower().rstrip(".")
    if _is_internal(host):
        return f"{host or 'its host'} is a loopback, link-local or cluster-internal address"
    if host not in allowed_domains:
        if not allowed_domains:
            return "send images inline as data: URLs (no remote media domain is allowed)"
        return f"{host} is not one of the allowed media domains"
    return None


def _is_internal(host: str) -> bool:
    if not host or host.endswith(INTERNAL_HOST_SUFFIXES) or "." not in host.strip("[]"):
        return True  # a bare name resolves through the cluster's search domains
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return not address.is_global


def mode_priority(klass: TrafficClass, prioritize_streams: bool) -> int:
    if not prioritize_streams:
        return 0
    return STREAM_PRIORITY if klass.interactive else DEFAULT_PRIORITY


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
        _clamp_completion_budget(body, name, rules)
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = min(rules.default_max_tokens, rules.max_model_len)


# vLLM's refusals of a prompt that leaves no room (renderers/params.py, api_utils.py).
_CONTEXT_FULL = ("maximum context length", "exceeds model's maximum context length")


def explain_full_context(raw: bytes, max_model_len: int) -> bytes | None:
    """vLLM's 400 for a prompt that does not fit, with what to do about it; None for any
    other answer."""
    try:
        body = json.loads(raw)
        message = body["error"]["message"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(message, str) or not any(s in message for s in _CONTEXT_FULL):
        return None
    body["error"]["message"] = (
        f"{message} The conversation no longer fits in this server's context of "
        f"{max_model_len} tokens (its text, its images and at least one output token): send "
        "fewer turns or smaller images, or raise the context (an AutoGLMDeployment's "
        "spec.maxModelLen, vLLM's --max-model-len)."
    )
    return json.dumps(body).encode()


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
    """The session vLLM 0.32 will use (body `session_id`, else `X-Session-ID`), or the
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
