"""The API the router serves: an allow-list of exact methods and paths, matched on the raw
request-target as the client sent it (pure).

A path is never decoded or normalised before it is matched: `/v1/../metrics` and
`/v1/..%2Fscale_elastic_ep` would otherwise reach replica paths nobody meant to expose, and
what reaches the replica is the same raw path that was matched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from autoglm_api.paths import CHAT_PATH, COMPLETIONS_PATH, MODELS_PATH, RESPONSES_PATH

# Each path and the methods a client needs on it.
ROUTES: dict[str, frozenset[str]] = {
    CHAT_PATH: frozenset({"POST"}),
    COMPLETIONS_PATH: frozenset({"POST"}),
    RESPONSES_PATH: frozenset({"POST"}),
    MODELS_PATH: frozenset({"GET"}),
}
# vLLM keeps a stored response in the memory of the replica that made it, and the runtime
# refuses `background` responses (their slot would be given back before they finish), so a
# later GET or cancel has nothing to find on any replica but by luck: refused, with the reason.
STORED_RESPONSE = re.compile(r"^/v1/responses/[^/]+(/cancel)?$")
# A dot-segment, or an encoded `/`, `.`, `?`, `#` or `\`, which some server on the way would
# read as structure. Matched on the raw path, case-insensitive for the hex digits.
_AMBIGUOUS = re.compile(r"(^|/)\.{1,2}(/|$)|%(2f|2e|3f|23|5c)|\\", re.IGNORECASE)


@dataclass(frozen=True)
class PathVerdict:
    """None of the fields set: served. Otherwise the status and message to answer with."""

    status: int = 0
    message: str = ""
    allow: str = ""  # the Allow header of a 405

    @property
    def served(self) -> bool:
        return self.status == 0


SERVED = PathVerdict()


def check_path(method: str, raw_path: str) -> PathVerdict:
    """Whether the router serves `method` on `raw_path` (the path as sent, without query)."""
    if _AMBIGUOUS.search(raw_path):
        return PathVerdict(400, "The request path holds a dot-segment or an encoded '/', '.', "
                                "'?', '#' or '\\'; send the path plainly.")
    methods = ROUTES.get(raw_path)
    if methods is None:
        if STORED_RESPONSE.match(raw_path):
            return PathVerdict(404, f"{method} {raw_path} is not served: responses are not "
                               "stored for later (`background` is refused, and a stored "
                               "response would live on one replica only); read the response "
                               "from its own request.")
        return PathVerdict(404, f"No route {raw_path}: this endpoint serves "
                           f"{', '.join(f'{sorted(m)[0]} {p}' for p, m in ROUTES.items())}.")
    if method not in methods:
        allow = ", ".join(sorted(methods))
        return PathVerdict(405, f"Use {allow} on {raw_path}.", allow)
    return SERVED
