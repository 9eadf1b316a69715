"""The API key check, done as vLLM 0.32's AuthenticationMiddleware does it, before admission.

vLLM checks the key inside our middleware (it adds `--middleware` classes last, so ours is
outermost): without this, a request with no key would queue and hold a slot before vLLM
answered 401. Same keys (`VLLM_API_KEY`, which the operator fills from apiKeySecretRef), same
guarded prefixes, same header parsing and the same 401, so a client sees no difference.
"""

from __future__ import annotations

import hashlib
import hmac
import json

# vllm/entrypoints/serve/middleware/authenticate.py: GUARDED_PREFIX.
GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
# vLLM's `JSONResponse(content={"error": "Unauthorized"}, status_code=401)`, byte for byte.
UNAUTHORIZED_BODY = json.dumps({"error": "Unauthorized"}, separators=(",", ":")).encode()


def key_digests(keys: list[str]) -> list[bytes]:
    """SHA-256 of each non-empty key: compared digest to digest, in constant time."""
    return [hashlib.sha256(key.encode("utf-8")).digest() for key in keys if key]


def is_guarded(method: str, path: str) -> bool:
    """vLLM guards every method but OPTIONS (CORS preflight) on these prefixes."""
    return method != "OPTIONS" and path.startswith(GUARDED_PREFIXES)


def presents_a_key(authorization: str | None, digests: list[bytes]) -> bool:
    """`Authorization: Bearer <key>` with one of the keys, parsed exactly as vLLM parses it."""
    if not authorization:
        return False
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    presented_digest = hashlib.sha256(presented.encode("utf-8")).digest()
    matched = False
    for digest in digests:  # no early exit: the time taken does not say which key matched
        matched |= hmac.compare_digest(presented_digest, digest)
    return matched
