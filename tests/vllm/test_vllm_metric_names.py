"""Every vllm:* series the project queries or exports is one the installed vLLM registers, with
the labels the queries use.

vLLM registers its engine metrics when the engine starts, which a CPU cannot do; the families
here come from vLLM's own stat logger (vllm/v1/metrics/loggers.py), constructed as the engine's
API-server process constructs it (see vllm_kit.register_engine_metrics).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY
from vllm_kit import register_engine_metrics

from autoglm_operator.io import prom
from autoglm_operator.resource.spec import AutoGLMDeploymentSpec, QueryOverrides
from testkit.sim.metrics import SimMetrics

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "autoglm"
SERIES_SUFFIXES = {"counter": ("_total", "_created"),
                   "histogram": ("_bucket", "_sum", "_count", "_created"), "gauge": ("",)}
# Labels Prometheus adds to every scraped series (its own, and the Prometheus Operator's
# PodMonitor defaults); the chart's relabelings add more, read from its templates below.
SCRAPE_LABELS = {"job", "instance", "namespace", "pod", "container", "endpoint"}
METRIC = re.compile(r"(?<![\w/-])(vllm:[A-Za-z0-9_:]+)(\{[^{}]*\})?")
MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


@dataclass(frozen=True)
class Family:
    name: str
    type: str
    labels: frozenset[str]
    buckets: tuple[float, ...]

    def series(self) -> set[str]:
        return {self.name + suffix for suffix in SERIES_SUFFIXES[self.type]}


def families(collectors: Any) -> dict[str, Family]:
    found = {}
    for collector in collectors:
        name = getattr(collector, "_name", "")
        if name.startswith("vllm:"):
            buckets = tuple(getattr(collector, "_upper_bounds", ()))
            found[name] = Family(name, collector._type, frozenset(collector._labelnames), buckets)
    return found


@pytest.fixture(scope="module")
def vllm_families() -> dict[str, Family]:
    spec = AutoGLMDeploymentSpec()
    register_engine_metrics(spec.model.served_name, spec.max_model_len)
    found = families(list(REGISTRY._collector_to_names))
    assert len(found) > 20, "vLLM's stat logger registered almost nothing: the check is void"
    return found


def scrape_labels() -> set[str]:
    relabels = ""
    for name in ("prometheus-config.yaml", "podmonitor.yaml"):
        relabels += (CHART / "templates" / name).read_text()
    added = set(re.findall(r"target_?[lL]abel:\s*([A-Za-z_]\w*)", relabels))
    assert "autoglm_deployment" in added
    return SCRAPE_LABELS | added


def dashboard_queries() -> Iterator[str]:
    def walk(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query", "definition") and isinstance(value, str):
                    yield value
                else:
                    yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    yield from walk(json.loads((CHART / "files" / "dashboard.json").read_text()))


def alert_queries() -> Iterator[str]:
    yield (CHART / "templates" / "_alerts.tpl").read_text()
    for path in sorted((CHART / "files").glob("*.yaml")):
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
            yield from (rule["expr"] for rule in group.get("rules", []) if "expr" in rule)


def operator_queries() -> Iterator[str]:
    templates = [*prom.DEFAULT_QUERIES.values(), prom.COVERAGE_QUERY, prom.COVERAGE_RANGE_QUERY]
    overrides = QueryOverrides().model_dump()
    templates += [value for value in overrides.values() if value]  # spec defaults, if any
    for template in templates:
        yield prom.render(template, "ns", ["agd-0", "agd-1"], "agd")


QUERIES = {"operator": operator_queries, "dashboard": dashboard_queries,
           "alerts": alert_queries}


def uses(query: str) -> list[tuple[str, set[str]]]:
    """(series, label names matched on it) for each vllm:* series in a PromQL expression."""
    return [(name, set(MATCHER.findall(matchers or ""))) for name, matchers in
            METRIC.findall(query)]


def series_owner(families: dict[str, Family], series: str) -> Family | None:
    return next((f for f in families.values() if series in f.series()), None)


@pytest.mark.parametrize("source", list(QUERIES))
def test_every_queried_series_exists_with_its_labels(
    vllm_families: dict[str, Family], source: str
) -> None:
    scraped = scrape_labels()
    checked = 0
    for query in QUERIES[source]():
        used = uses(query)
        owners = {series: series_owner(vllm_families, series) for series, _ in used}
        missing = sorted(series for series, owner in owners.items() if owner is None)
        assert not missing, f"not series of vLLM: {missing} in {query!r}"
        for series, matched in used:
            family = owners[series]
            assert family is not None
            allowed = scraped | family.labels | ({"le"} if series.endswith("_bucket") else set())
            assert matched <= allowed, f"{series} has no label {matched - allowed}: {query!r}"
        if used and source != "alerts":  # alert templates mix in Go templating; matchers only
            grouped = {label.strip() for group in GROUPING.findall(query)
                       for label in group.split(",") if label.strip()}
            allowed = scraped | {"le"} | set().union(*(f.labels for f in owners.values() if f))
            assert grouped <= allowed, f"grouping by {grouped - allowed}: {query!r}"
        checked += len(used)
    if source != "alerts":
        assert checked, f"no vllm:* query found in {source}: the check is void"


# Names other projects export under vLLM's prefix, cited as theirs: the vLLM production-stack
# router's request counter (bench/scale_to_zero.py models its KEDA recipe).
OTHER_PROJECTS = {"vllm:num_incoming_requests_total"}


def test_every_name_the_docs_and_code_mention_exists(vllm_families: dict[str, Family]) -> None:
    known = {name for f in vllm_families.values() for name in f.series() | {f.name}}
    known |= OTHER_PROJECTS
    mentioned: dict[str, set[str]] = {}
    for folder in ("operator", "runtime", "router", "charts", "hack", "bench", "examples", "docs"):
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and path.suffix in {".py", ".json", ".yaml", ".tpl", ".md", ".txt"}:
                for name, _ in METRIC.findall(path.read_text(errors="replace")):
                    mentioned.setdefault(name.rstrip(":"), set()).add(str(path.relative_to(REPO)))
    for name, _ in METRIC.findall((REPO / "README.md").read_text()):
        mentioned.setdefault(name.rstrip(":"), set()).add("README.md")
    unknown = {name: sorted(paths) for name, paths in mentioned.items() if name not in known}
    assert not unknown, f"the installed vLLM registers none of these: {unknown}"
    assert len(mentioned) > 5


def test_the_sims_families_are_vllms(vllm_families: dict[str, Family]) -> None:
    spec = AutoGLMDeploymentSpec()
    sim = SimMetrics.create(spec.model.served_name, spec.max_model_len)
    exported = families(list(sim.registry._collector_to_names))
    assert len(exported) >= 15
    for name, family in exported.items():
        assert name in vllm_families, f"the sim exports {name}, which vLLM does not"
        assert family == vllm_families[name], f"{name}: sim {family} != vLLM {vllm_families[name]}"
