"""Percentiles of a sample, as the tests, benchmarks and demo report them.

Two rules are in use and both are kept, so that no published figure moves: `percentile` (the
value at index floor(q * n) of the sorted sample: the load generator's reports, the demo, the
reaction and router-overhead benchmarks) and `nearest_rank` (the ceil(q * n)-th smallest: the
policy and scale benchmarks). They differ only where q * n is a whole number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float | None:
    """The sorted sample's value at index floor(q * n) (q in 0..1); None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def nearest_rank(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile: the ceil(q * n)-th smallest (q in 0..1); None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
