"""Pure arithmetic of bench/operator_scale.py: percentiles, per-minute counts, trends, and who
a Prometheus query or an API request was for. No I/O, so tests check it in milliseconds."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from testkit.stats import percentile


def summary(values: Sequence[float]) -> dict[str, float | int | None]:
    """Count, p50, p90, p99 and max of a sample."""
    return {
        "n": len(values),
        "p50": percentile(values, 0.50),
        "p90": percentile(values, 0.90),
        "p99": percentile(values, 0.99),
        "max": max(values) if values else None,
    }


def per_interval(times: Iterable[float], start: float, width: float, count: int) -> list[int]:
    """How many of `times` fall in each of `count` consecutive [start + i*width, +width)."""
    buckets = [0] * count
    for t in times:
        index = math.floor((t - start) / width)
        if 0 <= index < count:
            buckets[index] += 1
    return buckets


def slope(values: Sequence[float]) -> float:
    """Least-squares slope of values against their index (growth per step); 0 for < 2 values."""
    n = len(values)
    if n < 2:
        return 0.0
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    num = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    den = sum((i - mean_x) ** 2 for i in range(n))
    return num / den


def flat(counts: Sequence[float], relative: float = 0.05, absolute: float = 1.0) -> bool:
    """No growth with time: the trend is at most max(absolute, relative x mean) per step."""
    if not counts:
        return False
    return slope(counts) <= max(absolute, relative * (sum(counts) / len(counts)))


# -- API requests the operator sent (rows of testkit.operator_kit's counting wrapper) --

_WATCH = re.compile(r"""watch['"]?\s*[:=]\s*['"]?(true|1)""", re.IGNORECASE)


def is_watch(url: str) -> bool:
    return bool(_WATCH.search(url))


def resource_of(url: str) -> str:
    """`pods`, `autoglmdeployments/status`, ... from an API URL (kopf's `url?{params}` too)."""
    parts = [p for p in urlparse(url.split("?", 1)[0]).path.split("/") if p]
    if parts[:1] == ["api"]:
        parts = parts[2:]  # api, v1
    elif parts[:1] == ["apis"]:
        parts = parts[3:]  # apis, group, version
    if len(parts) >= 2 and parts[0] == "namespaces":
        parts = parts[2:]
    if not parts:
        return "namespaces" if "namespaces" in url else "?"
    return "/".join([parts[0], *parts[2:3]])  # plural, then a subresource after the name


def request_kind(row: Mapping[str, Any]) -> str:
    """`GET pods`, `PATCH autoglmdeployments/status`, `WATCH pods`: one API request's kind."""
    url = str(row["url"])
    verb = "WATCH" if is_watch(url) else str(row["method"]).upper()
    return f"{verb} {resource_of(url)}"


# -- Prometheus queries (lines of its query_log_file) ------------------------------------------

_NAMESPACE = re.compile(r'(?<![a-z_])namespace="([^"]*)"')
_PODS = re.compile(r'(?<![a-z_])pod=~"([^"]*)"')


def owner_of_pod(pod: str) -> str:
    """The Deployment, hence AutoGLMDeployment, a ReplicaSet pod `<name>-<hash>-<id>` is of."""
    return pod.rsplit("-", 2)[0]


@dataclass(frozen=True)
class LoggedQuery:
    namespace: str | None
    pods: tuple[str, ...]

    @property
    def owner(self) -> tuple[str, str] | None:
        owners = {owner_of_pod(p) for p in self.pods}
        if self.namespace is None or len(owners) != 1:
            return None
        return self.namespace, owners.pop()


def parse_query_log(lines: Iterable[str]) -> list[LoggedQuery]:
    """Prometheus query-log lines -> the namespace and pods each query was scoped to."""
    queries = []
    for line in lines:
        if not line.strip():
            continue
        promql = str((json.loads(line).get("params") or {}).get("query") or "")
        namespace = _NAMESPACE.search(promql)
        # Lists of pod names; a pattern (the router pods' `[a-z0-9]+`) names no pod.
        names = tuple(sorted({
            name
            for pods in _PODS.findall(promql)
            for name in pods.replace("\\", "").split("|")
            if "[" not in name
        }))  # fmt: skip
        queries.append(LoggedQuery(namespace.group(1) if namespace else None, names))
    return queries


def queries_per_round(
    queries: Sequence[LoggedQuery],
    rounds: Mapping[tuple[str, str], float],
    replicas: Mapping[tuple[str, str], int],
) -> dict[int, dict[str, float]]:
    """By replica count: Prometheus queries per adaptive round and pods named per query.

    `rounds` counts each deployment's adaptive passes in the same window as `queries`.
    """
    per_owner: Counter[tuple[str, str]] = Counter()
    pods_named: dict[int, list[int]] = {}
    for query in queries:
        owner = query.owner
        if owner is None or owner not in replicas:
            continue
        per_owner[owner] += 1
        pods_named.setdefault(replicas[owner], []).append(len(query.pods))
    result: dict[int, dict[str, float]] = {}
    for size in sorted(set(replicas.values())):
        owners = [o for o, r in replicas.items() if r == size]
        total_rounds = sum(rounds.get(o, 0.0) for o in owners)
        total_queries = sum(per_owner[o] for o in owners)
        named = pods_named.get(size, [])
        result[size] = {
            "deployments": len(owners),
            "rounds": total_rounds,
            "queries": total_queries,
            "queries_per_round": total_queries / total_rounds if total_rounds else math.nan,
            "pods_per_query": sum(named) / len(named) if named else math.nan,
        }
    return result
