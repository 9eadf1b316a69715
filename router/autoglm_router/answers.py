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
