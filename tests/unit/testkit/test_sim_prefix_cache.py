"""The sim's prefix cache: chained block hashes, LRU eviction inside the KV budget, the
vllm:prefix_cache_* counters, and cached tokens skipping prefill time."""

from __future__ import annotations

import asyncio
import time

from testkit.sim.engine import EngineConfig, SimEngine, SimRequest
from testkit.sim.metrics import SimMetrics
from testkit.sim.model import IMAGE_TOKENS
from testkit.sim.prefix_cache import BLOCK_TOKENS, PrefixCache, block_hashes
from testkit.sim.serve.chat import chat_prompt
from testkit.virtual_time import on_virtual_clock

FAST = 0.01


def make(**kwargs: object) -> SimEngine:
    config = EngineConfig(time_factor=FAST, **kwargs)  # type: ignore[arg-type]
    return SimEngine(config, SimMetrics.create("m", 2048))


def request(ids: list[int], image_ends: tuple[int, ...] = ()) -> SimRequest:
    return SimRequest(priority=0, prompt_tokens=len(ids), images=len(image_ends),
                      target_tokens=2, finish_reason="length", arrival=time.monotonic(),
                      token_ids=ids, image_ends=image_ends)  # fmt: skip


async def serve(engine: SimEngine, r: SimRequest) -> None:
    engine.submit(r)
    while await r.tokens.get() is not None:
        pass


def counter(engine: SimEngine, name: str) -> float:
    value = engine.metrics.registry.get_sample_value(name, {"model_name": "m", "engine": "0"})
    return value or 0.0


def test_a_block_hash_covers_its_whole_prefix() -> None:
    block = list(range(BLOCK_TOKENS))
    alone = block_hashes(block)
    after_other = block_hashes([7] * BLOCK_TOKENS + block)
    assert len(alone) == 1 and len(after_other) == 2
    assert alone[0] != after_other[1]  # same tokens, different parent: a different block
    assert block_hashes([*block, 1, 2, 3]) == alone  # only full blocks are hashed


async def test_a_repeated_prefix_hits_in_whole_blocks_and_counts_tokens() -> None:
    engine = make()
    engine.start()
    shared = list(range(100))
    await serve(engine, request([*shared, 1000, 1001]))
    steps_before = engine.steps
    prefilled_before = counter(engine, "vllm:prompt_tokens_total")
    await serve(engine, request(shared + [2000] * 20))
    # 100 shared tokens are 6 full blocks: 96 cached; the other 24 are prefilled.
    assert counter(engine, "vllm:prefix_cache_queries_total") == 102 + 120
    assert counter(engine, "vllm:prefix_cache_hits_total") == 96
    assert counter(engine, "vllm:prompt_tokens_total") - prefilled_before == 24
    assert engine.steps - steps_before == 2
    await engine.stop()


async def test_a_different_first_block_hits_nothing() -> None:
    engine = make()
    engine.start()
    await serve(engine, request(list(range(64))))
    await serve(engine, request([999, *list(range(1, 64))]))
    assert counter(engine, "vllm:prefix_cache_hits_total") == 0
    await engine.stop()


async def test_the_last_token_is_always_computed() -> None:
    engine = make()
    engine.start()
    ids = list(range(64))
    await serve(engine, request(ids))
    await serve(engine, request(ids))
    assert counter(engine, "vllm:prefix_cache_hits_total") == 48  # 63 tokens: 3 whole blocks
    await engine.stop()


async def test_an_empty_prompt_is_served() -> None:
    engine = make()
    engine.start()
    await serve(engine, request([]))
    await serve(engine, request([]))
    assert counter(engine, "vllm:prefix_cache_hits_total") == 0
    await engine.stop()


@on_virtual_clock  # TTFTs timed exactly: no busy machine stretches the warm one
async def test_cached_tokens_make_the_step_shorter() -> None:
    clock = asyncio.get_running_loop().time
    engine = SimEngine(EngineConfig(time_factor=1.0), SimMetrics.create("m", 2048), clock=clock)
    engine.start()
    prompt = list(range(2000))

    async def ttft() -> float:
        r = request(prompt)
        r.arrival = clock()
        await serve(engine, r)
        assert r.first_token_at is not None
        return r.first_token_at - r.arrival

    cold, warm = await ttft(), await ttft()
    # Cold: one step with 2000 prefill tokens (0.0175 + 0.2 s); warm: 16 tokens (0.019 s).
    assert cold > 0.2
    assert warm < 0.1
    await engine.stop()


