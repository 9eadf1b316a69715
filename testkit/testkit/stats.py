"""Percentiles of a sample, as the tests, benchmarks and demo report them: one rule, nearest
rank (the ceil(q * n)-th smallest value), which the benchmarks' reports name.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile: the ceil(q * n)-th smallest (q in 0..1); None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
