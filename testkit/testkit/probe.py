"""Reading a server's state from outside, as the loopback tests do: a /metrics sample (wait for
one with testkit.waiting.eventually)."""

from __future__ import annotations

import re

import httpx


class NoSample(AssertionError):
    """The page has no sample of that name with those labels: the metric was renamed, or it was
    never recorded (a labelled counter's sample appears with its first count)."""


def metric(base_url: str, name: str, **labels: str) -> float:
    """One sample's value from a /metrics page, summed over the labels not given. NoSample when
    none matches: a renamed metric must fail `== 0`, not pass it as an absent one read as 0."""
    text = httpx.get(base_url + "/metrics", timeout=5).text
    values = []
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            values.append(float(line.rsplit(" ", 1)[1]))
    if not values:
        wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
        raise NoSample(f"no sample {name}{{{wanted}}} on {base_url}/metrics")
    return sum(values)
