"""A consistent-hash ring with virtual nodes (pure; cached per member set)."""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterator
from functools import lru_cache


def ring_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Each member sits at `virtual_nodes` points, so removing one moves only its own keys."""

    def __init__(self, members: tuple[str, ...], virtual_nodes: int) -> None:
        points = sorted(
            (ring_hash(f"{member}#{i}"), member)
            for member in members
            for i in range(virtual_nodes)
        )
        self._hashes = [h for h, _ in points]
        self._members = [m for _, m in points]
        self.size = len(set(members))

    def walk(self, key: str) -> Iterator[str]:
        """Distinct members clockwise from the key's point: its home first."""
        if not self._hashes:
            return
        start = bisect.bisect_left(self._hashes, ring_hash(key))
        seen: set[str] = set()
        count = len(self._hashes)
        for step in range(count):
            member = self._members[(start + step) % count]
            if member not in seen:
                seen.add(member)
                yield member
                if len(seen) == self.size:
                    return


@lru_cache(maxsize=256)
def ring_of(members: frozenset[str], virtual_nodes: int) -> HashRing:
    return HashRing(tuple(sorted(members)), virtual_nodes)
