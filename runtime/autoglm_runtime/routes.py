"""Which of vLLM 0.32's routes the mode admits, which it refuses, and why.

Every route that makes the engine generate either goes through admission with the mode's
priority or is refused here: a route that reached the engine past the middleware would take
engine slots the mode does not count, at a priority the client picks. The table is
runtime/README.md's "Routes"; vLLM registers the routes in
`vllm/entrypoints/launchers/api_server/routers.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoglm_api.paths import CHAT_PATH, COMPLETIONS_PATH, RESPONSES_PATH

# POST only; vLLM answers other methods on them (405) without the engine.
ADMITTED_PATHS = frozenset({CHAT_PATH, COMPLETIONS_PATH, RESPONSES_PATH})

_USE_CHAT = f"Send the request to POST {CHAT_PATH} instead."


@dataclass(frozen=True)
class Refusal:
    """Why a route is not served; answered as a 404 so clients do not retry it."""

    reason: str

    def message(self, method: str, path: str) -> str:
        return f"{method} {path} is not served by this runtime: {self.reason}"


_NO_PRIORITY = Refusal(
    "its requests carry no priority the mode could set, so they would skip its "
    f"admission and queue order. {_USE_CHAT}"
)
_BATCH = Refusal(
    "one request runs many conversations, and the mode admits one conversation per slot. "
    "Send each conversation to POST /v1/chat/completions instead."
)
_OTHER_API = Refusal(
    f"this API is not one the mode schedules; the model is served through {CHAT_PATH}, "
    f"{COMPLETIONS_PATH} and {RESPONSES_PATH}."
)
_POOLING = Refusal(
    "the served model is generative; pooling (embed, score, rerank, classify) is not served."
)
_AUDIO = Refusal("the served model does not take audio.")
_ADMIN = Refusal(
    "the admin API is served on the pod's admin port (AUTOGLM_ADMIN_PORT), to the operator, "
    "not on the API port."
)
_RENDERS = Refusal(
    "it renders chat messages (and so fetches their image URLs) outside admission, with no "
    "limit on what it fetches; a client of the model does not need it."
)

REFUSED_ROUTES: dict[str, Refusal] = {
    "/v1/chat/completions/batch": _BATCH,
    "/v1/messages": _NO_PRIORITY,
    "/invocations": _OTHER_API,  # SageMaker: dispatches to chat/completions by body shape
    "/inference/v1/generate": _OTHER_API,  # token-in/token-out (--enable-scale-out)
    "/generative_scoring": _OTHER_API,
    "/v1/systemone": _OTHER_API,
    "/v1/decisions": _OTHER_API,
    "/v1/audio/transcriptions": _AUDIO,
    "/v1/audio/translations": _AUDIO,
    "/v1/embeddings": _POOLING,
    "/v2/embed": _POOLING,
    "/pooling": _POOLING,
    "/classify": _POOLING,
    "/score": _POOLING,
    "/v1/score": _POOLING,
    "/rerank": _POOLING,
    "/v1/rerank": _POOLING,
    "/v2/rerank": _POOLING,
    # vLLM 0.32's tokenizer and render routes (vllm/entrypoints/serve/tokenize,
    # vllm/entrypoints/scale_out/render and derender).
    "/tokenize": _RENDERS,
    "/detokenize": _RENDERS,
    "/v1/chat/completions/render": _RENDERS,
    "/v1/completions/render": _RENDERS,
    "/v1/responses/render": _RENDERS,
    "/v1/messages/render": _RENDERS,
    "/v1/messages/count_tokens": _RENDERS,
    "/v1/chat/completions/derender": _RENDERS,
    "/v1/completions/derender": _RENDERS,
}
# Cohere's v2 chat (VLLM_ENABLE_COHERE_API=1) and whatever vLLM adds under it; our admin API.
REFUSED_PREFIXES: dict[str, Refusal] = {"/cohere/": _OTHER_API, "/autoglm/": _ADMIN}


def refusal_for(path: str) -> Refusal | None:
    """The refusal for a path the mode does not serve; None for admitted and passed-on paths."""
    refusal = REFUSED_ROUTES.get(path)
    if refusal is not None:
        return refusal
    return next((r for prefix, r in REFUSED_PREFIXES.items() if path.startswith(prefix)), None)
