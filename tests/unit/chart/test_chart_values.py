"""Bad values fail at install with a message that names the value; the chart's CRD copy is current;
the `helm test` script passes and fails when it should, run for real against a local server."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml
from chartkit import CHART, CHART_CRD, CRD_SOURCE, REPO, one, render, render_error

# (values, text the error must contain)
BAD_VALUES: list[tuple[dict[str, Any], str]] = [
    (
        {"operator.scope": "Clusterwide"},
        "at '/operator/scope': value must be one of 'Cluster', 'Namespace'",
    ),
    ({"operator.replicas": -1}, "at '/operator/replicas'"),
    ({"operator.replicas": 6}, "at '/operator/replicas'"),
    ({"operator.replicas": "2"}, "at '/operator/replicas': got string, want integer"),
    ({"operator.logLevel": "trace"}, "at '/operator/logLevel'"),
    ({"operator.healthPort": 70000}, "at '/operator/healthPort'"),
    ({"operator.watchNamespaces": ["Bad_NS"]}, "at '/operator/watchNamespaces/0'"),
    ({"operatr": {"replicas": 2}}, "additional properties 'operatr' not allowed"),
    ({"image.pullPolicy": "Sometimes"}, "at '/image/pullPolicy'"),
    ({"image.digest": "latest"}, "at '/image/digest'"),
    (
        {"monitoring.podMonitor.interval": 15},
        "at '/monitoring/podMonitor/interval': got number, want string",
    ),
    (
        {"monitoring.prometheusRule.flappingWindow": "half an hour"},
        "at '/monitoring/prometheusRule/flappingWindow'",
    ),
    (
        {"monitoring.prometheusRule.maxModeSwitches": 0},
        "at '/monitoring/prometheusRule/maxModeSwitches'",
    ),
    ({"deployment.name": "Phone_9B"}, "at '/deployment/name'"),
    ({"deployment.spec": "replicas: 2"}, "at '/deployment/spec': got string, want object"),
    ({"tests.endpoint": "http://phone:8000"}, "at '/tests/endpoint'"),
    # Rules across values: the template says what to change.
    (
        {"operator.watchNamespaces": ["a"]},
        "operator.watchNamespaces only applies with operator.scope=Namespace",
    ),
    ({"operator.metricsPort": 8080}, "operator.healthPort and operator.metricsPort must differ"),
    (
        {"serviceAccount.create": False},
        "serviceAccount.name is required when serviceAccount.create is false",
    ),
    (
        {"monitoring.podMonitor.enabled": True, "monitoring.podMonitor.scrapeTimeout": "1m"},
        "monitoring.podMonitor.scrapeTimeout (1m) must not exceed its interval (15s)",
    ),
    (
        {
            "deployment.create": True,
            "operator.scope": "Namespace",
            "operator.watchNamespaces": ["other"],
        },
        "which the operator does not watch: add it to operator.watchNamespaces",
    ),
]


@pytest.mark.parametrize(("values", "message"), BAD_VALUES, ids=[m[:40] for _, m in BAD_VALUES])
def test_bad_values_are_refused_with_a_clear_message(values: dict[str, Any], message: str) -> None:
    assert message in render_error(values)


def test_values_yaml_documents_every_key_the_schema_knows() -> None:
    """A schema key missing from values.yaml is a knob nobody can find; the reverse is caught by
    additionalProperties: false (helm refuses to install)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], value: Any, path: str) -> None:
        for key, sub in node.get("properties", {}).items():
            if key == "global":
                continue
            assert isinstance(value, dict) and key in value, f"values.yaml lacks {path}{key}"
            # Our own settings only; Kubernetes types (resources) pass through unlisted keys.
            if sub.get("additionalProperties") is False and "properties" in sub:
                walk(sub, value[key], f"{path}{key}.")

    walk(schema, values, "")


def test_chart_crd_is_the_generated_crd() -> None:
    assert CHART_CRD.read_bytes() == CRD_SOURCE.read_bytes(), (
        "charts/autoglm/crds/ differs from crds/: run hack/sync-chart-crd.sh"
    )
    check = subprocess.run(
        ["bash", str(REPO / "hack" / "sync-chart-crd.sh"), "--check"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr


# -- the `helm test` script, run with the same sh and curl semantics as in the hook pod ----------


class _Models(BaseHTTPRequestHandler):
    responses: list[tuple[int, str]] = []
    seen_auth: list[str | None] = []

    def do_GET(self) -> None:
        type(self).seen_auth.append(self.headers.get("Authorization"))
        status, body = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if self.path != "/v1/models":
            status, body = 404, "{}"
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        return


@pytest.fixture
def models_server() -> Iterator[tuple[str, type[_Models]]]:
    handler = type("Handler", (_Models,), {"responses": [], "seen_auth": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", handler
    server.shutdown()
    server.server_close()


def _models_body(*ids: str) -> str:
    return json.dumps(
        {"object": "list", "data": [{"id": i, "object": "model", "owned_by": "vllm"} for i in ids]}
    )


def _run_hook(
    endpoint: str, model: str, timeout: int = 20, api_key: str | None = None
) -> subprocess.CompletedProcess[str]:
    values: dict[str, Any] = {
        "tests.endpoint": endpoint,
        "tests.expectModel": model,
        "tests.timeoutSeconds": timeout,
    }
    pod = one(render(values), "Pod")
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env["RETRY_SECONDS"] = "1"
    env["PATH"] = "/usr/bin:/bin"
    if api_key:
        env["API_KEY"] = api_key
    assert container["command"] == ["/bin/sh", "-c"]
    return subprocess.run(
        [*container["command"], *container["args"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_hook_passes_when_the_model_is_listed(models_server: tuple[str, type[_Models]]) -> None:
    url, handler = models_server
    handler.responses[:] = [(200, _models_body("other", "autoglm-phone-9b"))]
    out = _run_hook(url, "autoglm-phone-9b", api_key="sk-test")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS: model autoglm-phone-9b is served" in out.stdout
    assert handler.seen_auth == ["Bearer sk-test"]


def test_hook_fails_when_only_a_similar_model_is_listed(
    models_server: tuple[str, type[_Models]],
) -> None:
    url, handler = models_server
    handler.responses[:] = [(200, _models_body("autoglm-phone-9b-int4"))]
    out = _run_hook(url, "autoglm-phone-9b")
    assert out.returncode == 1
    assert "FAIL: model autoglm-phone-9b not in /v1/models ids: autoglm-phone-9b-int4" in out.stdout


def test_hook_waits_for_a_loading_model(models_server: tuple[str, type[_Models]]) -> None:
    url, handler = models_server
    handler.responses[:] = [(503, "{}"), (503, "{}"), (200, _models_body("autoglm-phone-9b"))]
    out = _run_hook(url, "autoglm-phone-9b")
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(handler.seen_auth) == 3


def test_hook_gives_up_after_its_timeout(models_server: tuple[str, type[_Models]]) -> None:
    url, handler = models_server
    handler.responses[:] = [(500, "{}")]
    out = _run_hook(url, "autoglm-phone-9b", timeout=10)
    assert out.returncode == 1
    assert "did not answer within 10s" in out.stdout
