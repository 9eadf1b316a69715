"""Reading a server's state from outside, as the loopback tests do: a /metrics sample (wait for
one with testkit.waiting.eventually)."""

from __future__ import annotations

import re

import httpx


def metric(base_url: str, name: str, **labels: str) -> float:
    """One sample's value from a /metrics page, summed over the labels not given (0 when
    absent)."""
    text = httpx.get(base_url + "/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total

