"""A replica's mode set through its admin API (the launcher's port, or a sim's), as the operator
sets it: `PUT <admin_url>/mode` with the admin token, the answer checked.

The operator's own client (autoglm_operator.io.runtime_client) verifies with a fresh GET and
retries; these helpers are the tests' and benchmarks' one-call version.
"""

from __future__ import annotations

from typing import Any

import httpx

from autoglm_api.profiles import MODE_PATH
from testkit.waiting import eventually_async

Timeout = float | httpx.Timeout


class _Busy(Exception):
    """A 503: the engine's API server could not take the relayed call within its bound."""


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _switched(answer: httpx.Response, mode: str) -> dict[str, Any]:
    assert answer.status_code == 200 and answer.json()["mode"] == mode, answer.text
    state: dict[str, Any] = answer.json()
    return state


def set_mode(admin_url: str, token: str, mode: str, timeout: Timeout = 10.0) -> dict[str, Any]:
    """PUT `mode`; the state answered, asserted to be a 200 in that mode."""
    answer = httpx.put(admin_url + MODE_PATH, json={"mode": mode}, headers=bearer(token),
                       timeout=timeout)
    return _switched(answer, mode)


async def set_mode_async(admin_url: str, token: str, mode: str, timeout: Timeout = 10.0,
                         busy_for: float = 0.0, every: float = 0.25) -> dict[str, Any]:
    """`set_mode` in a coroutine. With `busy_for`, a 503 (an engine too busy to take the
    relayed call, seen on 2 shared cores) is put again every `every` seconds, as the operator
    retries it, for up to `busy_for` seconds; any other answer is checked at once."""
    async with httpx.AsyncClient(base_url=admin_url, headers=bearer(token),
                                 timeout=timeout) as admin:

        async def put() -> httpx.Response:
            answer = await admin.put(MODE_PATH, json={"mode": mode})
            if answer.status_code == 503 and busy_for:
                raise _Busy(answer.text)
            return answer

        answer = (await eventually_async(put, busy_for, every=every, ignoring=(_Busy,),
                                         what=f"PUT mode {mode} taken")
                  if busy_for else await put())
    return _switched(answer, mode)
