"""Rule 2's books, pure: where each conversation's last turn went, and a replica's recent load.

The proxy and the endpoint picker keep them on the wall clock; the policy benchmark's
simulated router keeps the same books on its simulated clock."""

from __future__ import annotations

import math
from collections import OrderedDict

from autoglm_router.features import KeyKind, RequestFeatures

SESSION_MEMORY = 65536  # sessions whose last replica a router remembers
# Rule 2 places a new conversation by each replica's in-flight cost averaged over about this
# long: a phone agent's turn cycle (answer, action, next screenshot), so conversations between
# two turns still count where they live and finished ones stop counting soon. 3 s by
# measurement on seeds 9-10 of bench/router_sessions.py (router/README.md).
RECENT_LOAD_SECONDS = 3.0


class SessionMemory:
    """Where this router sent each (class, session) last, bounded (LRU): rule 2 keeps the
    session there, and the placement metric counts hits and moves."""

    def __init__(self, size: int) -> None:
        self._last: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._size = size

    def last(self, features: RequestFeatures) -> str | None:
        key = session_of(features)
        return self._last.get(key) if key is not None else None

    def place(self, key: tuple[str, str], replica: str) -> str:
        """Remember where the session went; "new", "hit" (the same replica) or "moved"."""
        previous = self._last.pop(key, None)
        self._last[key] = replica
        if len(self._last) > self._size:
            self._last.popitem(last=False)
        if previous is None:
            return "new"
        return "hit" if previous == replica else "moved"


def session_of(features: RequestFeatures) -> tuple[str, str] | None:
    """The (class, key) whose placement rule 2 remembers: a session's or a conversation's."""
    if features.key_kind not in (KeyKind.SESSION, KeyKind.CONVERSATION) or features.key is None:
        return None
    return features.traffic_class.value, features.key


def settled(average: float, value: float, elapsed: float, seconds: float) -> float:
    """An exponential average over about `seconds`, moved toward `value`, which has stood since
    the average was last settled `elapsed` seconds ago (a replica's recent load, rule 2)."""
    return value + (average - value) * math.exp(-elapsed / seconds)
