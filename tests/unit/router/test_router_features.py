"""What the router reads from a request: class, session or prefix key, cost."""

from __future__ import annotations

import base64
import io
import json
import struct
from typing import Any

import pytest
from PIL import Image

from autoglm_router.features import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    DEFAULT_IMAGE_MAX_PIXELS,
    IMAGE_DELIMITER_TOKENS,
    NEUTRAL,
    TOKENS_PER_LOAD_UNIT,
    KeyKind,
    TrafficClass,
    request_features,
)
from autoglm_router.scan import scan_request

SYSTEM = {"role": "system", "content": "You are a phone agent."}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def features(body: Any, headers: dict[str, str] | None = None, path: str = CHAT_PATH,
             prefix_chars: int = 1024):  # type: ignore[no-untyped-def]
    return request_features(path, body, headers or {}, prefix_chars)


def turn(task: str, *later: str, stream: bool = False, screenshot: bool = False) -> dict[str, Any]:
    first: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": task}]}
    if screenshot:
        first["content"].append(IMAGE)
    messages = [SYSTEM, first] + [{"role": "assistant", "content": t} for t in later]
    return {"model": "m", "messages": messages, "stream": stream}


def test_streamed_chats_are_interactive_unless_the_client_declares_otherwise() -> None:
    assert features(turn("a", stream=True)).traffic_class is TrafficClass.STREAMED_CHAT
    assert features(turn("a")).traffic_class is TrafficClass.OTHER
    completion = {"prompt": "a", "stream": True}
    assert features(completion, path=COMPLETIONS_PATH).traffic_class is TrafficClass.OTHER
    # Declared (autoglm_api.traffic, the rule the replicas apply too): a body field the
    # scan keeps, or the header.
    flex = {**turn("a", stream=True), "service_tier": "flex"}
    assert features(scan_request(json.dumps(flex).encode())).traffic_class is TrafficClass.OTHER
    declared = features(turn("a"), {"x-autoglm-traffic-class": "interactive"})
    assert declared.traffic_class is TrafficClass.STREAMED_CHAT


def test_session_key_order_body_then_x_session_id_then_runtime_header() -> None:
    headers = {"x-session-id": "h1", "x-autoglm-session-id": "h2"}
    assert features({**turn("a"), "session_id": "b"}, headers).key == "s:b"
    assert features(turn("a"), headers).key == "s:h1"
    assert features(turn("a"), {"x-autoglm-session-id": "h2"}).key == "s:h2"
    assert features({**turn("a"), "session_id": 7}).key == "s:7"
    assert features(turn("a"), headers).key_kind is KeyKind.SESSION


def test_without_a_session_the_prefix_is_the_key() -> None:
    first = features(turn("open the settings app", screenshot=True))
    later = features(turn("open the settings app", "tapped", "scrolled"))
    other = features(turn("send a message"))
    # A chat's prefix stands for its conversation; a completion's is a plain prefix.
    assert first.key_kind is KeyKind.CONVERSATION and first.new_conversation
    assert later.key_kind is KeyKind.CONVERSATION and not later.new_conversation
    # Later turns and a replaced screenshot keep the key; another task changes it.
    assert first.key == later.key != other.key
    completion = features({"prompt": "open the settings app"}, path=COMPLETIONS_PATH)
    assert completion.key_kind is KeyKind.PREFIX


def test_the_prefix_is_bounded() -> None:
    a = features(turn("x" * 2000 + "a"), prefix_chars=1024)
    b = features(turn("x" * 2000 + "b"), prefix_chars=1024)
    assert a.key == b.key
    assert features(turn("x" * 2000 + "a"), prefix_chars=4096).key != features(
        turn("x" * 2000 + "b"), prefix_chars=4096).key


def test_agent_tasks_sharing_a_long_system_prompt_get_their_own_keys() -> None:
    """The phone agent sends no session id, and its 2.7 KB system prompt is every task's: the
    task in the first user message must still tell one task's steps from another's."""
    system = {"role": "system", "content": "You are a phone operation agent. " * 80}

    def step(task: str, answers: int) -> dict[str, Any]:
        history: list[dict[str, Any]] = [system, {"role": "user", "content": task}]
        for i in range(answers):
            history += [{"role": "assistant", "content": f"<answer>do(action={i})</answer>"},
                        {"role": "user", "content": "** Screen Info **"}]
        history[-1] = {"role": "user", "content": [{"type": "text", "text": history[-1][
            "content"]}, IMAGE]}
        return {"model": "m", "messages": history, "stream": True}

    wifi = [features(step("Turn on wifi.", n)) for n in range(4)]
    maps = features(step("Find a coffee shop in Maps.", 0))
    assert {f.key_kind for f in wifi} == {KeyKind.CONVERSATION}
    assert len({f.key for f in wifi}) == 1  # every step of one task: one key
    assert maps.key != wifi[0].key


