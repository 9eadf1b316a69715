"""vLLM's own `build_app` with the operator's `--middleware`: where the middleware sits, the
admin API inside vLLM's server, and one /metrics with both vllm:* and autoglm_*."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from vllm_kit import Serve, register_engine_metrics

from autoglm_operator.resource import spec as crd
from autoglm_runtime.middleware import ModeMiddleware
from autoglm_runtime.profiles import DRAIN_PATH, MODE_PATH, Mode

CHAT = "/v1/chat/completions"


def chat_body() -> dict[str, object]:
    return {"model": "autoglm-phone-9b", "messages": [{"role": "user", "content": "hi"}]}


async def test_the_middleware_is_the_outermost_layer(serve: Serve) -> None:
    served = serve()
    assert isinstance(served.middleware, ModeMiddleware)
    assert served.app.user_middleware[0].cls is ModeMiddleware
    # vLLM's own layers are all inside it.
    inner = [m.cls.__name__ for m in served.app.user_middleware[1:]]
    assert "CORSMiddleware" in inner and "ModeMiddleware" not in inner


async def test_the_admin_api_answers_inside_vllm(serve: Serve) -> None:
    spec = crd.AutoGLMDeploymentSpec.model_validate(
        {"apiKeySecretRef": {"name": "autoglm-api-key", "key": "key"}}
    )
    served = serve(spec, api_key="client-key")
    client = served.client
    assert (await client.get(MODE_PATH)).status_code == 401
    state = await client.get(MODE_PATH, headers=served.admin)
    assert state.status_code == 200 and state.json()["mode"] == "streaming"
    # vLLM's --api-key guards /v1 only; the admin token, not the client key, opens the admin API.
    flipped = await client.put(MODE_PATH, json={"mode": "batching"}, headers=served.admin)
    assert flipped.status_code == 200 and flipped.json()["mode"] == "batching"
    assert served.middleware.mode is Mode.BATCHING
    assert flipped.json()["profile"]["maxConcurrency"] == 64
    drained = await client.post(DRAIN_PATH, headers=served.admin)
    assert drained.status_code == 202 and drained.json()["draining"] is True
    refused = await client.post(CHAT, json=chat_body(),
                                headers={"authorization": "Bearer client-key"})
    assert refused.status_code == 503 and served.serving.seen == []


async def test_the_mode_the_operator_labels_the_pod_with_is_the_start_mode(serve: Serve) -> None:
    served = serve(mode=Mode.BATCHING)
    state = await served.client.get(MODE_PATH, headers=served.admin)
    assert state.json()["mode"] == "batching"


async def test_metrics_show_autoglm_beside_vllms_own(serve: Serve) -> None:
    spec = crd.AutoGLMDeploymentSpec()
    served = serve(spec)
    register_engine_metrics(spec.model.served_name, spec.max_model_len)
    assert (await served.client.post(CHAT, json=chat_body())).status_code == 200
    response = await served.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    runtime = {"autoglm_mode", "autoglm_requests_admitted", "autoglm_requests_rejected",
               "autoglm_requests_queued", "autoglm_requests_inflight", "autoglm_queue_wait_seconds"}
    engine = {"vllm:num_requests_waiting", "vllm:num_requests_running",
              "vllm:kv_cache_usage_perc", "vllm:request_success",
              "vllm:time_to_first_token_seconds"}
    assert runtime | engine <= set(families), sorted(runtime | engine - set(families))
    modes = {s.labels["mode"]: s.value for s in families["autoglm_mode"].samples}
    assert modes == {"streaming": 1.0, "batching": 0.0}
    waiting = families["vllm:num_requests_waiting"].samples
    assert {s.labels["model_name"] for s in waiting} == {spec.model.served_name}
    # vLLM's API server instruments its own routes in the same registry.
    assert "http_requests" in families
