"""What the front door answers when it refuses a request (pure).

The HTTP router and the endpoint picker give a refused request the same status, body and headers:
each builds its answer here and only writes it its own way (an HTTP response, an ext_proc
ImmediateResponse).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from autoglm_api.api_key import UNAUTHORIZED_BODY
from autoglm_router.paths import PathVerdict
from autoglm_router.routing import Refusal

REQUEST_ID = "x-request-id"
HELD_SECONDS = "x-autoglm-held-seconds"  # on the answer of a request held for a replica
# A held request past the bound comes back later: a replica may take minutes to come up, and
# the openai client waits a Retry-After of up to 60 s before its own retry.
HOLD_RETRY_AFTER_SECONDS = 10


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()
    # Over HTTP the connection closes after it: its body may still be on its way, unread.
    close: bool = False


def error_body(message: str, status: int) -> bytes:
    """OpenAI's error shape, as vLLM answers it."""
    err_type = "invalid_request_error" if status < 500 else "service_unavailable"
    return json.dumps(
        {"error": {"message": message, "type": err_type, "param": None, "code": status}}
    ).encode()


def path_refused(verdict: PathVerdict, method: str) -> Answer:
    allow = (("allow", verdict.allow),) if verdict.allow else ()
    return Answer(verdict.status, error_body(verdict.message, verdict.status), allow,
                  close=method != "GET")


# vLLM's own 401, before a byte of the body is read.
UNAUTHORIZED = Answer(401, UNAUTHORIZED_BODY, close=True)
AT_REQUEST_LIMIT = Answer(503, error_body("The router is at its request limit; retry shortly.",
                                          503), (("retry-after", "1"),), close=True)
BODY_BUDGET_FULL = Answer(
    503, error_body("The router holds as many request bodies as it may; retry shortly.", 503),
    (("retry-after", "1"),), close=True)


def body_too_large(limit: int) -> Answer:
    return Answer(413, error_body(f"The request body is larger than {limit} bytes.", 413),
                  close=True)


def body_too_slow(seconds: float) -> Answer:
    return Answer(408, error_body(f"The request body took over {seconds:g} s to arrive.", 408),
                  close=True)


def refused(refusal: Refusal, request_id: str) -> Answer:
    """The routing decision's refusal: no replica (503) or every replica at its cap (429)."""
    return Answer(refusal.status, error_body(refusal.message, refusal.status),
                  (("retry-after", "1"), (REQUEST_ID, request_id)))


def hold_full(request_id: str) -> Answer:
    """No replica, and the hold queue full: the request is not held."""
    return Answer(503, error_body("No replica is up and the router holds as many requests as "
                                  "it may; retry later.", 503),
                  (("retry-after", str(HOLD_RETRY_AFTER_SECONDS)), (REQUEST_ID, request_id)))


def held_too_long(seconds: float, request_id: str) -> Answer:
    """Held as long as the router holds a request, and still no replica took it."""
    return Answer(503, error_body(f"No replica could take the request within {seconds:g} s; "
                                  "retry later.", 503),
                  (("retry-after", str(HOLD_RETRY_AFTER_SECONDS)), (REQUEST_ID, request_id)))


def hold_client_full(request_id: str) -> Answer:
    """No replica, and this client holds its share of the queue already."""
    return Answer(503, error_body("No replica is up and this client has as many requests held "
                                  "as one client may; retry later.", 503),
                  (("retry-after", str(HOLD_RETRY_AFTER_SECONDS)), (REQUEST_ID, request_id)))


def models_at_zero(names: tuple[str, ...], created: int) -> Answer:
    """GET /v1/models with no replica up, as vLLM lists its served names: a client or UI that
    polls the list wakes no GPU."""
    cards = [{"id": name, "object": "model", "created": created, "owned_by": "vllm",
              "root": name, "parent": None} for name in names]
    return Answer(200, json.dumps({"object": "list", "data": cards}).encode())


# A held streamed request gets its headers before its replica answers (so a proxy's idle
# timeout never cuts it): these, then an SSE comment per heartbeat.
HELD_STREAM_HEADERS = (("content-type", "text/event-stream"), ("cache-control", "no-cache"),
                       ("x-accel-buffering", "no"))
SSE_DONE = b"data: [DONE]\n\n"


def heartbeat(held_seconds: float) -> bytes:
    """An SSE comment: clients skip it, proxies see bytes."""
    return f": held {held_seconds:.0f}s, waiting for a replica\n\n".encode()


def sse_error(status: int, body: bytes) -> bytes:
    """A refusal as the events of a stream already begun, as vLLM ends a stream that fails:
    an `error` object the OpenAI clients raise as an APIError, then [DONE]."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        error = parsed
    else:
        message = parsed.get("message") if isinstance(parsed, dict) else None
        error = json.loads(error_body(str(message or body.decode(errors="replace")), status))
    return b"data: " + json.dumps(error).encode() + b"\n\n" + SSE_DONE
