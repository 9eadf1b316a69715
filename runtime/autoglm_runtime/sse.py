"""SSE coalescing: fewer, larger writes for token streams in batching mode.

Whole events are kept intact (an event ends with a blank line), so the stream stays valid SSE and
the client sees the same events; only the number of flushes drops. The terminal `[DONE]` event
and the end of the body always flush at once.
"""

from __future__ import annotations

_EVENT_END = b"\n\n"
_DONE = b"data: [DONE]"


class SSECoalescer:
    """Feed body chunks in, get back what to send now (possibly nothing)."""

    def __init__(self, max_events: int) -> None:
        self.max_events = max_events
        self._pending = bytearray()  # complete events not yet sent
        self._partial = bytearray()  # the tail of an event still arriving
        self._count = 0

    def feed(self, chunk: bytes) -> bytes:
        if self.max_events <= 1:
            return chunk
        self._partial += chunk.replace(b"\r\n", b"\n")
        flush = False
        while True:
            end = self._partial.find(_EVENT_END)
            if end < 0:
                break
            event = bytes(self._partial[: end + 2])
            del self._partial[: end + 2]
            self._pending += event
            self._count += 1
            if event.startswith(_DONE) or self._count >= self.max_events:
                flush = True
        return self._take() if flush else b""

    def finish(self) -> bytes:
        """Everything held, including an unterminated tail, for the last write."""
        out = self._take() + bytes(self._partial)
        self._partial.clear()
        return out

    def _take(self) -> bytes:
        out = bytes(self._pending)
        self._pending.clear()
        self._count = 0
        return out
