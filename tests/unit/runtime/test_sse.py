from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from autoglm_runtime.sse import SSECoalescer


def event(i: int) -> bytes:
    return b'data: {"i":%d}\n\n' % i


def test_off_passes_through() -> None:
    assert SSECoalescer(1).feed(b"data: x") == b"data: x"


def test_groups_events_and_flushes_done() -> None:
    c = SSECoalescer(3)
    assert c.feed(event(1)) == b""
    assert c.feed(event(2)) == b""
    assert c.feed(event(3)) == event(1) + event(2) + event(3)
    assert c.feed(event(4)) == b""
    assert c.feed(b"data: [DONE]\n\n") == event(4) + b"data: [DONE]\n\n"
    assert c.finish() == b""


def test_events_split_across_chunks_stay_whole() -> None:
    c = SSECoalescer(2)
    whole = event(1) + event(2)
    assert c.feed(whole[:5]) == b""
    assert c.feed(whole[5:20]) == b""
    assert c.feed(whole[20:]) == whole


@given(st.lists(st.integers(0, 10**6), max_size=30), st.integers(1, 8),
       st.lists(st.integers(1, 40), min_size=1, max_size=10))
def test_output_is_the_input_in_whole_events(values: list[int], k: int, cuts: list[int]) -> None:
    stream = b"".join(event(v) for v in values) + b"data: [DONE]\n\n"
    chunks, pos, i = [], 0, 0
    while pos < len(stream):
        size = cuts[i % len(cuts)]
        chunks.append(stream[pos:pos + size])
        pos, i = pos + size, i + 1
    c = SSECoalescer(k)
    writes = [c.feed(chunk) for chunk in chunks] + [c.finish()]
    assert b"".join(writes) == stream
    if k > 1:  # k == 1 is off: chunks pass through as they come
        for write in writes:
            assert write == b"" or write.endswith(b"\n\n")  # flushes end on event boundaries
        assert len([w for w in writes if w]) <= len(chunks)  # never more writes than input