def test_a_later_turn_costs_its_home_only_what_the_cache_there_lacks() -> None:
    """The replica that served a conversation's previous turn holds its prompt up to the
    previous user message (the agent strips that message's screenshot when it sends the next
    step, so the shared prefix ends there): at home a turn prefills only the rest."""
    system = {"role": "system", "content": "s" * 4000}  # 1000 tokens

    def step(answers: int) -> dict[str, Any]:
        history: list[dict[str, Any]] = [system, {"role": "user", "content": "t" * 400}]
        for _ in range(answers):
            history += [{"role": "assistant", "content": "a" * 200},
                        {"role": "user", "content": "** Screen Info **"}]
        history[-1] = {"role": "user", "content": [{"type": "text", "text": "u" * 40}, IMAGE]}
        return {"model": "m", "messages": history, "stream": True}

    first, second, third = (features(step(n)) for n in range(3))
    assert first.cached_tokens == 0 and first.home_cost == first.cost
    # Second step: the system prompt is all that is surely cached (the task's message changed).
    assert second.cached_tokens == 1000
    # Third: system, task and the first answer (1000 + 100 + 50 tokens).
    assert third.cached_tokens == 1150
    assert third.home_cost == pytest.approx(third.cost - 1150 / TOKENS_PER_LOAD_UNIT)
    # A completion or a keyless request has no home to discount.
    assert features({"prompt": "p" * 4000}, path=COMPLETIONS_PATH).cached_tokens == 0


def test_cost_grows_with_prompt_length_and_images() -> None:
    short = features(turn("hi")).cost
    long = features(turn("word " * 2000)).cost
    screenshot = features(turn("hi", screenshot=True)).cost
    assert 1.0 <= short < 1.1
    assert long > 3.0
    # Its size unreadable ("AAAA"): the most one image costs at the default budget, 770 tokens.
    assert screenshot - short == (770 + IMAGE_DELIMITER_TOKENS) / TOKENS_PER_LOAD_UNIT


def png_url(width: int, height: int) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (236, 239, 241)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_a_screenshot_is_priced_as_the_engine_scales_it() -> None:
    def screenshot_cost(width: int, height: int, max_pixels: int) -> float:
        body = turn("hi")
        body["messages"][1]["content"].append(
            {"type": "image_url", "image_url": {"url": png_url(width, height)}})
        base = request_features(CHAT_PATH, turn("hi"), {}, 1024, max_pixels).cost
        return (request_features(CHAT_PATH, body, {}, 1024, max_pixels).cost - base) * 1024

    # 1080x2400 at the default budget: scaled to 504x1148, 18 x 41 tokens, plus 2 delimiters.
    assert screenshot_cost(1080, 2400, DEFAULT_IMAGE_MAX_PIXELS) == 18 * 41 + 2
    # At the official 5,000,000: 1036x2352, 37 x 84; a small image is not scaled up to it.
    assert screenshot_cost(1080, 2400, 5_000_000) == 37 * 84 + 2
    assert screenshot_cost(540, 1200, 5_000_000) == 19 * 43 + 2


def lying_png_url(width: int, height: int) -> str:
    """A PNG head whose IHDR claims any size: the 8-byte signature, then the IHDR chunk."""
    head = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\x0dIHDR" + struct.pack(">II", width, height)
    return "data:image/png;base64," + base64.b64encode(head + b"\x08\x02\x00\x00\x00").decode()


def test_an_image_header_claiming_a_shape_the_processor_refuses_is_priced_as_unknown() -> None:
    """A client must not make one request weigh millions of tokens in the load bound for as long
    as it lasts: the engine refuses a side over 200 times the other with a 400."""
    unknown = features(turn("hi", screenshot=True)).cost

    def cost(url: str) -> float:
        body = turn("hi")
        body["messages"][1]["content"].append({"type": "image_url", "image_url": {"url": url}})
        return features(body).cost

    assert cost(lying_png_url(28, 4_000_000_000)) == unknown
    assert cost(lying_png_url(4_000_000_000, 1)) == unknown
    # A huge image of a shape the processor takes is scaled to the budget like any other.
    assert cost(lying_png_url(4_000_000_000, 40_000_000)) <= unknown


def test_a_body_that_is_not_an_object_is_neutral() -> None:
    assert features(["not", "an", "object"]) == NEUTRAL
    assert features(None) == NEUTRAL
    assert features({"messages": "nonsense"}).key_kind is KeyKind.NONE


def test_a_chat_with_no_answer_in_its_history_is_a_new_conversation() -> None:
    assert features({**turn("a"), "session_id": "s"}).new_conversation
    assert not features({**turn("a", "Tap(1, 2)"), "session_id": "s"}).new_conversation
    tool = {"role": "tool", "content": "done", "tool_call_id": "1"}
    assert not features({**turn("a"), "messages": [SYSTEM, tool], "session_id": "s"}
                        ).new_conversation
    # A completion cannot tell: never new, so it keeps the session's slack.
    completion = {"prompt": "a", "session_id": "s"}
    assert not features(completion, path=COMPLETIONS_PATH).new_conversation
