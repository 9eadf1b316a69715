"""vLLM's automatic prefix caching, as the sim models it.

A prompt is cut into 16-token blocks; each full block's hash covers its parent's hash and its
own token ids (vLLM's `hash_block_tokens`), so a block only hits after the same whole prefix.
Blocks held by running sequences are referenced; when a sequence finishes its blocks stay
cached, unreferenced, and are evicted least recently used first when the KV budget needs room
(vLLM's free-block queue; a sequence's tail blocks are freed first, so they go first).
As in vLLM, a hit never covers the whole prompt: the last token is always computed, so the
engine has logits to sample from.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

BLOCK_TOKENS = 16
_ROOT = b"\0" * 16  # vLLM's NONE_HASH: the parent of the first block
_ID_MASK = 2**64 - 1  # /v1/completions accepts any integer as a token id


def blocks_for(tokens: int) -> int:
    """KV blocks `tokens` take (a partly filled last block counts whole)."""
    return -(-tokens // BLOCK_TOKENS)


def block_hashes(token_ids: Sequence[int]) -> list[bytes]:
    """The chained hash of every full block of `token_ids`."""
    hashes: list[bytes] = []
    parent = _ROOT
    for start in range(0, len(token_ids) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        block = token_ids[start : start + BLOCK_TOKENS]
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update(b"".join((t & _ID_MASK).to_bytes(8, "little") for t in block))
        parent = digest.digest()
        hashes.append(parent)
    return hashes


class PrefixCache:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._refs: dict[bytes, int] = {}  # blocks running sequences hold
        self._free: OrderedDict[bytes, None] = OrderedDict()  # cached, unreferenced; LRU first

    @property
    def evictable_blocks(self) -> int:
        return len(self._free)

    def cached_tokens(self, hashes: Sequence[bytes], prompt_total: int) -> int:
        """How many leading tokens of a prompt of `prompt_total` tokens are cached."""
        if not self.enabled:
            return 0
        hits = 0
        for block in hashes:
            if block not in self._refs and block not in self._free:
                break
            hits += 1
        return min(hits, max(0, prompt_total - 1) // BLOCK_TOKENS) * BLOCK_TOKENS

    def admit(self, hashes: Sequence[bytes], prompt_total: int) -> tuple[list[bytes], int]:
        """A sequence is scheduled: it holds its cached leading blocks. Returns them and the
        prompt tokens they cover, which it does not prefill again."""
        cached = self.cached_tokens(hashes, prompt_total)
        held = list(hashes[: cached // BLOCK_TOKENS])
        self.hold(held)
        return held, cached

    def fill(self, hashes: Sequence[bytes], held: Sequence[bytes]) -> list[bytes]:
        """Its prefill is done: the rest of its full prompt blocks are cached and held too.
        Returns every block it holds."""
        computed = hashes[len(held) :]
        self.hold(computed)
        return [*held, *computed]

    def hold(self, hashes: Sequence[bytes]) -> None:
        """A running sequence uses these blocks (cache hits, or blocks it just computed)."""
        if not self.enabled:
            return
        for block in hashes:
            self._free.pop(block, None)
            self._refs[block] = self._refs.get(block, 0) + 1

    def release(self, hashes: Sequence[bytes]) -> None:
        """The sequence finished or was preempted: its blocks stay cached until evicted."""
        for block in reversed(hashes):
            count = self._refs.get(block, 0) - 1
            if count > 0:
                self._refs[block] = count
            elif count == 0:
                del self._refs[block]
                self._free[block] = None

    def evict_to(self, room_blocks: int) -> None:
        """Drop least recently used unreferenced blocks until at most `room_blocks` remain."""
        while len(self._free) > max(0, room_blocks):
            self._free.popitem(last=False)