async def test_disabled_caching_never_hits_and_counts_nothing() -> None:
    engine = make(enable_prefix_caching=False)
    engine.start()
    ids = list(range(64))
    await serve(engine, request(ids))
    await serve(engine, request(ids))
    assert counter(engine, "vllm:prefix_cache_queries_total") == 0
    assert counter(engine, "vllm:prefix_cache_hits_total") == 0
    assert counter(engine, "vllm:prompt_tokens_total") == 128
    await engine.stop()


def test_eviction_drops_the_least_recently_used_unreferenced_blocks() -> None:
    cache = PrefixCache()
    old, new = block_hashes(list(range(32))), block_hashes(list(range(100, 132)))
    cache.hold(old)
    cache.hold(new)
    cache.release(old)
    cache.release(new)
    assert cache.cached_tokens(old, 100) == 32
    cache.hold(old[:1])  # a hit makes `old`'s first block the most recently used
    cache.release(old[:1])
    cache.evict_to(3)
    assert cache.cached_tokens(old, 100) == 16  # its tail block went first
    cache.evict_to(0)
    assert cache.cached_tokens(new, 100) == 0


def test_referenced_blocks_are_never_evicted() -> None:
    cache = PrefixCache()
    held = block_hashes(list(range(48)))
    cache.hold(held)
    cache.evict_to(0)
    assert cache.cached_tokens(held, 100) == 48


async def test_the_kv_budget_evicts_cached_blocks() -> None:
    engine = make(kv_cache_tokens=256)
    engine.start()
    first = list(range(128))
    await serve(engine, request(first))
    # 16 blocks in all; 202 tokens running leave room for 3 of `first`'s 8 cached blocks,
    # and its tail blocks are evicted first, so its first 3 blocks (48 tokens) still hit.
    await serve(engine, request(list(range(1000, 1200))))
    await serve(engine, request(first))
    assert counter(engine, "vllm:prefix_cache_hits_total") == 48
    await engine.stop()


async def test_a_cached_image_skips_the_vision_encoder() -> None:
    engine = make()
    engine.start()
    ids = list(range(300))
    await serve(engine, request(ids, image_ends=(260,)))
    again = request(ids + [5] * 16, image_ends=(260,))
    engine.submit(again)
    assert again.images_to_encode == 1  # counted before admission
    while await again.tokens.get() is not None:
        pass
    assert again.images_to_encode == 0
    await engine.stop()


def test_chat_prompts_share_ids_up_to_the_first_difference() -> None:
    def prompt(screenshot: str, question: str) -> list[int]:
        return chat_prompt({"messages": [
            {"role": "system", "content": "You are a phone agent."},
            {"role": "user", "content": [
                {"type": "text", "text": question},
                {"type": "image_url", "image_url": {"url": screenshot}}]}]}).token_ids
    a = prompt("https://x/1.png", "open settings")
    b = prompt("https://x/2.png", "open settings")
    c = prompt("https://x/1.png", "open settings")
    assert a == c
    common = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
    # Only the screenshot's placeholder tokens differ (its <|begin_of_image|> is common; a remote
    # URL's size is unknown, so it counts IMAGE_TOKENS), and its <|end_of_image|> follows them.
    assert common == len(a) - IMAGE_TOKENS - 1
    system_only = chat_prompt({"messages": [{"role": "user", "content": "hi"}]}).token_ids
    assert system_only[:4] != a[:4]  # the role tag is part of the ids


def test_the_sim_flag_is_vllms() -> None:
    from testkit.sim.__main__ import _parser

    parser = _parser()
    assert parser.parse_args([]).enable_prefix_caching is True
    assert parser.parse_args(["--no-enable-prefix-caching"]).enable_prefix_caching is False
